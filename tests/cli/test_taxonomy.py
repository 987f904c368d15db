"""The objective taxonomy (``taxonomy-report``, issue 28): the quick plan end to end on tiny models (its table's
numbers are the runs' metrics, its intervals ``stats.summarize`` of them, its FLOPs check holds, a second run
reruns nothing); the report's arithmetic on hand-written runs (paired tests, the 5 % FLOPs check failing, stale
fine-tunings left out, the figure); the shipped plans load; bad input is one line."""
import json
from pathlib import Path

import pytest
import yaml

from ptm_app.main import main
from tests.conftest import run_main

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "configs" / "sweeps" / "taxonomy_quick.yaml"
FULL = ROOT / "configs" / "sweeps" / "taxonomy.yaml"


def quick_plan(tmp_path: Path, corpus: Path, **change) -> Path:
    """The shipped quick plan on the tiny fixture corpus (pre-training text and the task's labelled texts), in
    fp32, with ``change`` over it."""
    plan = yaml.safe_load(QUICK.read_text())
    plan["corpus"] = str(corpus)
    plan["pretrain_set"]["trainer.precision"] = "32-true"
    plan["task_set"].update({"trainer.precision": "32-true", "data.init_args.source": str(corpus)})
    plan.update(change)
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    return path


def test_quick_plan_end_to_end(tmp_path, runs_dir, tiny_corpus, monkeypatch, capsys):
    """MLM and ELECTRA at the short budget and the floor, 2 pre-training seeds, 1 fine-tuning seed, on one task:
    every table number is a run's own, every interval stats.summarize of them, the FLOPs agree within 5 % and the
    report prints that check; a second run finds every cell done and runs none."""
    from ptm_app.experiments.stats import paired, summarize

    monkeypatch.chdir(ROOT)
    path = quick_plan(tmp_path, tiny_corpus, budgets={"short": 8.0e8}, finetune_seeds=[1])
    assert run_main(["taxonomy-report", str(path)], runs_dir) == 0
    out = capsys.readouterr().out
    report = json.loads((runs_dir / "taxonomy_quick" / "taxonomy.json").read_text())
    rows = {(r["id"], r["budget"]): r for r in report["rows"]}
    assert set(rows) == {("mlm", "short"), ("electra", "short"), ("none", "init")}
    for (oid, budget), row in rows.items():
        metrics, flops = [], []
        for seed in (1, 2):
            pre = json.loads((runs_dir / f"taxonomy_quick-{oid}-{budget}-p{seed}-pretrain" / "summary.json").read_text())
            flops.append(pre["train_flops"])
            run = runs_dir / f"taxonomy_quick-{oid}-{budget}-p{seed}-tweets-f1"
            metrics.append(json.loads((run / "summary.json").read_text())["metrics"]["test/acc"])
            exported = yaml.safe_load((run / "config.yaml").read_text())["model"]["init_args"]["backbone"]
            assert exported == str(runs_dir / f"taxonomy_quick-{oid}-{budget}-p{seed}-pretrain" / "export")
            if oid != "none":  # stopped by FLOPs: at or past the budget, by less than one step
                assert 8.0e8 <= pre["train_flops"] < 8.0e8 * 1.05 and pre["global_step"] > 20
            else:  # the floor: one step at learning rate 0
                assert pre["global_step"] == 1
        entry = row["tasks"]["tweets"]
        assert entry["values"] == {"p1/f1": metrics[0], "p2/f1": metrics[1]}
        s = summarize(metrics)
        assert (entry["mean"], entry["std"], entry["interval"]) == (s.mean, s.std, list(s.interval))
        assert (f"{s.mean:.4f} ± {s.std:.4f} [{s.interval[0]:.4f}, {s.interval[1]:.4f}] (2 pre-training seeds, "
                f"2 runs)") in out
        assert row["train_flops"] == pytest.approx(sum(flops) / 2)
    assert rows[("electra", "short")]["total_params"] > rows[("mlm", "short")]["total_params"]  # its generator
    check = report["flops_checks"][0]
    assert check["rows"] == 2 and check["agree"] and check["spread"] < 0.05
    assert f"a spread of {100 * check['spread']:.2f} % of the smallest; within 5 %: yes" in out
    vs_floor = rows[("mlm", "short")]["paired"]["floor"]["tweets"]
    p = paired(rows[("mlm", "short")]["tasks"]["tweets"]["values"].values(),
               rows[("none", "init")]["tasks"]["tweets"]["values"].values())
    assert (vs_floor["diff"], vs_floor["p_perm"]) == (p.diff.mean, p.p_perm)
    assert "tweets" in rows[("electra", "short")]["paired"]["baseline"]
    assert (runs_dir / "taxonomy_quick" / "taxonomy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    redo = runs_dir / "taxonomy_quick-electra-short-p2-tweets-f1" / "summary.json"
    redo.write_text(json.dumps({**json.loads(redo.read_text()), "metrics": {}}))  # as if killed before its test
    readme = tmp_path / "taxonomy.md"
    readme.write_text("# Taxonomy\n\n<!-- taxonomy_quick:start -->\n<!-- taxonomy_quick:end -->\n")
    assert run_main(["taxonomy-report", str(path), "--readme", str(readme)], runs_dir) == 0
    again = capsys.readouterr().out
    reran = [line.split(":")[0] for line in again.splitlines() if " exit " in line]
    assert reran == ["[12/12] electra/short/p2/tweets/f1"]  # seed-major: the last cell
    assert "| MLM (token) | short" in again  # only the unfinished cell ran again
    assert run_main(["taxonomy-report", str(path), "--collect_only"], runs_dir) == 0
    table = (runs_dir / "taxonomy_quick" / "taxonomy.md").read_text().rstrip()
    assert readme.read_text() == f"# Taxonomy\n\n<!-- taxonomy_quick:start -->\n{table}\n<!-- taxonomy_quick:end -->\n"
    figure = (runs_dir / "taxonomy_quick" / "taxonomy.png").read_bytes()  # the page's figure, beside it
    assert (tmp_path / "figures" / "taxonomy_quick.png").read_bytes() == figure
    # --ledger keeps every finished run's results (no weights); with the run directories gone, the same table
    import shutil

    ledger = tmp_path / "ledger"
    assert run_main(["taxonomy-report", str(path), "--collect_only", "--ledger", str(ledger)], runs_dir) == 0
    assert len(list(ledger.glob("taxonomy_quick-*.json"))) == 12
    shutil.rmtree(runs_dir)
    capsys.readouterr()
    assert run_main(["taxonomy-report", str(path), "--ledger", str(ledger)], runs_dir) == 0
    printed = capsys.readouterr().out
    assert "12 run(s) done before, restored from" in printed and " exit " not in printed  # nothing ran
    assert (runs_dir / "taxonomy_quick" / "taxonomy.md").read_text().rstrip() == table


def write_run(runs: Path, name: str, summary: dict, fingerprint: str) -> None:
    run = runs / name
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "cell.json").write_text(json.dumps({"fingerprint": fingerprint}))


