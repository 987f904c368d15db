"""Every configs/compress recipe runs from YAML through main.py, resumes exactly and exports.  The teacher is
SUBSTITUTED: instead of the run the config names (MiniLM fine-tuned on BBC by configs/adapt/minilm_full_bbc.yaml, on
brown_pos by configs/adapt/minilm_full_brown_pos.yaml, MiniLM after the MLM of configs/demo/minilm_mlm_bbc.yaml ...:
minutes of training), a tiny 6-layer model of the same kind with the config's tokenizer is trained here for 2 steps
on the config's real data (BBC, brown_pos) under that run name (looked up under the runs directory); everything else
in the config is as shipped, bar step counts and lengths.  A task module's teacher is its ``distill.teacher``."""
import csv
import json
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import TINY_BERT, assert_resumes_exactly, run_main

pytestmark = pytest.mark.usefixtures("one_thread")  # and tests/compression/conftest.py's outside_the_repo
ROOT = Path(__file__).resolve().parents[2]
COMPRESS = sorted(c for c in (ROOT / "configs" / "compress").glob("*.yaml")
                  if not c.stem.startswith(("minilm_prune_", "minilm_qat_", "minilm_report_")))
# minilm_prune_ / minilm_qat_ / minilm_report_: test_pruning.py / test_quantization.py / test_compress_report.py
QUICK = ["--trainer.max_steps", "4", "--trainer.max_epochs", "1", "--trainer.val_check_interval", "4",
         "--trainer.check_val_every_n_epoch", "null", "--trainer.limit_val_batches", "1",
         "--trainer.num_sanity_val_steps", "0", "--trainer.log_every_n_steps", "1", "--trainer.precision", "32-true",
         "--trainer.enable_progress_bar", "false", "--data.init_args.batch_size", "4",
         "--data.init_args.max_length", "32"]


FEW_DOCUMENTS = ["--data.init_args.limit_documents", "64"]
# the student's module -> the substituted teacher's module, its data module and backbone, and the student run's extras
TEACHERS = {
    "PretrainDistillationModule": ("MaskedLMModule", "PretrainDataModule", {**TINY_BERT, "num_hidden_layers": 6},
                                   FEW_DOCUMENTS),
    "CausalDistillationModule": ("CausalLMModule", "PretrainDataModule",  # SmolLM2-135M -> a tiny Llama, 6 layers
                                 {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                                  "num_hidden_layers": 6, "num_attention_heads": 2, "num_key_value_heads": 1,
                                  "max_position_embeddings": 64, "tie_word_embeddings": True}, FEW_DOCUMENTS),
}
CLASSIFIER = ("SequenceClassificationModule", "TaskDataModule", {**TINY_BERT, "num_hidden_layers": 6}, [])
TEACHERS["TokenClassificationModule"] = ("TokenClassificationModule", "TokenTaskDataModule",  # a tagger's: a tagger
                                         {**TINY_BERT, "num_hidden_layers": 6}, [])


def tiny_teacher(runs: Path, name: str, tmp: Path, student: str = "",
                 tokenizer: dict = {"pretrained": "minilm"}, source: str = "bbc") -> Path:
    """A tiny 6-layer model of the teacher's kind for ``student`` (a BERT classifier on BBC by default; a BERT
    masked LM on BBC, a BERT tagger on brown_pos ...) with the config's tokenizer (MiniLM's by default), trained 2
    steps on ``source``, as run ``name``."""
    module, datamodule, backbone, _ = TEACHERS.get(student, CLASSIFIER)
    data = {"source": source, "tokenizer": tokenizer, "max_length": 32, "batch_size": 4}
    if datamodule == "PretrainDataModule":
        data["limit_documents"] = 64
    cfg = {"seed_everything": 1,
           "trainer": {"max_steps": 2, "accelerator": "cpu", "limit_val_batches": 1, "num_sanity_val_steps": 0,
                       "enable_progress_bar": False, "enable_model_summary": False, "logger": False},
           "model": {"class_path": module, "init_args": {"backbone_config": backbone}},
           "data": {"class_path": datamodule, "init_args": data}}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert run_main(["fit", "--config", str(path), "--trainer.max_epochs", "1"], runs) == 0
    return runs / name


