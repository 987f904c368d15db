"""Every pre-training recipe that reads a corpus (PretrainDataModule) gives the same first batches on both data paths:
the in-memory corpus (``streaming: false``) and the litdata-prepared one (``streaming: true``).  The same batches
through the same initial model give bit-identical losses, so the losses of the first steps and the first validation
are compared, per recipe, through main.py."""
import csv
from pathlib import Path

import pytest
import yaml

from tests.cli.test_recipes import RECIPE_FILES, tiny_args
from tests.conftest import run_main

pytest.importorskip("litdata")

CORPUS_RECIPES = [c for c in RECIPE_FILES if yaml.safe_load(c.read_text())["data"]["class_path"] == "PretrainDataModule"]
STEPS = 3
# in the default suite: one recipe per kind of reading (NSP sentence pairs, span masking, permutation LM, a
# bidirectional LSTM LM, causal LM blocks), ~5 s each; the other ten (~80 s) run with `make test-slow`
DEFAULT = {"bert_mlm_nsp_brown", "spanbert_span_mlm_sbo_brown", "xlnet_plm_brown", "elmo_bilm_brown", "gpt2_clm_bbc"}


def logged(run: Path) -> dict[str, list[float]]:
    """``train/loss`` and every validation metric (ELECTRA logs ``val/gen_loss`` ..., not ``val/loss``)."""
    rows = list(csv.DictReader(open(run / "logs" / "metrics.csv")))
    keys = ["train/loss"] + sorted(k for k in rows[0] if k.startswith("val/"))
    return {key: [float(r[key]) for r in rows if r.get(key)] for key in keys}


def test_every_corpus_recipe_is_compared():
    assert len(CORPUS_RECIPES) >= 14 and {"bert_mlm_nsp_brown", "spanbert_span_mlm_sbo_brown", "xlnet_plm_brown", "t5_span_corruption_brown",
                                          "bart_dae_brown", "infoword_dim_mlm_brown", "elmo_bilm_brown"} <= {
        c.stem for c in CORPUS_RECIPES}


@pytest.mark.parametrize("config", [pytest.param(c, marks=() if c.stem in DEFAULT else pytest.mark.slow)
                                    for c in CORPUS_RECIPES], ids=lambda p: p.stem)
def test_recipe_sees_the_same_first_batches_on_both_paths(config, tmp_path):
    runs = tmp_path / "runs"
    args = tiny_args(config, steps=STEPS)  # validates after step 3
    results = {}
    for streaming in ("false", "true"):
        name = f"streaming_{streaming}"
        assert run_main(["fit", *args, "--run_name", name, "--data.init_args.streaming", streaming,
                         "--data.init_args.prepare_workers", "1",
                         "--data.init_args.shard_dir", str(tmp_path / "shards")], runs) == 0
        results[streaming] = logged(runs / name)
    memory, prepared = results["false"], results["true"]
    assert len(memory["train/loss"]) == STEPS and any(memory[k] for k in memory if k.startswith("val/"))
    assert prepared == memory
    assert (tmp_path / "shards" / "train" / "index.json").exists()