def test_report_arithmetic_on_hand_written_runs(runs_dir, monkeypatch):
    """Three seeds each: ELECTRA 0.1 above MLM on every pair (significant), MLM 0.2 above the floor; ELECTRA's long
    budget overspent by 10 %: the check says NO and names it; a fine-tuning made from an earlier pre-training is
    left out, and so is one made by an earlier task_set; the figure has one line per pre-trained objective through
    its two budgets and the floor dashed."""
    from ptm_app.experiments.chain import current_runs
    from ptm_app.experiments.taxonomy import collect, draw, flops_checks, links, load_taxonomy_plan, markdown

    monkeypatch.chdir(ROOT)
    plan = load_taxonomy_plan(QUICK)
    plan["pretrain_seeds"], plan["finetune_seeds"] = [1, 2, 3], [1]
    current = current_runs(plan["name"], links(plan, plan["objectives"]))
    earlier = {**plan, "task_set": {**plan["task_set"], "trainer.max_steps": 60}}  # an earlier fine-tuning budget
    before = current_runs(plan["name"], links(earlier, plan["objectives"]))
    base = {"mlm": 0.5, "electra": 0.6, "none": 0.3}
    for oid, budgets in (("mlm", ("short", "long")), ("electra", ("short", "long")), ("none", ("init",))):
        for budget in budgets:
            for seed in (1, 2, 3):
                spent = {"short": 8.0e8, "long": 1.6e9 * (1.1 if oid == "electra" else 1.0), "init": 1.0e7}[budget]
                pre = f"taxonomy_quick-{oid}-{budget}-p{seed}-pretrain"
                write_run(runs_dir, pre, {"fit_seconds": 2.0, "train_flops": spent, "train_tokens": 100.0,
                                          "total_params": 7, "global_step": 3}, current[runs_dir / pre])
                value = base[oid] + 0.01 * seed + (0.05 if budget == "long" else 0.0)
                task = runs_dir / f"taxonomy_quick-{oid}-{budget}-p{seed}-tweets-f1"
                made_by = {("mlm", "short", 3): "0123456789abcdef",  # from an earlier pre-training
                           ("mlm", "short", 2): before[task]}.get((oid, budget, seed), current[task])
                write_run(runs_dir, task.name, {"metrics": {"test/acc": value}}, made_by)
    assert before[task] != current[task]
    rows = collect(plan)
    by = {(r["id"], r["budget"]): r for r in rows}
    assert by[("mlm", "short")]["tasks"]["tweets"]["values"] == {"p1/f1": 0.51}  # p2, p3: stale
    electra = by[("electra", "long")]["paired"]["baseline"]["tweets"]
    assert electra["diff"] == pytest.approx(0.1) and electra["significant"] and electra["pairs"] == ["p1", "p2", "p3"]
    assert by[("mlm", "long")]["paired"]["floor"]["tweets"]["diff"] == pytest.approx(0.25)
    assert "baseline" not in by[("mlm", "long")]["paired"]  # MLM is not compared with itself
    checks = {c["budget"]: c for c in flops_checks(plan, rows)}
    assert checks["short"]["agree"] and not checks["long"]["agree"]
    assert checks["long"]["spread"] == pytest.approx(0.1) and checks["long"]["outliers"] == ["RTD (ELECTRA, joint)"]
    text = markdown(plan, rows, list(checks.values()))
    assert "within 5 %: NO (RTD (ELECTRA, joint) spent more)" in text
    assert "- MLM (token), short: tweets has 1 of 3 runs" in text
    assert "| RTD (ELECTRA, joint) | long | +0.1000 [+0.1000, +0.1000] p=0.25 * |" in text
    fig = draw(plan, rows)
    ax = fig.axes[0]
    lines = {c.get_label(): c.lines[0] for c in ax.containers}  # one error-bar line per pre-trained objective
    assert set(lines) == {"MLM (token)", "RTD (ELECTRA, joint)"}
    assert list(lines["MLM (token)"].get_xdata()) == [8.0e8, 1.6e9]
    assert list(lines["RTD (ELECTRA, joint)"].get_ydata()) == pytest.approx([0.62, 0.67])
    floor = [line for line in ax.get_lines() if line.get_label() == "no pre-training"]
    assert floor[0].get_linestyle() == "--" and floor[0].get_ydata()[0] == pytest.approx(0.32)


