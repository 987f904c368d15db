"""Every configs/compress recipe runs from YAML through main.py and resumes exactly.  The teacher is SUBSTITUTED:
instead of MiniLM fine-tuned on BBC (configs/finetune/bbc_minilm.yaml, minutes of training), a tiny 6-layer BERT
with MiniLM's tokenizer is trained here for 2 steps on the real BBC data under the run name the config names
(``bbc_minilm``, looked up under the runs directory); everything else in the config is as shipped, bar step counts
and lengths."""
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import TINY_BERT, assert_resumes_exactly, run_main

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[2]
COMPRESS = sorted(c for c in (ROOT / "configs" / "compress").glob("*.yaml")
                  if not c.stem.startswith(("prune_", "quantize_")))  # test_pruning.py / test_quantization.py
QUICK = ["--trainer.max_steps", "4", "--trainer.max_epochs", "1", "--trainer.val_check_interval", "4",
         "--trainer.check_val_every_n_epoch", "null", "--trainer.limit_val_batches", "1",
         "--trainer.num_sanity_val_steps", "0", "--trainer.log_every_n_steps", "1", "--trainer.precision", "32-true",
         "--trainer.enable_progress_bar", "false", "--data.init_args.batch_size", "4",
         "--data.init_args.max_length", "32"]


def tiny_teacher(runs: Path, name: str, tmp: Path) -> Path:
    """A 6-layer tiny BERT classifier on BBC with MiniLM's tokenizer, trained 2 steps, as run ``name``."""
    cfg = {"seed_everything": 1,
           "trainer": {"max_steps": 2, "accelerator": "cpu", "limit_val_batches": 1, "num_sanity_val_steps": 0,
                       "enable_progress_bar": False, "enable_model_summary": False, "logger": False},
           "model": {"class_path": "SequenceClassificationModule",
                     "init_args": {"backbone_config": {**TINY_BERT, "num_hidden_layers": 6}}},
           "data": {"class_path": "TaskDataModule",
                    "init_args": {"source": "bbc", "tokenizer": {"pretrained": "minilm"}, "max_length": 32,
                                  "batch_size": 4}}}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert run_main(["fit", "--config", str(path), "--trainer.max_epochs", "1"], runs) == 0
    return runs / name


def test_catalogue_is_not_empty():
    assert {c.stem for c in COMPRESS} >= {"distill_bbc_3layer", "distill_bbc_bilstm"}


@pytest.mark.parametrize("config", COMPRESS, ids=lambda c: c.stem)
def test_compress_config_trains_and_resumes_exactly(config, tmp_path):
    runs = tmp_path / "runs"
    teacher_ref = yaml.safe_load(config.read_text())["model"]["init_args"]["teacher"]
    teacher = tiny_teacher(runs, Path(teacher_ref).name, tmp_path)
    assert_resumes_exactly(["fit", "--config", str(config), *QUICK], runs, stop=2, steps=4)
    ckpt = torch.load(runs / "full" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["hyper_parameters"]["teacher"] == str(teacher.resolve())
    student = ckpt["hyper_parameters"]["backbone_config"]
    if yaml.safe_load(config.read_text())["model"]["init_args"].get("student_layers") == "every_other":
        assert student["num_hidden_layers"] == 3  # every other of the 6 teacher layers
    else:
        assert student["model_type"] == "ptm_bilstm_lm"


def test_missing_teacher_names_the_config_to_run_first(tmp_path, capsys):
    config = ROOT / "configs" / "compress" / "distill_bbc_3layer.yaml"
    assert run_main(["fit", "--config", str(config), *QUICK], tmp_path / "runs") != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "teacher 'checkpoints/bbc_minilm' not found" in err[0], err
    assert "python main.py fit --config configs/finetune/bbc_minilm.yaml" in err[0]
