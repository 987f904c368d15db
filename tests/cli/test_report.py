"""`main.py report` builds the results table from run directories (summary.json), never by hand."""
import csv
import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import TINY_BERT, run_main


def classifier_config(tiny_corpus, tmp_path, steps: int, val_every: int, val_batches: int):
    """A tiny BERT classifier on the fixture corpus, written to ``tmp_path/cls.yaml``."""
    cfg = {
        "seed_everything": 3,
        "trainer": {"max_steps": steps, "accelerator": "cpu", "val_check_interval": val_every,
                    "limit_val_batches": val_batches, "enable_progress_bar": False, "enable_model_summary": False,
                    "log_every_n_steps": 1},
        "model": {"class_path": "SequenceClassificationModule", "init_args": {"backbone_config": TINY_BERT}},
        "data": {"class_path": "TaskDataModule", "init_args": {
            "source": str(tiny_corpus), "batch_size": 8, "max_length": 32,
            "tokenizer": {"train": "wordpiece", "vocab_size": 100, "min_frequency": 1}}},
    }
    path = tmp_path / "cls.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_report_table_from_two_runs(tiny_corpus, tmp_path):
    path = classifier_config(tiny_corpus, tmp_path, steps=4, val_every=2, val_batches=2)
    runs = tmp_path / "runs"
    for name in ("a", "b"):
        assert run_main(["fit", "--config", str(path), "--run_name", name], runs) == 0
    assert run_main(["test", "--config", str(path), "--run_name", "a", "--ckpt_path", "best"], runs) == 0
    summary = json.loads((runs / "a" / "summary.json").read_text())
    assert summary["trainable_params"] == summary["total_params"] > 0 and summary["global_step"] == 4
    assert 0.0 <= summary["metrics"]["test/acc"] <= 1.0 and summary["fit_seconds"] > 0
    out = tmp_path / "results"
    assert run_main(["report", str(runs / "*"), "--output", str(out)], runs) == 0
    rows = list(csv.DictReader(open(out.with_suffix(".csv"))))
    assert [r["run"] for r in rows] == ["a", "b"]
    assert rows[0]["test/acc"] == f"{summary['metrics']['test/acc']:.4f}" and rows[1]["test/acc"] == ""
    assert "| a | full fine-tuning | SequenceClassificationModule | bert |" in out.with_suffix(".md").read_text()


def test_fit_seconds_survive_a_killed_session(tiny_corpus, tmp_path):
    """The training time is kept in the checkpoint: a run killed after its last checkpoint (so no summary
    was written) and resumed reports the earlier session's time up to that checkpoint plus its own."""
    import torch

    path = classifier_config(tiny_corpus, tmp_path, steps=4, val_every=2, val_batches=1)
    runs = tmp_path / "runs"
    assert run_main(["fit", "--config", str(path), "--run_name", "r", "--stop_at_step", "2"], runs) == 0
    ckpt = runs / "r" / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, weights_only=False)
    assert 0 < state["callbacks"]["RunSummary"]["fit_seconds"] < 600
    state["callbacks"]["RunSummary"]["fit_seconds"] = 1000.0  # as if the first session had trained 1000 s
    torch.save(state, ckpt)
    (runs / "r" / "summary.json").unlink()  # as if killed before on_fit_end
    assert run_main(["fit", "--config", str(path), "--run_name", "r", "--ckpt_path", "last"], runs) == 0
    summary = json.loads((runs / "r" / "summary.json").read_text())
    assert summary["global_step"] == 4 and 1000.0 < summary["fit_seconds"] < 1600.0


