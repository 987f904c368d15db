"""Every shipped config runs as shipped (2 steps, nothing else changed but the batch limits) through main.py on
the real prepared data, and the demo chain works end to end.  Pre-training recipes also run at tiny size in
test_recipes.py (resume, export, overfitting); every config parses here."""
import json
from pathlib import Path
from typing import Optional

import pytest
import torch
import yaml

from tests.conftest import run_main

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["--trainer.max_steps", "3", "--trainer.max_epochs", "1", "--trainer.val_check_interval", "3",
         "--trainer.limit_val_batches", "2", "--trainer.limit_test_batches", "2", "--trainer.enable_progress_bar",
         "false", "--trainer.log_every_n_steps", "1"]
# sweeps: plans; analysis: run by tests/analysis/test_analysis_configs.py; compress: need a trained teacher run first,
# run with a substituted teacher by tests/compression/test_compress_configs.py
ALL = sorted(p for p in (ROOT / "configs").glob("*/*.yaml") if p.parent.name not in ("sweeps", "analysis", "compress"))


def test_catalogue_is_not_empty():
    assert {p.parent.name for p in ALL} >= {"pretrain", "adapt", "demo"}


@pytest.mark.parametrize("config", ALL, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_config_parses(config, capsys):
    from ptm_app.main import main

    addition = config.parent.name in OVERLAYS  # added to a run config
    base = ["--config", str(overlay_base(config))] if addition else []
    with pytest.raises(SystemExit) as done:  # --print_config prints the resolved config and exits 0
        main(["fit", *base, "--config", str(config), "--print_config"])
    assert done.value.code in (0, None)
    assert "class_path" in capsys.readouterr().out


# -- every config as shipped -------------------------------------------------------------------------------------
# Only the run's length changes: 2 steps, one batch per evaluation, and (pre-training) fewer documents to tokenize.
# Validation intervals stay the recipes': they count global steps (cli.count_validation_in_global_steps).
AS_SHIPPED = ["--trainer.max_steps", "2", "--trainer.limit_val_batches", "1", "--trainer.limit_test_batches", "1",
              "--trainer.limit_predict_batches", "1"]
FEW_DOCUMENTS = ["--data.init_args.limit_documents", "64"]
OVERLAYS = ("strategy", "memory", "optim")  # added to a run config: here to this recipe (or the one it names)
OVERLAY_BASE = ROOT / "configs" / "pretrain" / "bert_mlm_bbc.yaml"
OVERLAY_BASES = {"optim/lamb_8x_batch": "pretrain/bert_mlm_nsp_brown", "optim/adafactor_t5": "pretrain/t5_span_corruption_brown"}


def overlay_base(config: Path) -> Path:
    """The recipe an overlay is added to: for ``optim/`` the one its header comment shows it with, else bert_mlm_bbc."""
    name = f"{config.parent.name}/{config.stem}"
    return ROOT / "configs" / f"{OVERLAY_BASES[name]}.yaml" if name in OVERLAY_BASES else OVERLAY_BASE
NOT_TRAINED = {"gpt2_icl_tweets", "smollm2_icl_tweets", "smollm2_icl_bbc"}  # in-context evaluation: 'test', never 'fit'
BEFORE = {  # configs that start from another run: those runs first, as shipped (then exported, for .../export)
    "adapt/minilm_ulmfit_classifier_bbc": ["pretrain/minilm_ulmfit_lm_bbc"],
    "adapt/minilm_after_multitask_tweets": ["adapt/minilm_multitask_mix"],
    "adapt/gpt2_tldr_prompt_bbc_headlines": ["pretrain/gpt2_clm_bbc", "export gpt2_clm_bbc"],
    "adapt/gpt2_icl_tweets": ["pretrain/gpt2_clm_bbc", "export gpt2_clm_bbc"],
    "demo/demo_mlm_full_bbc": ["demo/minilm_mlm_bbc", "export demo_mlm"],
    "adapt/mbart_full_bible_en_es": ["pretrain/mbart_dae_bible", "export mbart_dae_bible"],
    "adapt/bart_scratch_bible_en_es": ["pretrain/mbart_dae_bible", "export mbart_dae_bible"],  # its tokenizer
    "knowledge/minilm_kadapter_wordnet_supersense": ["knowledge/minilm_kadapter_factual_wordnet_kg", "knowledge/minilm_kadapter_linguistic_brown_pos"],
    "knowledge/minilm_kadapter_wordnet_pairs": ["knowledge/minilm_kadapter_factual_wordnet_kg", "knowledge/minilm_kadapter_linguistic_brown_pos"],
}
# In the default suite: the fast full fine-tuning configs (adapt/minilm_full_*) and a fast pre-training one
# (about 5-15 s each on 2 quiet cores); the rest are slow tests (make test-slow): 60 configs take ~35 min.
# Left to make test-slow where the default suite runs the recipe another way: minilm_full_bbc (the demo chain fine-tunes
# MiniLM on BBC), minilm_full_brown_pos and minilm_full_wordnet_qa (tests/adaptation/test_token_qa.py trains and predicts with
# them), the minilm_features_* configs (tests/adaptation/test_features_strategies.py), xlm_tlm_bible and roberta_mlm_brown (test_recipes.py), the
# optim/ overlays (tests/training/test_large_batch_optim.py runs them as shipped and checks the optimiser's state),
# minilm_full_wordnet_pairs and minilm_full_wordnet_choice (tests/task_kinds/test_every_kind.py and test_multiple_choice.py cover
# those paths; ~20-30 s each), adapt/minilm_prompt_tweets (prompt tuning: tests/adaptation/test_prompting.py).
# minilm_full_squad and minilm_full_squad2 are slow: their first runs tokenize SQuAD's 98k (196k with the derived negatives)
# questions into 384-token windows (1-2 minutes); tests/adaptation/test_null_answer.py runs the null-answer path.
# minilm_freelb_tweets (two passes a step) is slow: tests/analysis/test_attack.py fits and resumes FreeLB.
# mbart_full_bible_en_es and bart_scratch_bible_en_es are slow: each first runs pretrain/mbart_dae_bible (its tokenizer trains on the whole Bible)
# and exports it (about 3 min on 2 busy cores); tests/objectives/test_mbart.py runs the same chain at tiny size.
CHEAP = {"adapt/minilm_full_openmoji", "adapt/minilm_full_tweets", "adapt/minilm_full_tweets_confidence",
         "adapt/minilm_full_wnut16", "adapt/minilm_full_wordnet_supersense", "pretrain/unilm_unified_mlm_brown"}


def name(config: Path) -> str:
    return f"{config.parent.name}/{config.stem}"


def pretrains(config: Path) -> bool:
    return yaml.safe_load(config.read_text())["data"]["class_path"].endswith(("PretrainDataModule", "KeplerDataModule",
                                                                              "MultilingualDataModule",
                                                                              "MultilingualDenoisingDataModule"))


def shipped_args(config: Path, base: Optional[Path] = None) -> list[str]:
    """``--config`` (after the recipe ``base``, for an overlay) and the run-length limits."""
    configs = [base or overlay_base(config), config] if config.parent.name in OVERLAYS else [config]
    args = [a for c in configs for a in ("--config", str(c))] + AS_SHIPPED
    return args + (FEW_DOCUMENTS if pretrains(configs[0]) else [])


def run_as_shipped(config: Path, root: Path, base: Optional[Path] = None) -> Path:
    """Run ``config`` (an overlay: added to the recipe ``base``) for 2 steps (``test`` for evaluation-only configs)
    with the working directory at ``root`` and its runs in ``root/checkpoints`` (the configs' relative paths:
    ``checkpoints/gpt2_clm_bbc/export``, ``data/parallel/en-fr.tsv``); returns the run directory."""
    from tests.objectives.test_tlm import PAIRS, write_tsv
    from tests.scale.conftest import launch

    runs = root / "checkpoints"
    for step in BEFORE.get(name(config), []):
        if step.startswith("export "):
            run = runs / step.split()[1]
            assert run_main(["export", "--ckpt_path", str(run), "--output_dir", str(run / "export")], runs) == 0
        else:
            run_as_shipped(ROOT / "configs" / f"{step}.yaml", root)
    base = base or overlay_base(config)
    recipe = base if config.parent.name in OVERLAYS else config
    if recipe.stem == "xlm_tlm_bible":  # the user's parallel corpus, where the recipe expects it
        (root / "data" / "parallel").mkdir(parents=True, exist_ok=True)
        write_tsv(root / "data" / "parallel" / "en-fr.tsv", PAIRS)
    command = "test" if config.stem in NOT_TRAINED else "fit"
    args = [command, *shipped_args(config, base)]
    if config.parent.name == "strategy":  # one process per rank: Lightning re-runs main.py
        launch(args, runs, cwd=root)
    else:
        assert run_main(args, runs) == 0
    run_name = yaml.safe_load(recipe.read_text()).get("run_name") or config.stem
    return runs / run_name


@pytest.mark.parametrize("config", [pytest.param(c, marks=() if name(c) in CHEAP else pytest.mark.slow)
                                    for c in ALL], ids=name)
def test_config_runs_as_shipped(config, tmp_path, monkeypatch):
    from ptm_app.checkpoint_io.reading import read_checkpoint

    monkeypatch.chdir(tmp_path)
    run = run_as_shipped(config, tmp_path)
    if config.stem in NOT_TRAINED:
        metrics = json.loads((run / "summary.json").read_text())["metrics"]
        assert any(k.startswith("test/") for k in metrics), metrics
    else:
        assert read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"] == 2


def test_demo_pipeline_chains_pretraining_export_and_finetuning(tmp_path):
    demo = ROOT / "configs" / "demo"
    assert run_main(["fit", "--config", str(demo / "minilm_mlm_bbc.yaml"), *QUICK], tmp_path) == 0
    export = tmp_path / "demo_mlm" / "export"
    assert run_main(["export", "--ckpt_path", str(tmp_path / "demo_mlm"), "--output_dir", str(export)], tmp_path) == 0
    chained = ["--model.init_args.backbone", str(export), "--data.init_args.tokenizer.pretrained", str(export)]
    assert run_main(["fit", "--config", str(demo / "demo_mlm_full_bbc.yaml"), *QUICK, *chained], tmp_path) == 0
    assert run_main(["test", "--config", str(demo / "demo_mlm_full_bbc.yaml"), *QUICK, *chained, "--ckpt_path", "best"],
                    tmp_path) == 0
    # the fine-tuned encoder started from the MLM run's weights, not from the prepared MiniLM
    mlm = torch.load(tmp_path / "demo_mlm" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    key = "backbone.bert.embeddings.word_embeddings.weight"
    from transformers import AutoModel

    assert torch.equal(AutoModel.from_pretrained(export).embeddings.word_embeddings.weight, mlm[key].float())


def test_validation_counts_global_steps_across_epochs(tiny_corpus, tmp_path):
    """An interval longer than an epoch (8 batches; the tiny corpus has 6 per epoch) validates at global batches 8
    and 16, where Lightning's per-epoch counting refuses it; a user's own check_val_every_n_epoch is kept."""
    import csv

    from ptm_app.training.cli import PtmCLI
    from tests.conftest import tiny_mlm_config

    config = tiny_mlm_config(tiny_corpus, tmp_path, max_steps=16, val_check_interval=8)
    assert run_main(["fit", "--config", str(config)], tmp_path / "runs") == 0
    rows = list(csv.DictReader(open(tmp_path / "runs" / "tiny_mlm" / "logs" / "metrics.csv")))
    assert sorted({int(r["epoch"]) for r in rows}) == [0, 1, 2]  # it crossed epochs
    assert [int(r["step"]) for r in rows if r.get("val/loss")] == [7, 15]
    given = PtmCLI(args=["--config", str(config), "--trainer.check_val_every_n_epoch", "1", "--run_name", "own"],
                   run=False)
    assert given.trainer.check_val_every_n_epoch == 1
    in_file = tmp_path / "every_epoch.yaml"
    in_file.write_text("trainer: {check_val_every_n_epoch: 2}\n")
    assert PtmCLI(args=["--config", str(config), "--config", str(in_file), "--run_name", "file"],
                  run=False).trainer.check_val_every_n_epoch == 2
    epochs = PtmCLI(args=["--config", str(config), "--trainer.max_steps", "-1", "--trainer.max_epochs", "2",
                          "--run_name", "epochs"], run=False)
    assert epochs.trainer.check_val_every_n_epoch == 1  # epoch-based: Lightning's default