def test_the_pre_training_seed_is_the_unit_of_the_intervals_and_the_paired_tests():
    """2 pre-training × 2 fine-tuning seeds: a cell is the mean ± std [t interval] of the two pre-training seeds'
    means (not of the four runs as if independent), the paired test pairs those means (n = 2), and one pre-training
    seed gives an observation and no paired test."""
    from ptm_app.experiments.stats import paired, summarize
    from ptm_app.experiments.taxonomy import _cell, by_pretraining_seed, compare

    mlm = {"p1/f1": 0.50, "p1/f2": 0.54, "p2/f1": 0.60, "p2/f2": 0.62}
    other = {"p1/f1": 0.70, "p1/f2": 0.70, "p2/f1": 0.66, "p2/f2": 0.70, "p3/f1": 0.9}  # p3: MLM has none
    assert by_pretraining_seed(mlm, other) == (["p1", "p2"], pytest.approx([0.52, 0.61]), pytest.approx([0.70, 0.68]))
    s = summarize([0.52, 0.61])
    entry = {"values": mlm, "n": s.n, "mean": s.mean, "std": s.std, "interval": list(s.interval)}
    assert _cell(entry) == f"0.5650 ± {s.std:.4f} [{s.interval[0]:.4f}, {s.interval[1]:.4f}] (2 pre-training seeds, 4 runs)"
    assert s.interval[1] - s.interval[0] > 1.0  # t(1 df) = 12.7 over 2 means; the 4 runs as if independent: ±0.087
    one = summarize([0.52])
    assert _cell({"values": {"p1/f1": 0.5, "p1/f2": 0.54}, "n": 1, "mean": one.mean, "std": 0.0, "interval": None}) \
        == "0.5200 (1 pre-training seed, 2 runs: an observation)"

    def row(oid, values, floor=False):
        return {"id": oid, "objective": oid, "budget": "init" if floor else "short", "floor": floor,
                "tasks": {"t": {"values": values}}}

    rows = [row("mlm", mlm), row("x", other), row("none", {"p1/f1": 0.3, "p1/f2": 0.3}, floor=True)]
    compare({"baseline": "mlm", "tasks": {"t": {}}}, rows)
    got = rows[1]["paired"]["baseline"]["t"]
    want = paired([0.70, 0.68], [0.52, 0.61])
    assert got["n"] == 2 and got["pairs"] == ["p1", "p2"] and got["runs"] == 4
    assert got["diff"] == pytest.approx(want.diff.mean) and got["interval"] == pytest.approx(list(want.diff.interval))
    assert "floor" not in rows[1]["paired"]  # the floor has one pre-training seed: no test