def test_catalogue_is_not_empty():
    assert {c.stem for c in COMPRESS} >= {"minilm_distill_3layer_bbc", "minilm_distill_bilstm_bbc", "minilm_distill_cnn_bbc",
                                          "minilm_distill_albert_bbc", "minilm_distill_mlm_bbc", "smollm2_distill_llama_bbc", "minilm_theseus_bbc",
                                          "minilm_deebert_bbc", "minilm_pabee_bbc", "minilm_distill_3layer_brown_pos",
                                          "minilm_early_exit_brown_pos"}


# over ~20 s each on 2 quiet cores (SmolLM2's or MiniLM's tokenizer over all of BBC or brown_pos, MiniLM runs): slow
SLOW = {"smollm2_distill_llama_bbc", "minilm_distill_mlm_bbc", "minilm_deebert_bbc", "minilm_pabee_bbc",
        "minilm_distill_3layer_brown_pos", "minilm_early_exit_brown_pos"}


@pytest.mark.parametrize("config", [pytest.param(c, marks=pytest.mark.slow if c.stem in SLOW else ())
                                    for c in COMPRESS], ids=lambda c: c.stem)
def test_compress_config_trains_and_resumes_exactly(config, tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    model = yaml.safe_load(config.read_text())["model"]
    tokenizer = yaml.safe_load(config.read_text())["data"]["init_args"]["tokenizer"]
    off_ramps = model["class_path"] == "EarlyExitModule" or "early_exit" in model["init_args"]
    if off_ramps:  # off-ramps on a fine-tuned run (substituted) or on MiniLM
        backbone = str(model["init_args"]["backbone"])
        if backbone.startswith("checkpoints/"):  # the config's relative path, from a working directory that has it
            monkeypatch.chdir(tmp_path)
            runs = tmp_path / "checkpoints"
            tiny_teacher(runs, Path(backbone).name, tmp_path, tokenizer=tokenizer)
        early_exit_config_runs(config, model, runs, tmp_path)
        if backbone.startswith("checkpoints/"):  # DeeBERT's second stage only: the fine-tuned final head is kept
            teacher = torch.load(runs / Path(backbone).name / "checkpoints" / "last.ckpt", weights_only=True)
            ramps = torch.load(runs / "full" / "checkpoints" / "last.ckpt", weights_only=True)
            head = [k for k in teacher["state_dict"] if ".classifier." in k]
            assert head and all(torch.equal(teacher["state_dict"][k], ramps["state_dict"][k]) for k in head)
            summary = json.loads((runs / "full" / "summary.json").read_text())
            ramp_params = sum(v.numel() for k, v in ramps["state_dict"].items() if k.startswith("exits."))
            assert summary["trainable_params"] == ramp_params < summary["total_params"]  # the off-ramps alone
        return
    reference = (model["init_args"].get("teacher") or model["init_args"].get("predecessor")  # Theseus: a predecessor
                 or (model["init_args"].get("distill") or {}).get("teacher"))  # a task module's distill policy
    if reference is None:  # a recipe without a teacher: as shipped, bar the lengths
        assert_resumes_exactly(["fit", "--config", str(config), *QUICK], runs, stop=2, steps=4)
        assert run_main(["export", "--ckpt_path", str(runs / "full"), "--output_dir", str(tmp_path / "x")], runs) == 0
        return
    source = yaml.safe_load(config.read_text())["data"]["init_args"]["source"]
    teacher = tiny_teacher(runs, Path(reference).name, tmp_path, model["class_path"], tokenizer, source)
    extras = TEACHERS.get(model["class_path"], CLASSIFIER)[3]
    assert_resumes_exactly(["fit", "--config", str(config), *QUICK, *extras], runs, stop=2, steps=4)
    ckpt = torch.load(runs / "full" / "checkpoints" / "last.ckpt", weights_only=True)
    hparams = ckpt["hyper_parameters"]
    assert hparams.get("teacher", hparams.get("predecessor", (hparams.get("distill") or {}).get("teacher"))) == \
        str(teacher.resolve())
    student = hparams["backbone_config"]
    if model["class_path"] == "TokenClassificationModule":  # MiniLM's first 3 layers, taught per labelled token
        assert (student["model_type"], student["num_hidden_layers"]) == ("bert", 3)
        rows = list(csv.DictReader(open(runs / "full" / "logs" / "metrics.csv")))
        kd = [float(r["train/kd"]) for r in rows if r.get("train/kd")]
        assert len(kd) == 4 and all(v > 0 for v in kd)
        assert len([r for r in rows if r.get("val/teacher_acc")]) == 1  # the teacher's reference, once
    elif model["class_path"] == "CausalDistillationModule":  # the shipped tiny Llama student, as configured
        assert (student["model_type"], student["num_hidden_layers"], student["hidden_size"]) == ("llama", 2, 128)
        rows = list(csv.DictReader(open(runs / "full" / "logs" / "metrics.csv")))
        assert any(r.get("val/teacher_ppl") for r in rows) and any(r.get("val/ppl") for r in rows)
    elif model["init_args"].get("student_layers") == "every_other" or model["class_path"] == "TheseusModule":
        assert student["num_hidden_layers"] == 3  # every other of the 6 teacher layers
    elif student["model_type"] == "albert":  # shared_student: one layer's weights serve all 6
        assert (student["num_hidden_layers"], student["num_hidden_groups"], student["embedding_size"]) == (6, 1, 128)
        summary = json.loads((runs / "full" / "summary.json").read_text())
        # (E=128 is wider than the substituted teacher's 32: here the student is not the smaller one)
        assert summary["compression"] == pytest.approx(summary["teacher_params"] / summary["student_params"], abs=1e-3)
    elif student["model_type"] == "ptm_cnn":
        assert student["embedding_dim"] == 32  # the (substituted) teacher's width: its embeddings were copied
    else:
        assert student["model_type"] == "ptm_bilstm_lm"
    export = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(runs / "full"), "--output_dir", str(export)], runs) == 0
    assert (export / "config.json").exists()