def test_sweep_runs_every_cell_once_and_writes_the_table(tiny_corpus, tmp_path, capsys):
    config = classifier_config(tiny_corpus, tmp_path, steps=3, val_every=3, val_batches=1)
    plan = {"name": "grid", "set": {"trainer.max_steps": 2},
            "cells": [{"name": "tiny/full", "config": str(config)},
                      {"name": "tiny/bitfit", "config": str(config), "set": {"model.init_args.delta": {"method": "bitfit"}}}]}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    runs = tmp_path / "runs"
    assert run_main(["sweep", str(path)], runs) == 0
    rows = {r["run"]: r for r in csv.DictReader(open(runs / "grid.csv"))}
    assert set(rows) == {"grid-tiny-full", "grid-tiny-bitfit"}
    assert rows["grid-tiny-full"]["style"] == "full fine-tuning" and rows["grid-tiny-bitfit"]["style"] == "bitfit"
    assert float(rows["grid-tiny-bitfit"]["trainable_percent"]) < float(rows["grid-tiny-full"]["trainable_percent"])
    assert all(r["test/acc"] for r in rows.values())
    assert json.loads((runs / "grid-tiny-full" / "summary.json").read_text())["global_step"] == 2  # the plan's set
    capsys.readouterr()
    assert run_main(["sweep", str(path)], runs) == 0  # done cells are skipped
    assert capsys.readouterr().out.count("done, skipped") == 2
    # a cell interrupted before its test resumes its fit from last.ckpt (nothing retrained), then tests
    summary_path = runs / "grid-tiny-bitfit" / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["metrics"] = {k: v for k, v in summary["metrics"].items() if not k.startswith("test/")}
    summary_path.write_text(json.dumps(summary))
    before = (runs / "grid-tiny-bitfit" / "checkpoints" / "last.ckpt").stat().st_mtime_ns
    assert run_main(["sweep", str(path)], runs) == 0
    assert capsys.readouterr().out.count("done, skipped") == 1
    after = json.loads(summary_path.read_text())
    assert after["global_step"] == 2 and "test/acc" in after["metrics"]
    assert (runs / "grid-tiny-bitfit" / "checkpoints" / "last.ckpt").stat().st_mtime_ns == before  # no new steps
    # a cell whose arguments changed is neither skipped nor resumed: it runs afresh, its old run kept aside
    plan["cells"][1]["set"]["trainer.max_steps"] = 3
    path.write_text(yaml.safe_dump(plan))
    assert run_main(["sweep", str(path), "--list"], runs) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].split()[:2] == ["tiny/full", "done"] and listed[1].split()[:2] == ["tiny/bitfit", "stale"]
    assert run_main(["sweep", str(path)], runs) == 0
    out = capsys.readouterr().out
    assert out.count("done, skipped") == 1 and "that run is kept as grid-tiny-bitfit.stale-1" in out
    assert json.loads(summary_path.read_text())["global_step"] == 3
    assert json.loads((runs / "grid-tiny-bitfit.stale-1" / "summary.json").read_text())["global_step"] == 2
    # a cell changed but not run again (--only another) is left out of the tables, in one line, not shown as current
    plan["cells"][0]["set"] = {"trainer.max_steps": 3}
    path.write_text(yaml.safe_dump(plan))
    assert run_main(["sweep", str(path), "--only", "tiny/bitfit"], runs) == 0
    out = capsys.readouterr().out
    assert "left out of the tables: 1 run(s) made by an earlier recipe of their cell (tiny/full)" in out
    assert {r["run"] for r in csv.DictReader(open(runs / "grid.csv"))} == {"grid-tiny-bitfit"}


def test_a_ledger_keeps_a_sweeps_results_when_its_run_directories_are_gone(tiny_corpus, tmp_path, capsys):
    """``--ledger``: a finished cell's results (no weights) outlive its run directory; the cell counts as done
    and stays in the table while its recipe is unchanged, and runs again once it changes."""
    import shutil

    config = classifier_config(tiny_corpus, tmp_path, steps=2, val_every=2, val_batches=1)
    plan = {"name": "grid", "set": {"trainer.max_steps": 2},
            "cells": [{"name": "tiny/full", "config": str(config)},
                      {"name": "tiny/bitfit", "config": str(config), "set": {"model.init_args.delta": {"method": "bitfit"}}}]}
    path, runs, ledger = tmp_path / "plan.yaml", tmp_path / "runs", tmp_path / "ledger"
    path.write_text(yaml.safe_dump(plan))
    assert run_main(["sweep", str(path), "--ledger", str(ledger)], runs) == 0
    entry = json.loads((ledger / "grid-tiny-full.json").read_text())
    summary = json.loads((runs / "grid-tiny-full" / "summary.json").read_text())
    assert entry["summary"] == summary and entry["fingerprint"] == json.loads(
        (runs / "grid-tiny-full" / "cell.json").read_text())["fingerprint"]
    assert entry["machine"] and len(entry["entered"]) == 10 and sorted(p.name for p in ledger.iterdir()) == [
        "grid-tiny-bitfit.json", "grid-tiny-full.json"]
    before = {r["run"]: r for r in csv.DictReader(open(runs / "grid.csv"))}
    shutil.rmtree(runs)  # the machine is gone; the ledger is what is left
    capsys.readouterr()
    assert run_main(["sweep", str(path), "--ledger", str(ledger), "--list"], runs) == 0
    assert [line.split()[1] for line in capsys.readouterr().out.splitlines()] == ["ledger", "ledger"]
    assert run_main(["sweep", str(path), "--ledger", str(ledger)], runs) == 0
    out = capsys.readouterr().out
    assert "2 cell(s) done before, restored from" in out and out.count("done, skipped") == 2
    assert {r["run"]: r for r in csv.DictReader(open(runs / "grid.csv"))} == before  # the same table, no refit
    assert not (runs / "grid-tiny-full" / "checkpoints").exists()
    from ptm_app.experiments.sweep import is_restored, write_entry

    assert is_restored(runs / "grid-tiny-full") and not write_entry(ledger, runs / "grid-tiny-full")  # a copy
    assert entry["machine"] == entry["summary"]["machine"]  # the machine its fit ran on
    # a changed cell's entry is not used: the cell runs, and its new entry replaces the old one
    plan["cells"][1]["set"]["trainer.max_steps"] = 3
    path.write_text(yaml.safe_dump(plan))
    shutil.rmtree(runs)
    assert run_main(["sweep", str(path), "--ledger", str(ledger)], runs) == 0
    out = capsys.readouterr().out
    assert "1 cell(s) done before, restored from" in out and out.count("done, skipped") == 1
    assert json.loads((ledger / "grid-tiny-bitfit.json").read_text())["summary"]["global_step"] == 3
    # an entry that is not one is one line naming it
    (ledger / "grid-tiny-full.json").write_text("{not json")
    shutil.rmtree(runs)
    assert run_main(["sweep", str(path), "--ledger", str(ledger)], runs) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "grid-tiny-full.json: not a readable ledger entry" in err[0], err