def test_the_shipped_plans_load_and_say_which_tasks_a_row_cannot_run(monkeypatch):
    """Both plans load; the full one has every objective family of the issue, the floor, 3 × 3 seeds, two budgets,
    the five tasks and the POS probe; ELMo's BiLSTM cannot run token tasks or QA, BART no tagging (transformers has
    no such model for their architectures), and the plan lists no cell for them; the frozen-feature probe runs on
    every row (an encoder-decoder gives its encoder's layers)."""
    from ptm_app.experiments.taxonomy import links, load_taxonomy_plan, why_not

    monkeypatch.chdir(ROOT)
    load_taxonomy_plan(QUICK)
    plan = load_taxonomy_plan(FULL)
    ids = [o["id"] for o in plan["objectives"]]
    assert {"mlm", "wwm", "span_sbo", "mlm_nsp", "mlm_sop", "electra", "unilm", "xlnet", "gpt", "elmo", "bart",
            "t5", "mass", "infoword", "none"} <= set(ids)
    assert len(plan["pretrain_seeds"]) >= 3 and len(plan["finetune_seeds"]) >= 3 and len(plan["budgets"]) == 2
    assert set(plan["tasks"]) == {"bbc", "tweets", "brown_pos", "wordnet_pairs", "wordnet_qa", "pos_probe"}
    elmo = next(o for o in plan["objectives"] if o["id"] == "elmo")
    bart = next(o for o in plan["objectives"] if o["id"] == "bart")
    assert "no token_classification model for ptm_bilstm_lm" in why_not(plan, elmo, "brown_pos")
    assert why_not(plan, elmo, "bbc") is None and why_not(plan, bart, "brown_pos") is not None
    assert why_not(plan, bart, "pos_probe") is None and why_not(plan, elmo, "pos_probe") is None
    assert why_not(plan, bart, "wordnet_qa") is None
    names = [link.cell["name"] for link in links(plan, [elmo])]
    assert "elmo/short/p1/bbc/f1" in names and not any("/brown_pos/" in n or "/wordnet_qa/" in n for n in names)
    firsts = [link.cell["name"] for link in links(plan, plan["objectives"]) if link.first]
    assert firsts[0] == "none/init/p1/pretrain" and firsts[1] == "mlm/short/p1/pretrain"  # seed-major: every
    assert firsts[:len(ids) * 2 - 1] == ["none/init/p1/pretrain", *[f"{i}/{b}/p1/pretrain" for b in plan["budgets"]
                                                                     for i in ids if i != "none"]]  # row at p1 first
    assert plan["task_set"]["trainer.max_steps"] == 150 and plan["task_set"]["model.init_args.optim.lr"] == 1e-3


