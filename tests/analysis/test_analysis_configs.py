"""Every configs/analysis/ recipe runs end to end through main.py on the real prepared data and models, with only
its sizes made tiny."""
import json
from pathlib import Path

import pytest

from tests.conftest import run_main

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs" / "analysis").glob("*.yaml"))
SLOW = {"probe_mlp_minilm_smollm2"}  # loads the 135M-parameter SmolLM2: about 30 s
TINY = {"probe": ["--train_examples", "8", "--test_examples", "4", "--steps", "5"],
        "contextuality": ["--sentences", "30", "--baseline_pairs", "200"],
        "attention": ["--sentences", "4"]}


def test_catalogue_has_the_analysis_recipes():
    assert {p.stem.split("_")[0] for p in CONFIGS} >= {"probe", "contextuality", "attention"}


@pytest.mark.parametrize("config", [pytest.param(p, marks=pytest.mark.slow) if p.stem in SLOW else p
                                    for p in CONFIGS], ids=lambda p: p.stem)
def test_recipe_runs_at_tiny_size(config, tmp_path, capsys):
    command = config.stem.split("_")[0]
    out = tmp_path / "out"
    assert run_main([command, "--config", str(config), *TINY[command], "--output_dir", str(out)], tmp_path) == 0
    assert (out / f"{command}.png").stat().st_size > 1000
    rows = json.loads((out / f"{command}.json").read_text())
    assert rows and all(0.0 <= r["layer"] for r in rows)
    assert capsys.readouterr().out.strip().endswith(f"wrote {out}")


@pytest.mark.parametrize("command", ["probe", "contextuality", "attention", "plot"])
def test_an_unknown_key_in_a_config_file_is_one_line(command, tmp_path, capsys):
    config = tmp_path / "typo.yaml"
    config.write_text("modles: [minilm]\n")
    argv = [command, "anyrun", "--config", str(config)] if command == "plot" else [command, "--config", str(config)]
    assert run_main(argv, tmp_path) == 2
    err = capsys.readouterr().err
    assert f"unknown config key 'modles'; check its spelling (python main.py {command} --help" in err
    assert err.count("\n") == 1