def test_a_plan_with_seeds_runs_each_cell_per_seed_and_reports_intervals(tiny_corpus, tmp_path, capsys):
    from ptm_app.experiments.stats import summarize

    config = classifier_config(tiny_corpus, tmp_path, steps=2, val_every=2, val_batches=1)
    plan = {"name": "s", "set": {"trainer.max_steps": 2}, "seeds": [1, 2],
            "cells": [{"name": "tiny/full", "config": str(config)}]}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    runs = tmp_path / "runs"
    page = tmp_path / "results.md"
    page.write_text("# results\n<!-- s:start -->\nold\n<!-- s:end -->\nafter\n")
    assert run_main(["sweep", str(path), "--readme", str(page)], runs) == 0
    written = page.read_text()
    assert "old" not in written and written.endswith("<!-- s:end -->\nafter\n")
    assert (runs / "s.md").read_text().strip() in written and (runs / "s_seeds.md").read_text().strip() in written
    assert written.index("Mean ± std") < written.index("| run |")  # the intervals first, then every run
    assert (tmp_path / "figures" / "s.png").read_bytes() == (runs / "s_seeds.png").read_bytes()
    accs = []
    for seed in (1, 2):
        cfg = yaml.safe_load((runs / f"s-tiny-full-seed{seed}" / "config.yaml").read_text())
        assert cfg["seed_everything"] == seed
        accs.append(json.loads((runs / f"s-tiny-full-seed{seed}" / "summary.json").read_text())["metrics"]["test/acc"])
    text = (runs / "s_seeds.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| tiny/full |"))
    cells = row.split(" | ")
    assert cells[1] == "2" and summarize(accs).text() in row
    plan["seeds"] = [1, "two"]
    path.write_text(yaml.safe_dump(plan))
    capsys.readouterr()
    assert run_main(["sweep", str(path)], runs) == 2
    assert "seeds: 'two' is not an integer seed" in capsys.readouterr().err


