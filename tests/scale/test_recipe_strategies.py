"""Every strategy overlay in configs/strategy/ with every pre-training recipe in configs/pretrain/, at 2 processes
on CPU, as shipped: 2 steps, nothing else changed but the batch limits and the documents tokenized
(tests/cli/test_configs.py).  Validation counts global steps, so a recipe's interval never has to fit in one
rank's share of an epoch.  7 x 16 launches of ~20-60 s each: slow tests (make test-slow)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_configs import run_as_shipped

ROOT = Path(__file__).resolve().parents[2]
STRATEGIES = sorted((ROOT / "configs" / "strategy").glob("*.yaml"))
RECIPES = sorted((ROOT / "configs" / "pretrain").glob("*.yaml"))
REFUSED = {  # (strategy, recipe): refused in one line before training, with the fix
    ("fsdp", "elmo_bilm_brown"): "FSDP: no transformer blocks found in BiLMModule; use strategy ddp",  # an LSTM: no blocks
    ("fsdp_hybrid", "elmo_bilm_brown"): "FSDP: no transformer blocks found in BiLMModule; use strategy ddp",
}


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda p: p.stem)
def test_strategy_runs_every_pretraining_recipe(strategy, recipe, tmp_path, monkeypatch):
    from ptm_app.checkpoint_io.reading import read_checkpoint

    from tests.cli.test_configs import shipped_args
    from tests.scale.conftest import launch

    monkeypatch.chdir(tmp_path)
    refused = REFUSED.get((strategy.stem, recipe.stem))
    if refused:
        out = launch(["fit", *shipped_args(strategy, recipe)], tmp_path / "checkpoints", fails=True, cwd=tmp_path)
        assert out.stderr.strip().splitlines()[-1] == f"error: {refused} or a transformers backbone"
        return
    run = run_as_shipped(strategy, tmp_path, base=recipe)
    assert read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"] == 2
