"""Every shipped fine-tuning config runs a few steps through main.py on the real prepared data, and the demo
chain works end to end.  Pre-training recipes run at tiny size in test_recipes.py; every config parses here."""
from pathlib import Path

import pytest
import torch

from tests.conftest import run_main

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["--trainer.max_steps", "3", "--trainer.max_epochs", "1", "--trainer.val_check_interval", "3",
         "--trainer.limit_val_batches", "2", "--trainer.limit_test_batches", "2", "--trainer.enable_progress_bar",
         "false", "--trainer.log_every_n_steps", "1"]
ALL = sorted(p for p in (ROOT / "configs").glob("*/*.yaml")
             if p.parent.name not in ("sweeps", "analysis"))  # sweeps: plans; analysis: tests/analysis/test_configs.py
STANDALONE = sorted(p for p in ALL if p.parent.name == "finetune")


def test_catalogue_is_not_empty():
    assert {p.parent.name for p in ALL} >= {"pretrain", "finetune", "demo"}


@pytest.mark.parametrize("config", ALL, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_config_parses(config, capsys):
    from ptm_app.main import main

    addition = config.parent.name in ("strategy", "memory")  # added to a run config
    base = ["--config", str(ROOT / "configs" / "pretrain" / "bert_mlm.yaml")] if addition else []
    with pytest.raises(SystemExit) as done:  # --print_config prints the resolved config and exits 0
        main(["fit", *base, "--config", str(config), "--print_config"])
    assert done.value.code in (0, None)
    assert "class_path" in capsys.readouterr().out


@pytest.mark.parametrize("config", STANDALONE, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_config_runs_a_few_steps(config, tmp_path):
    assert run_main(["fit", "--config", str(config), *QUICK], tmp_path) == 0
    ckpt = torch.load(tmp_path / config.stem / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 3


def test_demo_pipeline_chains_pretraining_export_and_finetuning(tmp_path):
    demo = ROOT / "configs" / "demo"
    assert run_main(["fit", "--config", str(demo / "mlm_minilm_bbc.yaml"), *QUICK], tmp_path) == 0
    export = tmp_path / "demo_mlm" / "export"
    assert run_main(["export", "--ckpt_path", str(tmp_path / "demo_mlm"), "--output_dir", str(export)], tmp_path) == 0
    chained = ["--model.init_args.backbone", str(export), "--data.init_args.tokenizer.pretrained", str(export)]
    assert run_main(["fit", "--config", str(demo / "finetune_bbc.yaml"), *QUICK, *chained], tmp_path) == 0
    assert run_main(["test", "--config", str(demo / "finetune_bbc.yaml"), *QUICK, *chained, "--ckpt_path", "best"],
                    tmp_path) == 0
    # the fine-tuned encoder started from the MLM run's weights, not from the prepared MiniLM
    mlm = torch.load(tmp_path / "demo_mlm" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    key = "backbone.bert.embeddings.word_embeddings.weight"
    from transformers import AutoModel

    assert torch.equal(AutoModel.from_pretrained(export).embeddings.word_embeddings.weight, mlm[key].float())