def test_a_cell_of_a_recipe_and_an_overlay_paired_against_a_baseline_cell(tiny_corpus, tmp_path, capsys):
    """A cell's config may be a list (a recipe, then an overlay: two --config, later wins key by key); baseline: a
    cell adds each other cell's paired difference from it, seed by seed; the console has no LightningCLI warning."""
    from ptm_app.experiments.stats import paired

    config = classifier_config(tiny_corpus, tmp_path, steps=2, val_every=2, val_batches=1)
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("model:\n  init_args:\n    optim: {lr: 0.3}\n")
    plan = {"name": "b", "set": {"trainer.max_steps": 2}, "seeds": [1, 2], "baseline": "base",
            "cells": [{"name": "base", "config": str(config)},
                      {"name": "hot", "config": [str(config), str(overlay)]}]}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    runs = tmp_path / "runs"
    assert run_main(["sweep", str(path)], runs) == 0
    out, err = capsys.readouterr()
    assert "LightningCLI's args parameter" not in out + err
    lrs = {cell: yaml.safe_load((runs / f"b-{cell}-seed1" / "config.yaml").read_text())["model"]["init_args"]["optim"]
           for cell in ("base", "hot")}
    assert lrs["hot"]["lr"] == 0.3 and lrs["base"]["lr"] != 0.3
    assert lrs["hot"]["warmup"] == lrs["base"]["warmup"]  # the rest of the recipe's optim kept
    loss = {(cell, seed): json.loads((runs / f"b-{cell}-seed{seed}" / "summary.json").read_text())["metrics"]
            ["val/loss"] for cell in ("base", "hot") for seed in (1, 2)}
    text = (runs / "b_seeds.md").read_text()
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("| cell | baseline | pairs |"))
    header, row = lines[at], next(line for line in lines[at:] if line.startswith("| hot | base | 2 |"))
    column = [c.strip() for c in header.strip("|").split("|")].index("val/loss")
    expected = paired([loss["hot", 1], loss["hot", 2]], [loss["base", 1], loss["base", 2]]).text()
    assert expected.startswith("+") and "[" in expected  # lr 0.3 raised the loss; two pairs give an interval
    assert [c.strip() for c in row.strip("|").split("|")][column] == expected
    plan["baseline"] = "nope"
    path.write_text(yaml.safe_dump(plan))
    assert run_main(["sweep", str(path)], runs) == 2
    assert "baseline 'nope' must be one of the cells (base, hot)" in capsys.readouterr().err
    plan["baseline"] = {"hot": "cold"}
    path.write_text(yaml.safe_dump(plan))
    assert run_main(["sweep", str(path)], runs) == 2
    assert "baseline 'cold' must be one of the cells (base, hot), or a mapping" in capsys.readouterr().err
    plan["baseline"] = {"hot": "base"}  # the same comparison as a mapping
    path.write_text(yaml.safe_dump(plan))
    assert run_main(["sweep", str(path)], runs) == 0
    assert next(line for line in (runs / "b_seeds.md").read_text().splitlines()
                if line.startswith("| hot | base | 2 |")) == row
    plan["cells"][1]["config"] = [str(config), str(tmp_path / "missing.yaml")]
    plan["baseline"] = "base"
    path.write_text(yaml.safe_dump(plan))
    assert run_main(["sweep", str(path)], runs) == 2
    assert f"cell hot: config {tmp_path / 'missing.yaml'} not found" in capsys.readouterr().err


def test_report_by_data_has_one_table_per_task_with_its_own_metrics(tmp_path):
    """``--by data --stages test``: a table per data set holding only the test metrics its runs have; the CSV
    keeps every run and metric in one table."""
    runs = tmp_path / "runs"
    summaries = {"cls-a": ("tweets", {"test/acc": 0.75, "val/acc": 0.7}),
                 "cls-b": ("tweets", {"test/acc": 0.5, "test/mcc": 0.1}),
                 "qa-a": ("wordnet_qa", {"test/em": 0.25, "test/f1": 0.5, "val/em": 0.2})}
    for name, (data, metrics) in summaries.items():
        (runs / name).mkdir(parents=True)
        (runs / name / "summary.json").write_text(json.dumps(
            {"style": "lora", "module": "M", "backbone": "minilm", "data": data, "trainable_params": 10,
             "trainable_percent": 0.00512, "last_ckpt_mb": 1.84, "fit_seconds": 207.5, "metrics": metrics}))
    out = tmp_path / "results"
    assert run_main(["report", str(runs / "*"), "--output", str(out), "--by", "data", "--stages", "test"], runs) == 0
    sections = out.with_suffix(".md").read_text().split("### data: ")[1:]
    assert [s.splitlines()[0] for s in sections] == ["tweets", "wordnet_qa"]
    tweets, qa = ([line for line in s.splitlines() if line.startswith("|")] for s in sections)
    assert tweets[0].split(" | ")[-2:] == ["test/acc", "test/mcc |"] and "data" not in tweets[0]
    assert qa[0].split(" | ")[-2:] == ["test/em", "test/f1 |"] and len(qa) == 3  # header, rule, one run
    assert tweets[3].startswith("| cls-b |") and tweets[3].endswith("| 0.5000 | 0.1000 |")
    assert "| 10 | 0.00512 | 1.8 | 208 |" in tweets[3]  # sizes and seconds to their own precision, metrics 4 places
    rows = list(csv.DictReader(open(out.with_suffix(".csv"))))
    assert [r["run"] for r in rows] == ["cls-a", "cls-b", "qa-a"]
    assert rows[0]["val/acc"] == "0.7000" and rows[2]["test/f1"] == "0.5000" and rows[0]["data"] == "tweets"


