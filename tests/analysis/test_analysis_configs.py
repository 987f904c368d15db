"""Every configs/analysis/ recipe runs end to end through main.py on the real prepared data and models, with only
its sizes made tiny."""
import json
import re
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_main

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs" / "analysis").glob("*.yaml"))
SLOW = {"minilm_smollm2_probe_mlp_brown_pos", "smollm2_lama_wordnet",  # load the 135M-parameter SmolLM2: about 30 s
        "minilm_robustness_tweets", "minilm_robustness_bbc",  # fine-tune MiniLM for 2 steps first
        "bert_probe_linear_mix",  # pre-trains BERT for 2 steps first
        "minilm_attack_tweets", "minilm_attack_bbc"}  # fine-tune MiniLM for 2 steps first (2-3 classifiers)
TINY = {"probe": ["--train_examples", "8", "--test_examples", "4", "--steps", "5"],
        "contextuality": ["--sentences", "30", "--baseline_pairs", "200"],
        "attention": ["--sentences", "4"],
        "knowledge-probe": ["--facts_per_relation", "3"],
        "robustness": ["--examples", "8"],
        "attack": ["--examples", "4"]}
# the runs a recipe reads from checkpoints/: the option naming them, and the configs that make them (run for 2 steps)
# before the prepared models the recipe also names
RUNS_MADE_FIRST = {
    "minilm_robustness_tweets": ("--runs", [], [ROOT / "configs" / "adapt" / "minilm_full_tweets.yaml",
                                                ROOT / "configs" / "adapt" / "minilm_lora_tweets.yaml"]),
    "minilm_robustness_bbc": ("--runs", [], [ROOT / "configs" / "adapt" / "minilm_full_bbc.yaml",
                                             ROOT / "configs" / "adapt" / "minilm_lora_bbc.yaml"]),
    "minilm_attack_tweets": ("--runs", [], [ROOT / "configs" / "adapt" / "minilm_full_tweets.yaml",
                                            ROOT / "configs" / "adapt" / "minilm_lora_tweets.yaml",
                                            ROOT / "configs" / "adapt" / "minilm_freelb_tweets.yaml"]),
    "minilm_attack_bbc": ("--runs", [], [ROOT / "configs" / "adapt" / "minilm_full_bbc.yaml",
                                         ROOT / "configs" / "adapt" / "minilm_lora_bbc.yaml"]),
    "bert_probe_linear_mix": ("--models", ["minilm"], [ROOT / "configs" / "pretrain" / f"{name}.yaml"
                                                      for name in ("bert_mlm_bbc",)])}
def command_of(config: Path) -> str:
    """The command the recipe's header comment runs it with (``python main.py COMMAND --config`` the recipe)."""
    return re.search(rf"python main\.py ([\w-]+) --config configs/analysis/{config.stem}\.yaml", config.read_text())[1]


def test_catalogue_has_the_analysis_recipes():
    assert {command_of(p) for p in CONFIGS} >= {"probe", "contextuality", "attention", "knowledge-probe",
                                                "robustness", "attack"}


def test_make_analysis_runs_every_recipe():
    """`make analysis` regenerates the README's analysis results: it runs each configs/analysis recipe."""
    makefile = (ROOT / "Makefile").read_text()
    target = makefile.split("\nanalysis:", 1)[1].split("\n\n", 1)[0]
    for config in CONFIGS:
        assert f"main.py {command_of(config)} --config configs/analysis/{config.name}" in target


@pytest.mark.parametrize("config", [pytest.param(p, marks=pytest.mark.slow) if p.stem in SLOW else p
                                    for p in CONFIGS], ids=lambda p: p.stem)
def test_recipe_runs_at_tiny_size(config, tmp_path, capsys, monkeypatch):
    from ptm_app import paths

    command = command_of(config)
    monkeypatch.setenv("PTM_DOWNLOAD_CACHE", str(paths.data_root() / ".cache" / "downloads"))  # WordNet's .deb
    out = tmp_path / "out"
    extra = []
    if config.stem in RUNS_MADE_FIRST:
        option, prepared, fits = RUNS_MADE_FIRST[config.stem]
        assert yaml.safe_load(config.read_text())[option.strip("-")] == prepared + [f"checkpoints/{fit.stem}"
                                                                                    for fit in fits]
        for fit in fits:
            assert run_main(["fit", "--config", str(fit), "--trainer.max_steps", "2", "--trainer.val_check_interval",
                             "2", "--trainer.limit_val_batches", "2", "--trainer.enable_progress_bar", "false"],
                            tmp_path) == 0
        extra = [option, "[" + ", ".join(prepared + [str(tmp_path / fit.stem) for fit in fits]) + "]"]
    assert run_main([command, "--config", str(config), *TINY[command], *extra, "--output_dir", str(out)],
                    tmp_path) == 0
    stem = command.replace("-", "_")
    assert (out / f"{stem}.png").stat().st_size > 1000
    rows = json.loads((out / f"{stem}.json").read_text())
    if command == "robustness":
        assert {r["perturbation"] for r in rows} == {"clean", "typo_swap", "typo_drop", "typo_insert",
                                                      "typo_replace", "word_dropout", "synonym"}
        assert all(0.0 <= r["accuracy"] <= 1.0 and r["examples"] == 8 for r in rows)
        assert {r["model"] for r in rows} == {fit.stem for fit in RUNS_MADE_FIRST[config.stem][2]}
    elif command == "attack":
        assert [r["model"] for r in rows] == [fit.stem for fit in RUNS_MADE_FIRST[config.stem][2]]
        assert all(r["examples"] == 4 and 0.0 <= r["attacked_accuracy"] <= r["clean_accuracy"] for r in rows)
    elif command == "knowledge-probe":
        assert {r["relation"] for r in rows} >= {"hypernym", "antonym", "all"}
        assert all(r["p_at_1"] is None or 0.0 <= r["p_at_1"] <= r["p_at_10"] <= 1.0 for r in rows)
    else:
        assert rows and all(0.0 <= r["layer"] for r in rows)
        if config.stem in RUNS_MADE_FIRST:  # the prepared model and every run made first are probed
            option, prepared, fits = RUNS_MADE_FIRST[config.stem]
            assert {r["model"] for r in rows} == set(prepared) | {fit.stem for fit in fits}
    shown = capsys.readouterr()
    assert shown.out.strip().endswith(f"wrote {out}")
    assert "Warning" not in shown.err and "warnings.warn" not in shown.err  # known notices go to no console


@pytest.mark.parametrize("command", ["probe", "contextuality", "attention", "plot", "knowledge-probe",
                                     "robustness"])
def test_an_unknown_key_in_a_config_file_is_one_line(command, tmp_path, capsys):
    config = tmp_path / "typo.yaml"
    config.write_text("modles: [minilm]\n")
    argv = [command, "anyrun", "--config", str(config)] if command == "plot" else [command, "--config", str(config)]
    assert run_main(argv, tmp_path) == 2
    err = capsys.readouterr().err
    assert f"unknown config key 'modles'; check its spelling (python main.py {command} --help" in err
    assert err.count("\n") == 1