@pytest.mark.parametrize("change, message", [
    ({"objectives": [{"id": "xlm", "pretrain": "configs/pretrain/xlm_tlm_bible.yaml"}]},
     "objective xlm: configs/pretrain/xlm_tlm_bible.yaml reads ParallelDataModule data, not the plan's corpus"),
    ({"pretrain_seeds": [1, "2"]}, "pretrain_seeds: '2' is not an integer seed"),
    ({"finetune_seeds": [1.5]}, "finetune_seeds: 1.5 is not an integer seed"),
    ({"budgets": {"short": "lots"}}, "budget short must be a positive number of training FLOPs (got 'lots')"),
    ({"baseline": "none"}, "baseline 'none' must be the id of a pre-trained objective"),
    ({"colour": 1}, "unknown keys: ['colour']"),
])
def test_a_bad_plan_is_one_line(change, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    plan = {**yaml.safe_load(QUICK.read_text()), **change}
    if "objectives" in change:
        plan["objectives"] = yaml.safe_load(QUICK.read_text())["objectives"] + change["objectives"]
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    assert main(["taxonomy-report", str(path), "--collect_only"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_budget_smaller_than_one_step_is_one_line_and_stops_the_plan(tmp_path, runs_dir, tiny_corpus, monkeypatch,
                                                                       capfd):
    monkeypatch.chdir(ROOT)
    path = quick_plan(tmp_path, tiny_corpus, budgets={"short": 1.0e3})
    assert run_main(["taxonomy-report", str(path), "--only", "mlm"], runs_dir) == 2
    err = [line for line in capfd.readouterr().err.splitlines() if line.startswith("error")]
    assert len(err) == 1 and "trainer.max_flops=1e+03 is smaller than one optimizer step" in err[0], err
    assert not (runs_dir / "taxonomy_quick-mlm-short-p2-pretrain").exists()  # the plan stopped at the first


@pytest.mark.slow
def test_every_row_of_the_full_plan_pretrains_exports_and_fine_tunes(tmp_path, runs_dir, tiny_corpus, monkeypatch,
                                                                     capsys):
    """Every objective of configs/sweeps/taxonomy.yaml with its shape and the shared tokenizer settings, 3 steps on
    the tiny corpus, exported and fine-tuned 2 steps on one sequence task from its export (2 minutes on a loaded 2-core machine)."""
    from ptm_app.experiments.chain import run_chain
    from ptm_app.experiments.taxonomy import links, load_taxonomy_plan

    monkeypatch.chdir(ROOT)
    plan = yaml.safe_load(FULL.read_text())
    plan.update({"name": "smoke", "corpus": str(tiny_corpus), "budgets": {"short": 1.0e15}, "pretrain_seeds": [1],
                 "finetune_seeds": [1], "tasks": {"tweets": plan["tasks"]["tweets"]}})
    plan["pretrain_set"].update({"trainer.precision": "32-true", "trainer.max_steps": 3,
                                 "trainer.limit_val_batches": 1})
    plan["pretrain_set"]["data.init_args.tokenizer"].update({"vocab_size": 300, "min_frequency": 1})
    plan["task_set"].update({"trainer.precision": "32-true", "data.init_args.source": str(tiny_corpus),
                             "trainer.max_steps": 2, "trainer.val_check_interval": 2, "trainer.limit_val_batches": 1,
                             "trainer.limit_test_batches": 1, "data.init_args.limit_train": 16})
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    plan = load_taxonomy_plan(path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PTM_RUNS_DIR", str(runs_dir))
        assert run_chain(plan["name"], links(plan, plan["objectives"]), "smoke") == []
    for objective in plan["objectives"]:
        assert (runs_dir / f"smoke-{objective['id']}-{'init' if objective.get('floor') else 'short'}-p1-pretrain"
                / "export" / "config.json").is_file(), objective["id"]
        run = runs_dir / f"smoke-{objective['id']}-{'init' if objective.get('floor') else 'short'}-p1-tweets-f1"
        assert "test/acc" in json.loads((run / "summary.json").read_text())["metrics"], objective["id"]