def test_a_cells_fingerprint_ignores_comments_but_not_settings(tmp_path):
    from ptm_app.experiments.sweep import cell_fingerprint

    config = tmp_path / "c.yaml"
    config.write_text("trainer: {max_steps: 2}\n")
    cell, plan = {"name": "c", "config": str(config)}, {"name": "p"}
    before = cell_fingerprint(plan, cell)
    config.write_text("# a note\ntrainer:\n  max_steps: 2   # the budget\n")
    assert cell_fingerprint(plan, cell) == before
    config.write_text("trainer: {max_steps: 3}\n")
    assert cell_fingerprint(plan, cell) != before
    assert cell_fingerprint(plan, cell, ["upstream"]) != cell_fingerprint(plan, cell)


def test_a_fingerprint_is_the_same_wherever_the_runs_folder_is(tmp_path, monkeypatch):
    """A cell starting from an export under the runs folder has one fingerprint whatever that folder's path (so a
    ledger's entries match on another machine); a run recorded under the earlier, path-bearing fingerprint is
    upgraded in place rather than made stale."""
    from ptm_app.experiments.sweep import cell_fingerprint, recipe_digest, override_args

    config = tmp_path / "c.yaml"
    config.write_text("trainer: {max_steps: 3}\n")
    prints = []
    for where in ("a", "b"):
        runs = tmp_path / where / "checkpoints"
        monkeypatch.setenv("PTM_RUNS_DIR", str(runs))
        cell = {"name": "t/full", "config": str(config),
                "set": {"model.init_args.backbone": str(runs / "p-pretrain" / "export"),
                        "data.init_args.tokenizer": json.dumps({"pretrained": str(runs / "p-pretrain" / "export")})}}
        prints.append(cell_fingerprint({"name": "g"}, cell, ["0123456789abcdef"]))
    assert prints[0] == prints[1]
    old = recipe_digest({"config": {"trainer": {"max_steps": 3}}, "args": override_args(cell["set"]), "fit": True,
                         "test_ckpt": None, "upstream": ["0123456789abcdef"]})
    assert old != prints[1]
    run = runs / "g-t-full"
    run.mkdir(parents=True)
    (run / "cell.json").write_text(json.dumps({"fingerprint": old, "cell": cell}))
    assert cell_fingerprint({"name": "g"}, cell, ["0123456789abcdef"]) == prints[1]
    assert json.loads((run / "cell.json").read_text())["fingerprint"] == prints[1]


def test_overrides_as_a_mapping_equal_the_old_argv_lists(tmp_path):
    """A plan's ``set`` mapping gives LightningCLI the words an old plan's ``common`` / ``args`` lists gave (so runs
    made from an old plan keep their fingerprints); a mapping value goes as YAML flow text that reads back the same."""
    from ptm_app.experiments.sweep import cell_fingerprint, load_plan, override_args

    config = tmp_path / "c.yaml"
    config.write_text("trainer: {max_steps: 2}\n")
    delta = {"method": "lora", "r": 8, "target_modules": ["query", "value"]}
    new = {"name": "p", "set": {"trainer.max_steps": 250, "trainer.check_val_every_n_epoch": None},
           "cells": [{"name": "c", "config": str(config), "set": {"model.init_args.delta": delta,
                                                                  "trainer.enable_progress_bar": False,
                                                                  "model.init_args.template": "{text} It was {mask}."}}]}
    old = {"name": "p", "common": ["--trainer.max_steps", "250", "--trainer.check_val_every_n_epoch", "null"],
           "cells": [{"name": "c", "config": str(config), "args": [
               "--model.init_args.delta", "{method: lora, r: 8, target_modules: [query, value]}",
               "--trainer.enable_progress_bar=false", "--model.init_args.template", "{text} It was {mask}."]}]}
    plans = []
    for name, plan in (("new", new), ("old", old)):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(plan, sort_keys=False))
        plans.append(load_plan(tmp_path / f"{name}.yaml"))
    words = [override_args(p["set"]) + override_args(p["cells"][0]["set"]) for p in plans]
    assert words[0] == words[1] == ["--trainer.max_steps", "250", "--trainer.check_val_every_n_epoch", "null",
                                    "--model.init_args.delta", "{method: lora, r: 8, target_modules: [query, value]}",
                                    "--trainer.enable_progress_bar", "false",
                                    "--model.init_args.template", "{text} It was {mask}."]
    assert yaml.safe_load(words[0][5]) == delta
    assert cell_fingerprint(plans[0], plans[0]["cells"][0]) == cell_fingerprint(plans[1], plans[1]["cells"][0])
    new["cells"][0]["set"]["model.init_args.delta"]["r"] = 16  # a changed override is a changed recipe
    (tmp_path / "new.yaml").write_text(yaml.safe_dump(new, sort_keys=False))
    changed = load_plan(tmp_path / "new.yaml")
    assert cell_fingerprint(changed, changed["cells"][0]) != cell_fingerprint(plans[1], plans[1]["cells"][0])


