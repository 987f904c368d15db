"""The config hub's rules (ptm_app/experiments/config_catalogue.py): configs/README.md is what the generator writes,
every config says what it runs in its first comment, run configs are named <model>_<method>_<data> in their stage's
folder, ptm_app classes go by their short names, every config path the repository names exists, and an old
config path is one line naming its new one."""
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from ptm_app.errors import RENAMED_CONFIGS, renamed_config
from ptm_app.experiments.config_catalogue import (CONFIGS, OVERLAYS, STAGES, catalogue, class_paths, config_files,
                                                  description, summary)
from tests.conftest import run_main

ROOT = Path(__file__).resolve().parents[2]
ALL = config_files()
RUNS = [p for p in ALL if p.parent.name not in (*OVERLAYS, "sweeps")]  # a run's name is its file's stem
MISSING_ON_PURPOSE = {"configs/knowledge/nope.yaml"}  # tests/knowledge/test_knowledge_report.py: a plan's missing config


def test_configs_readme_is_the_generated_catalogue():
    assert (ROOT / "configs" / "README.md").read_text() == catalogue(), \
        "configs/README.md is stale: python main.py configs --readme configs/README.md"


def test_the_command_writes_the_catalogue(tmp_path, capsys):
    out = tmp_path / "README.md"
    assert run_main(["configs", "--readme", str(out)], tmp_path) == 0
    assert out.read_text() == catalogue() and not list(tmp_path.glob(".README.md.tmp-*"))
    assert capsys.readouterr().out == f"wrote {out}\n"
    assert run_main(["configs"], tmp_path) == 0
    assert capsys.readouterr().out.startswith(catalogue())


def test_catalogue_lists_every_config_once_under_its_stage():
    text = catalogue()
    listed = re.findall(r"^\| `(configs/[\w/.-]+\.yaml)` \|", text, flags=re.M)
    assert sorted(listed) == sorted(str(p.relative_to(ROOT)) for p in CONFIGS.rglob("*.yaml"))
    assert len(listed) == len(set(listed)) > 100
    sections = re.findall(r"^## (\w+)/$", text, flags=re.M)
    assert sections == [s for s in STAGES if any(p.parent.name == s for p in ALL)]


def test_description_is_the_first_comment_paragraph():
    text = "# One line\n# two line. Then more\n#\n# not this\n#   python main.py fit --config x\nkey: 1\n"
    assert description(text) == ["One line", "two line. Then more"]
    assert summary(text) == "One line two line."
    assert description("key: 1\n# late\n") == [] and description("#   python main.py fit\n") == []
    assert summary("# " + "word " * 100) .endswith(" ...") and len(summary("# " + "word " * 100)) <= 324


@pytest.mark.parametrize("config", ALL, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_config_starts_with_what_it_runs(config):
    text = config.read_text()
    assert text.startswith("# ") and description(text), f"{config}: start it with a '# ...' description"
    assert len(summary(text)) >= 30, summary(text)


def test_run_configs_are_named_model_method_data_in_their_stage():
    assert {p.parent.name for p in ALL} <= set(STAGES)
    for config in RUNS:
        assert re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+){2,}", config.stem), f"{config}: name it <model>_<method>_<data>"
    stems = [p.stem for p in RUNS]
    assert len(stems) == len(set(stems)), "two run configs would write the same run directory"
    assert not (CONFIGS / "finetune").exists()  # fine-tuning is one way to adapt: configs/adapt/


def test_ulmfit_pretraining_step_is_under_pretrain():
    cfg = yaml.safe_load((CONFIGS / "pretrain" / "minilm_ulmfit_lm_bbc.yaml").read_text())
    assert cfg["model"]["class_path"] == "MaskedLMModule"
    nxt = yaml.safe_load((CONFIGS / "adapt" / "minilm_ulmfit_classifier_bbc.yaml").read_text())
    assert nxt["model"]["init_args"]["init_from"]["path"] == "minilm_ulmfit_lm_bbc/checkpoints/last.ckpt"  # its run


def test_ptm_app_classes_are_named_short_and_resolve():
    """ptm_app classes short, third-party classes dotted; each short name is one of ptm_app's config classes (module
    classes and the targets the packages export, data modules, callbacks) or strategies."""
    from lightning.pytorch.strategies import Strategy

    from ptm_app.checkpoint_io.module_classes import config_classes
    from ptm_app.training import strategies

    known = set(config_classes()) | {n for n, c in vars(strategies).items()
                                                    if isinstance(c, type) and issubclass(c, Strategy)}
    names = [(p, c) for p in ALL for c in class_paths(yaml.safe_load(p.read_text()))]
    assert len(names) > 200
    for config, name in names:
        assert not name.startswith("ptm_app."), f"{config}: class_path {name}: write {name.rpartition('.')[2]}"
        assert "." in name or name in known, f"{config}: class_path {name} is not a ptm_app class"


def repository_texts():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if (name.endswith((".py", ".md", ".yaml")) or name == "Makefile") and (ROOT / name).is_file():
            yield name, (ROOT / name).read_text(encoding="utf-8")


def test_every_config_path_the_repository_names_exists():
    named = {(path, name) for name, text in repository_texts()
             for path in re.findall(r"(?<![\w/])configs/[\w/.-]+?\.yaml", text)}
    assert len(named) > 300
    missing = sorted(f"{name}: {path}" for path, name in named
                     if not (ROOT / path).is_file() and path not in MISSING_ON_PURPOSE)
    assert not missing, missing


def test_old_config_path_is_one_line_naming_the_new_one(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    for old, new in RENAMED_CONFIGS.items():
        assert not (CONFIGS / f"{old}.yaml").exists() and (CONFIGS / f"{new}.yaml").is_file(), old
    old = "configs/" + "finetune/bbc_minilm" + ".yaml"  # split: the path test above reads literal paths
    assert renamed_config(old) == "configs/adapt/minilm_full_bbc.yaml"
    assert renamed_config(f"/x/{old}") == "/x/configs/adapt/minilm_full_bbc.yaml"
    assert renamed_config("elsewhere/finetune/bbc_minilm.yaml") is None
    assert run_main(["fit", "--config", old, "--trainer.max_steps", "1"], tmp_path) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: config file {old} was renamed to configs/adapt/minilm_full_bbc.yaml; use that"]
    assert run_main(["probe", "--config=" + "configs/" + "analysis/probe_minilm" + ".yaml"], tmp_path) == 2
    assert "was renamed to configs/analysis/minilm_probe_linear_mix.yaml; use that" in capsys.readouterr().err


def test_sweep_plan_naming_an_old_config_is_one_line(tmp_path):
    from ptm_app.errors import PtmError
    from ptm_app.experiments.sweep import load_plan

    plan = tmp_path / "plan.yaml"
    old = "configs/" + "adapt/lora_tweets" + ".yaml"
    plan.write_text(yaml.safe_dump({"name": "p", "cells": [{"name": "lora", "config": old}]}))
    with pytest.raises(PtmError, match=r"cell lora: config configs/adapt/lora_tweets\.yaml was renamed to "
                                       r"configs/adapt/minilm_lora_tweets\.yaml; use that"):
        load_plan(plan)
