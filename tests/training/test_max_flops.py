"""``trainer.max_flops``: a run stops at the first optimizer step at or past its training-FLOPs budget (Clark et al.
2020 Figure 1's equal-compute comparisons), counts across a resume, and writes its FLOPs and tokens to
``summary.json``; a budget below one step, or not positive, is one line."""
import json

import pytest

from ptm_app.checkpoint_io.reading import read_checkpoint
from tests.conftest import run_main, tiny_mlm_config


def summary(run):
    return json.loads((run / "summary.json").read_text())


@pytest.fixture
def one_step(tiny_corpus, tmp_path):
    """FLOPs and tokens of one optimizer step of the tiny MLM run (its blocks are packed: every step the same)."""
    config = tiny_mlm_config(tiny_corpus, tmp_path, max_steps=1)
    assert run_main(["fit", "--config", str(config)], tmp_path / "first") == 0
    facts = summary(tmp_path / "first" / "tiny_mlm")
    return config, facts["train_flops"], facts["train_tokens"]


def test_the_count_is_flops_per_token_times_tokens(one_step, tmp_path):
    from ptm_app.objectives import MaskedLMModule
    from ptm_app.training.throughput import training_flops_per_token

    _, flops, tokens = one_step
    module = MaskedLMModule.load_from_checkpoint(tmp_path / "first" / "tiny_mlm" / "checkpoints" / "last.ckpt")
    assert tokens == 4 * 32  # one batch of 4 full blocks of 32 tokens
    assert flops == pytest.approx(tokens * training_flops_per_token(module, 32), rel=1e-9)


def test_a_run_stops_at_its_budget_and_counts_across_a_resume(one_step, tmp_path):
    config, flops, _ = one_step
    budget = ["--trainer.max_steps", "50", "--trainer.max_flops", str(2.5 * flops)]
    assert run_main(["fit", "--config", str(config), *budget], tmp_path / "whole") == 0
    whole = tmp_path / "whole" / "tiny_mlm"
    assert read_checkpoint(whole / "checkpoints" / "last.ckpt")["global_step"] == 3  # 2.5 steps: stops after the 3rd
    assert summary(whole)["train_flops"] == pytest.approx(3 * flops, rel=0.02)
    # paused at step 2 and resumed: the budget counts the first session's FLOPs too
    runs = tmp_path / "paused"
    assert run_main(["fit", "--config", str(config), *budget, "--stop_at_step", "2"], runs) == 0
    assert run_main(["fit", "--config", str(config), *budget, "--ckpt_path", "last"], runs) == 0
    assert read_checkpoint(runs / "tiny_mlm" / "checkpoints" / "last.ckpt")["global_step"] == 3
    assert summary(runs / "tiny_mlm")["train_flops"] == pytest.approx(summary(whole)["train_flops"], rel=1e-9)


@pytest.mark.parametrize("value, words", [("0", "must be a positive number"), ("1000", "smaller than one optimizer step")])
def test_a_budget_that_cannot_run_is_one_line(tiny_corpus, tmp_path, capsys, value, words):
    config = tiny_mlm_config(tiny_corpus, tmp_path, max_steps=5)
    assert run_main(["fit", "--config", str(config), "--trainer.max_flops", value], tmp_path) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and words in err[0], err