def test_the_shipped_sweep_plan_is_mappings(monkeypatch):
    """configs/sweeps/adapt_minilm.yaml: overrides as mappings, 3 seeds per cell, and every style of a task paired
    with full fine-tuning of that task."""
    from ptm_app.experiments.sweep import load_plan

    root = Path(__file__).resolve().parents[2]
    text = (root / "configs" / "sweeps" / "adapt_minilm.yaml").read_text()
    assert "- --" not in text and "common:" not in text and "args:" not in text
    monkeypatch.chdir(root)
    plan = load_plan("configs/sweeps/adapt_minilm.yaml")
    assert plan["set"]["trainer.max_steps"] == 250 and plan["set"]["trainer.check_val_every_n_epoch"] is None
    lora = next(c for c in plan["cells"] if c["name"] == "brown_pos/lora/seed2")
    assert lora["set"]["model.init_args.delta"]["target_modules"] == ["query", "value"]
    assert lora["set"]["model.init_args.optim.lr"] == 1e-3 and lora["set"]["seed_everything"] == 2
    bases = {c["base"] for c in plan["cells"]}
    assert len(plan["cells"]) == 3 * len(bases) == 114
    assert plan["baseline"] == {b: b.split("/")[0] + "/full" for b in bases
                                if b.split("/")[0] in ("tweets", "bbc", "brown_pos", "wordnet_qa") and b.split("/")[1] != "full"}


def test_the_benchmark_plan_pairs_each_lora_cell_with_full_fine_tuning_of_its_task(monkeypatch):
    """configs/sweeps/benchmarks_minilm.yaml: 8 cells x 3 seeds; every LoRA cell has the LoRA delta and is compared
    with its task's full fine-tuning; the SQuAD cells have their 250-step budget, LoRA ones included."""
    from ptm_app.experiments.sweep import load_plan

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    plan = load_plan("configs/sweeps/benchmarks_minilm.yaml")
    assert len(plan["cells"]) == 24 and plan["seeds"] == [1, 2, 3]
    assert plan["baseline"] == {f"{task}/lora": f"{task}/full" for task in ("wnut16", "openmoji", "squad", "squad2")}
    for cell in plan["cells"]:
        assert ("model.init_args.delta" in cell["set"]) == ("/lora/" in cell["name"])
        assert (cell["set"].get("trainer.max_steps") == 250) == cell["name"].startswith("squad")


def test_only_names_a_cell_with_or_without_its_seed(tmp_path, monkeypatch, capsys):
    """``--only squad/full`` selects the cell's three seeded runs, ``--only squad/full/seed2`` one of them, and a
    name that is no cell is one line."""
    from ptm_app.main import main

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PTM_RUNS_DIR", str(tmp_path))
    listed = {}
    for only in ("squad/full", "squad/full/seed2", "squad*/lora"):
        assert main(["sweep", "configs/sweeps/benchmarks_minilm.yaml", "--list", "true", "--only", only]) == 0
        listed[only] = [line.split()[0] for line in capsys.readouterr().out.splitlines() if "/seed" in line]
    assert listed == {"squad/full": [f"squad/full/seed{s}" for s in (1, 2, 3)], "squad/full/seed2": ["squad/full/seed2"],
                      "squad*/lora": [f"{t}/lora/seed{s}" for t in ("squad", "squad2") for s in (1, 2, 3)]}
    assert main(["sweep", "configs/sweeps/benchmarks_minilm.yaml", "--list", "true", "--only", "squad/nope"]) == 2
    assert "--only squad/nope matches no cell" in capsys.readouterr().err


