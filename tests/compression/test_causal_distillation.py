"""Causal-LM distillation: the word-level KD loss by hand, a tiny Llama student of a tiny Llama teacher that share
SmolLM2's tokenizer (trained, resumed exactly, exported), and the tokenizer mismatch as one line."""
import csv

import pytest
import torch
import yaml

from tests.conftest import assert_resumes_exactly, run_main

pytestmark = pytest.mark.usefixtures("one_thread")
TINY_LLAMA = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 64,
              "tie_word_embeddings": True}
QUIET = {"accelerator": "cpu", "enable_progress_bar": False, "enable_model_summary": False, "log_every_n_steps": 1,
         "num_sanity_val_steps": 0, "limit_val_batches": 1}


def data(corpus, tokenizer=None) -> dict:
    return {"class_path": "PretrainDataModule",
            "init_args": {"source": str(corpus), "max_length": 24, "batch_size": 4, "limit_documents": 20,
                          "tokenizer": tokenizer or {"pretrained": "smollm2"}}}


def test_next_token_kd_loss_by_hand():
    from ptm_app.compression.losses import next_token_kd_loss

    g = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(2, 4, 5, generator=g), torch.randn(2, 4, 5, generator=g)
    labels = torch.tensor([[7, 1, 2, 3], [7, 4, -100, -100]])  # row 1: only position 0 predicts a real token
    assert next_token_kd_loss(teacher, teacher, labels, 2.0).item() == pytest.approx(0.0, abs=1e-7)
    rows = [(0, 0), (0, 1), (0, 2), (1, 0)]  # (row, t) whose target labels[row, t + 1] is real
    kl = []
    for b, t in rows:
        p, q = torch.softmax(teacher[b, t] / 2, -1), torch.softmax(student[b, t] / 2, -1)
        kl.append((p * (p.log() - q.log())).sum())
    expected = 4.0 * torch.stack(kl).mean()  # T² · mean KL
    assert next_token_kd_loss(student, teacher, labels, 2.0).item() == pytest.approx(expected.item(), rel=1e-5)
    assert expected.item() > 0


@pytest.fixture(scope="module")
def clm_teacher(tiny_corpus, tmp_path_factory):
    """A tiny Llama with SmolLM2's tokenizer trained 3 steps on the fixture corpus: its run directory."""
    tmp = tmp_path_factory.mktemp("clm_teacher")
    cfg = {"seed_everything": 2, "trainer": {"max_steps": 3, "val_check_interval": 3, **QUIET},
           "model": {"class_path": "CausalLMModule",
                     "init_args": {"backbone_config": TINY_LLAMA, "optim": {"lr": 1e-2}}},
           "data": data(tiny_corpus)}
    path = tmp / "clm_teacher.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert run_main(["fit", "--config", str(path)], tmp / "runs") == 0
    return tmp / "runs" / "clm_teacher"


def config(tmp_path, corpus, teacher, tokenizer=None, steps: int = 4):
    student = {**TINY_LLAMA, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1}
    cfg = {"seed_everything": 5, "trainer": {"max_steps": steps, "val_check_interval": 2, **QUIET},
           "model": {"class_path": "CausalDistillationModule",
                     "init_args": {"teacher": str(teacher), "backbone_config": student, "optim": {"lr": 1e-2},
                                   "alpha_kd": 1.0, "alpha_lm": 0.5}},
           "data": data(corpus, tokenizer)}
    path = tmp_path / "distill.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow  # ~45 s on 2 quiet cores (three runs with a 49k-token vocabulary), minutes on a busy machine
def test_tiny_llama_student_learns_the_teachers_next_token_distribution(tiny_corpus, clm_teacher, tmp_path):
    import json

    from transformers import AutoModelForCausalLM

    from ptm_app.compression import CausalDistillationModule

    runs = tmp_path / "runs"
    assert_resumes_exactly(["fit", "--config", str(config(tmp_path, tiny_corpus, clm_teacher))], runs, stop=2,
                           steps=4)
    rows = list(csv.DictReader(open(runs / "full" / "logs" / "metrics.csv")))
    train = [r for r in rows if r.get("train/kd")]
    assert len(train) == 4
    for r in train:
        assert float(r["train/loss"]) == pytest.approx(float(r["train/kd"]) + 0.5 * float(r["train/lm"]), rel=1e-4)
        assert float(r["train/kd"]) > 0
    val = [r for r in rows if r.get("val/teacher_ppl")]
    assert len(val) == 2 and all(r.get("val/ppl") for r in val)  # both perplexities at every validation
    # the teacher's perplexity is the same model on the same batches each time
    assert float(val[0]["val/teacher_ppl"]) == pytest.approx(float(val[1]["val/teacher_ppl"]), rel=1e-5)
    summary = json.loads((runs / "full" / "summary.json").read_text())
    assert summary["teacher_params"] > summary["student_params"] > 0
    ckpt = torch.load(runs / "full" / "checkpoints" / "last.ckpt", weights_only=True)
    assert not any("teacher" in k for k in ckpt["state_dict"])
    module = CausalDistillationModule.load_from_checkpoint(runs / "full" / "checkpoints" / "last.ckpt").eval()
    assert run_main(["export", "--ckpt_path", str(runs / "full"), "--output_dir", str(tmp_path / "x")], runs) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "x").eval()
    ids = torch.tensor([[1, 420, 2681, 314]])
    with torch.no_grad():
        assert torch.allclose(exported(input_ids=ids).logits, module.backbone(input_ids=ids).logits, atol=1e-5)


def test_teacher_and_student_tokenizers_that_differ_are_one_line(tiny_corpus, tmp_path, capsys):
    """The prepared SmolLM2-135M as the teacher, a student tokenizer trained on the corpus."""
    other = {"train": "bpe", "vocab_size": 300, "min_frequency": 1}
    assert run_main(["fit", "--config", str(config(tmp_path, tiny_corpus, "smollm2", other, steps=1))],
                    tmp_path / "runs") != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "use different tokenizers (vocabularies of 49152 and" in err[0], err
    assert "word-level KL over the vocabulary needs one vocabulary" in err[0]
    assert "data.init_args.tokenizer.pretrained" in err[0]
