"""Every config in configs/adapt/ trains a few steps from YAML through main.py and resumes exactly: a run
paused at step 2 and resumed with --ckpt_path last logs the same losses as an uninterrupted one.  Stage-2
configs (ULMFiT's classifier, per-task fine-tuning after multitask) start from their stage-1 run; the
in-context evaluation config never trains (its refusal is tested in test_prompting.py)."""
from pathlib import Path

import pytest

from tests.cli.test_configs import BEFORE
from tests.conftest import assert_resumes_exactly, run_main

ROOT = Path(__file__).resolve().parents[2]
ADAPT = sorted((ROOT / "configs" / "adapt").glob("*.yaml"))
# The runs a config starts from: test_configs.BEFORE, the one table.  Configs that start from an export (gpt2_tldr_prompt,
# mbart_full, bart_scratch) read it at a path relative to the working directory: test_configs runs them as shipped
# after their chain, and tests/adaptation/test_generation.py and tests/objectives/test_mbart.py resume them.
FROM_EXPORT = {n.split("/")[1] for n, steps in BEFORE.items() if any(s.startswith("export ") for s in steps)}
NOT_TRAINED = {"gpt2_icl_tweets"} | FROM_EXPORT
DEFAULT_SUITE: set[str] = set()  # each config is covered in the default suite by its own tests (~5 min for all)
QUICK = ["--trainer.max_steps", "4", "--trainer.max_epochs", "1", "--trainer.val_check_interval", "4",
         "--trainer.check_val_every_n_epoch", "null", "--trainer.limit_val_batches", "1",
         "--trainer.num_sanity_val_steps", "0", "--trainer.log_every_n_steps", "1", "--trainer.precision", "32-true",
         "--trainer.enable_progress_bar", "false", "--data.init_args.batch_size", "4"]


def quick(config: Path) -> list[str]:
    text = config.read_text()
    args = list(QUICK)
    if "MultitaskDataModule" not in text and "Seq2SeqDataModule" not in text:  # seq2seq: source/target lengths
        args += ["--data.init_args.max_length", "48" if "QADataModule" in text else "32"]
    if "max_target_length" in text:
        args += ["--data.init_args.max_target_length", "16"]
    return args


@pytest.mark.parametrize("config", [pytest.param(c, marks=() if c.stem in DEFAULT_SUITE else pytest.mark.slow)
                                    for c in ADAPT if c.stem not in NOT_TRAINED], ids=lambda c: c.stem)
def test_adapt_config_trains_and_resumes_exactly(config, tmp_path):
    runs = tmp_path / "runs"
    for step in BEFORE.get(f"adapt/{config.stem}", []):
        first = ROOT / "configs" / f"{step}.yaml"
        assert run_main(["fit", "--config", str(first), *quick(first)], runs) == 0
    assert_resumes_exactly(["fit", "--config", str(config), *quick(config)], runs, stop=2, steps=4)