def test_missing_teacher_names_the_config_to_run_first(tmp_path, capsys, outside_the_repo):
    config = ROOT / "configs" / "compress" / "minilm_distill_3layer_bbc.yaml"
    assert run_main(["fit", "--config", str(config), *QUICK], tmp_path / "runs") != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "teacher 'checkpoints/minilm_full_bbc' not found" in err[0], err
    assert "python main.py fit --config configs/adapt/minilm_full_bbc.yaml" in err[0]


def early_exit_config_runs(config: Path, model: dict, runs: Path, tmp_path: Path) -> None:
    """DeeBERT's first stage, when the recipe has one, shortened with the other step counts (2 of the 4 steps), so
    both stages run; from a fine-tuned run (final_steps: 0) only the off-ramps train, the final head kept."""
    policy = "early_exit" in model["init_args"]  # the early_exit policy of a task module, or EarlyExitModule's
    settings = model["init_args"]["early_exit"] if policy else model["init_args"]
    first = settings.get("method") == "deebert" and settings.get("final_steps")
    stage = [f"--model.init_args.{'early_exit.' if policy else ''}final_steps", "2"] if first else []
    assert_resumes_exactly(["fit", "--config", str(config), *QUICK, *stage], runs, stop=2, steps=4)
    rows = list(csv.DictReader(open(runs / "full" / "logs" / "metrics.csv")))
    assert any(r.get("train/layer_1") for r in rows)  # the off-ramps trained
    table = json.loads((runs / "full" / "summary.json").read_text())["early_exit"]
    criteria = len(settings["entropy_thresholds"]) + len(settings["patiences"])
    assert table["layers"] == 6 and len(table["rows"]) == criteria
    assert all(1.0 <= row["exit_layer"] <= 6.0 for row in table["rows"])
    export = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(runs / "full"), "--output_dir", str(export)], runs) == 0
    assert (export / "module_weights.safetensors").exists()  # the off-ramps