def test_the_optimiser_plan_spends_the_same_sequences_on_both_cells(monkeypatch):
    """configs/sweeps/optim_lamb_brown.yaml: LAMB's cell is the recipe plus the LAMB overlay (8 accumulated batches)
    and takes 1/8 of AdamW's steps, so both see the same sequences; 3 seeds, paired against AdamW."""
    from ptm_app.experiments.sweep import config_files, load_plan

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    plan = load_plan("configs/sweeps/optim_lamb_brown.yaml")
    assert plan["baseline"] == "adamw_b32" and plan["seeds"] == [1, 2, 3] and len(plan["cells"]) == 6
    adamw, lamb = (next(c for c in plan["cells"] if c["base"] == name) for name in ("adamw_b32", "lamb_b256"))
    assert config_files(lamb) == ["configs/pretrain/bert_mlm_nsp_brown.yaml", "configs/optim/lamb_8x_batch.yaml"]
    overlay = yaml.safe_load(Path("configs/optim/lamb_8x_batch.yaml").read_text())
    recipe = yaml.safe_load(Path("configs/pretrain/bert_mlm_nsp_brown.yaml").read_text())
    batch = recipe["data"]["init_args"]["batch_size"]
    sequences = {"adamw": adamw["set"]["trainer.max_steps"] * batch,
                 "lamb": lamb["set"]["trainer.max_steps"] * batch * overlay["trainer"]["accumulate_grad_batches"]}
    assert sequences["adamw"] == sequences["lamb"] == 15360 and overlay["model"]["init_args"]["optim"]["name"] == "lamb"
    assert adamw["test_ckpt"] == lamb["test_ckpt"] == "last"  # both scored after the same sequences


@pytest.mark.parametrize("change, message", [
    ({"set": ["trainer.max_steps", 2]}, "'trainer.max_steps' is not '--key value'; write the overrides as a mapping"),
    ({"set": {"--trainer.max_steps": 2}}, "'set' maps config keys (without --) to values, e.g. set: {"),
    ({"set": {"trainer.max_steps": 2}, "common": ["--seed_everything", "1"]}, "give the overrides once, as 'set'"),
    ({"cells": ["configs/adapt/minilm_full_tweets.yaml"]}, "cell 1 is a str; each cell is a mapping"),
    ({"cells": [{"name": "c", "config": "CONFIG", "set": "lr=1"}]}, "cell c: 'set' maps config keys"),
    ({"cells": [{"name": "c", "config": "CONFIG", "args": ["--trainer.max_steps"]}]},
     "cell c: '--trainer.max_steps' is not '--key value'"),
])
def test_a_malformed_sweep_plan_is_one_line(change, message, tmp_path, capsys):
    from ptm_app.main import main

    config = tmp_path / "c.yaml"
    config.write_text("trainer: {max_steps: 2}\n")
    plan = {"name": "p", "cells": [{"name": "c", "config": str(config)}], **change}
    for cell in plan["cells"]:
        if isinstance(cell, dict) and cell.get("config") == "CONFIG":
            cell["config"] = str(config)
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    assert main(["sweep", str(path), "--list"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: sweep plan {path}") and message in err[0], err


def test_report_over_seeds_gives_each_cell_mean_std_and_interval(tiny_corpus, tmp_path, capsys):
    """Runs named alike but for ``seed<N>`` (as sweep names them) are one cell: the seeds table holds its mean ± std
    and 95 % t interval over the seeds each run recorded; one cell's two runs of one seed are refused in one line."""
    from ptm_app.experiments.stats import summarize

    path = classifier_config(tiny_corpus, tmp_path, steps=2, val_every=2, val_batches=1)
    runs = tmp_path / "runs"
    for name, seed in (("x-seed1", 1), ("x-seed2", 2), ("y", 4)):
        assert run_main(["fit", "--config", str(path), "--run_name", name, "--seed_everything", str(seed)], runs) == 0
    seeds = {d.name: json.loads((d / "summary.json").read_text())["seed"] for d in runs.iterdir()}
    assert seeds == {"x-seed1": 1, "x-seed2": 2, "y": 4}
    out = tmp_path / "results"
    assert run_main(["report", str(runs / "*"), "--output", str(out), "--over_seeds", "true"], runs) == 0
    table = (tmp_path / "results_seeds.md").read_text().splitlines()
    losses = [json.loads((runs / f"x-seed{i}" / "summary.json").read_text())["metrics"]["val/loss"] for i in (1, 2)]
    assert len(set(losses)) == 2  # two seeds, two different runs
    header = table[2].strip("|").split("|")
    x = dict(zip([h.strip() for h in header], [c.strip() for c in table[4].strip("|").split("|")]))
    assert x["cell"] == "x" and x["seeds"] == "2" and x["val/loss"] == summarize(losses).text()
    y = dict(zip([h.strip() for h in header], [c.strip() for c in table[5].strip("|").split("|")]))
    assert y["cell"] == "y" and y["seeds"] == "1"

    import shutil
    shutil.copytree(runs / "x-seed1", runs / "x-seed9")  # a copy: seed 1 again under another name
    capsys.readouterr()
    assert run_main(["report", str(runs / "*"), "--output", str(out), "--over_seeds", "true"], runs) == 2
    assert capsys.readouterr().err.strip() == ("error: runs x-seed1 and x-seed9 both ran seed 1: they are not seeds of "
                                               "one cell; rename one or leave it out of the report")


def test_seed_report_leaves_out_the_pairs_of_a_cell_not_run_yet(tmp_path):
    """A baseline mapping names every LoRA cell; one not run yet gets no row (was an empty row with 0 pairs), and a
    cell that ran keeps its paired difference."""
    from ptm_app.experiments.report import write_seed_report
    from ptm_app.experiments.stats import paired

    losses = {("full", 1): 0.50, ("full", 2): 0.40, ("lora", 1): 0.70, ("lora", 2): 0.65}
    for (cell, seed), loss in losses.items():
        run = tmp_path / f"p-{cell}-seed{seed}"
        run.mkdir()
        (run / "summary.json").write_text(json.dumps({"seed": seed, "metrics": {"test/loss": loss}}))
    groups = {cell: [str(tmp_path / f"p-{cell}-seed{s}") for s in (1, 2)] for cell in ("full", "lora")}
    md = write_seed_report(groups, tmp_path / "p_seeds", baseline={"lora": "full", "later/lora": "later/full"})
    lines = md.read_text().splitlines()
    assert not any(line.startswith("| later/lora |") for line in lines)
    row = next(line for line in lines if line.startswith("| lora | full | 2 |"))
    assert row.endswith(f"| {paired([0.70, 0.65], [0.50, 0.40]).text()} |")

    alone = write_seed_report({"lora": groups["lora"]}, tmp_path / "q_seeds", baseline={"lora": "full"})
    assert "Paired difference" not in alone.read_text()  # its baseline has not run: no table of empty pairs


def test_seed_figure_names_a_panel_without_metrics(tmp_path):
    """A data set whose runs logged no metric of the stages yet gets a panel that says so (was titled "None")."""
    from ptm_app.experiments.report import collect, draw_seeds

    run = tmp_path / "p-a-seed1"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"seed": 1, "data": "tweets", "metrics": {"train/loss": 0.3}}))
    fig = draw_seeds({"a": collect([str(run)])}, {"tweets": ["a"]}, ("test/",), by="data")
    assert [ax.get_title() for ax in fig.axes] == ["tweets: no metric logged"]


