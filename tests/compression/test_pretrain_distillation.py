"""Pre-training distillation (DistilBERT) through main.py: a tiny masked-LM teacher trained here, a student from
every other teacher layer that learns α_ce·KD + α_mlm·MLM + α_cos·cosine, resumes exactly, exports and reloads."""
import csv

import pytest
import torch
import yaml

from tests.conftest import TINY_BERT, assert_resumes_exactly, run_main, tiny_mlm_config

pytestmark = pytest.mark.usefixtures("one_thread")
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


@pytest.fixture(scope="module")
def mlm_teacher(tiny_corpus, tmp_path_factory):
    """A 4-layer tiny BERT (no dropout) trained 4 MLM steps on the fixture corpus: its run directory."""
    tmp = tmp_path_factory.mktemp("mlm_teacher")
    cfg = yaml.safe_load(tiny_mlm_config(tiny_corpus, tmp).read_text())
    cfg["trainer"].update(max_steps=4, val_check_interval=4, limit_val_batches=1)
    cfg["model"]["init_args"]["backbone_config"] = {**TINY_BERT, "num_hidden_layers": 4, **NO_DROPOUT}
    path = tmp / "mlm_teacher.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert run_main(["fit", "--config", str(path)], tmp / "runs") == 0
    return tmp / "runs" / "mlm_teacher", cfg["data"]


def config(tmp_path, teacher, data: dict, model: dict, steps: int = 4):
    cfg = {"seed_everything": 5,
           "trainer": {"max_steps": steps, "val_check_interval": 2, "limit_val_batches": 1, "num_sanity_val_steps": 0,
                       "accelerator": "cpu", "enable_progress_bar": False, "enable_model_summary": False,
                       "log_every_n_steps": 1},
           "model": {"class_path": "PretrainDistillationModule",
                     "init_args": {"teacher": str(teacher), "optim": {"lr": 1e-3}, **model}},
           "data": data}
    path = tmp_path / "distill.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def rows(run):
    return list(csv.DictReader(open(run / "logs" / "metrics.csv")))


def test_every_other_layer_student_trains_resumes_exports(mlm_teacher, tmp_path):
    from transformers import AutoModelForMaskedLM

    from ptm_app.compression import PretrainDistillationModule

    teacher, data = mlm_teacher
    path = config(tmp_path, teacher, data, {"student_layers": "every_other"})
    runs = tmp_path / "runs"
    assert_resumes_exactly(["fit", "--config", str(path)], runs, stop=2, steps=4)
    logged = rows(runs / "full")
    steps = [r for r in logged if r.get("train/ce")]
    assert len(steps) == 4
    for r in steps:  # the total is DistilBERT's weighted sum of the three logged terms
        parts = 5.0 * float(r["train/ce"]) + 2.0 * float(r["train/mlm"]) + 1.0 * float(r["train/cosine"])
        assert float(r["train/loss"]) == pytest.approx(parts, rel=1e-4)
        assert float(r["train/ce"]) > 0 and 0 < float(r["train/cosine"]) < 2
    assert len([r for r in logged if r.get("val/teacher_loss")]) == 1 and any(r.get("val/ppl") for r in logged)
    ckpt = torch.load(runs / "full" / "checkpoints" / "last.ckpt", weights_only=True)
    assert not any(k.startswith(("teacher", "frozen")) for k in ckpt["state_dict"])
    assert ckpt["hyper_parameters"]["teacher"] == str(teacher.resolve())
    assert ckpt["hyper_parameters"]["backbone_config"]["num_hidden_layers"] == 2
    module = PretrainDistillationModule.load_from_checkpoint(runs / "full" / "checkpoints" / "last.ckpt").eval()
    export = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(runs / "full"), "--output_dir", str(export)], runs) == 0
    exported = AutoModelForMaskedLM.from_pretrained(export).eval()
    ids = torch.tensor([[2, 10, 11, 4, 3]])
    with torch.no_grad():
        assert torch.allclose(exported(input_ids=ids).logits, module.backbone(input_ids=ids).logits, atol=1e-5)


def test_a_student_equal_to_its_teacher_has_zero_distillation_loss(mlm_teacher, tmp_path):
    """Every teacher layer kept and no dropout: at step 0 the student is the teacher, so the soft-target KL and the
    cosine loss are 0 and its MLM loss is the teacher's."""
    teacher, data = mlm_teacher
    path = config(tmp_path, teacher, data, {"student_layers": [1, 2, 3, 4]}, steps=1)
    assert run_main(["fit", "--config", str(path)], tmp_path / "runs") == 0
    first = rows(tmp_path / "runs" / "distill")[0]
    assert float(first["train/ce"]) == pytest.approx(0.0, abs=1e-5)
    assert float(first["train/cosine"]) == pytest.approx(0.0, abs=1e-5)
    assert float(first["train/mlm"]) > 1.0


@pytest.mark.parametrize("model, tokenizer, message", [
    ({"teacher": "minilm"}, None, "teacher 'minilm' has no trained masked-LM head"),
    ({}, {"train": "wordpiece", "vocab_size": 120, "min_frequency": 1},
     "use different tokenizers (vocabularies of"),
    ({"student_layers": None, "backbone_config": {**TINY_BERT, "hidden_size": 16, "intermediate_size": 32}}, None,
     "the student is 16 wide and the teacher 32"),
])
def test_bad_pretraining_distillation_is_one_line(mlm_teacher, tmp_path, capsys, model, tokenizer, message):
    teacher, data = mlm_teacher
    data = {**data, "init_args": {**data["init_args"], **({"tokenizer": tokenizer} if tokenizer else {})}}
    path = config(tmp_path, teacher, data, model, steps=1)
    assert run_main(["fit", "--config", str(path)], tmp_path / "runs") != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