def test_seed_report_by_data_gives_each_data_set_its_own_columns_pairs_and_panel(tmp_path):
    """``by="data"`` (as ``sweep`` calls it): one seeds table per data set with only its metrics (a QA set has no
    acc column), each style paired with its own set's baseline; the figure has one panel per set, on the set's
    headline metric (``headline_metric``)."""
    from ptm_app.experiments.report import headline_metric, write_seed_report
    from ptm_app.experiments.stats import paired

    scores = {("tweets", "full"): (0.75, 0.74, 0.76), ("tweets", "lora"): (0.71, 0.70, 0.73),
              ("qa", "full"): (0.85, 0.84, 0.86), ("qa", "lora"): (0.72, 0.75, 0.70)}
    groups = {}
    for (data, style), values in scores.items():
        metric = "test/acc" if data == "tweets" else "test/em"
        for seed, value in enumerate(values, 1):
            run = tmp_path / f"p-{data}-{style}-seed{seed}"
            run.mkdir()
            (run / "summary.json").write_text(json.dumps({"seed": seed, "data": data,
                                                          "metrics": {metric: value, "test/loss": 1 - value}}))
            groups.setdefault(f"{data}/{style}", []).append(str(run))
    md = write_seed_report(groups, tmp_path / "p_seeds", baseline={"tweets/lora": "tweets/full", "qa/lora": "qa/full"},
                           by="data")
    text = md.read_text()
    tweets, qa = text.split("### data: tweets\n")[1].split("### data: qa\n")
    assert tweets.splitlines()[1] == "| cell | seeds | test/acc | test/loss |"
    assert qa.splitlines()[1] == "| cell | seeds | test/em | test/loss |"
    row = next(line for line in qa.splitlines() if line.startswith("| qa/lora | qa/full | 3 |"))
    assert row.split(" | ")[3] == paired(scores["qa", "lora"], scores["qa", "full"]).text()
    assert "tweets/lora" not in qa and "qa/lora" not in tweets
    assert md.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert headline_metric(["test/em", "test/f1", "test/loss"]) == "test/em"
    assert headline_metric(["test/bbc/acc", "test/macro", "test/tweets/acc"]) == "test/macro"
    assert headline_metric(["test/bleu", "test/chrf", "test/loss", "test/rougeL"]) == "test/rougeL"
    assert headline_metric(["test/loss", "test/perplexity"]) == "test/perplexity"
