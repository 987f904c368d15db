"""BLEU and chrF through sacreBLEU (accumulated over batches = one corpus score), the seed interval, and the
translation report's plan checks and table (from runs on disk, nothing trained)."""
import json
import math
from pathlib import Path

import pytest
import yaml

from ptm_app.errors import PtmError
from ptm_app.experiments.sweep import cell_fingerprint, record_cell, run_name
from ptm_app.experiments.translation_report import (collect, finetune_cell, fit_plan, load_translation_plan,
                                                    pretrain_cell, score_predictions, seed_mean_interval,
                                                    translation_report)
from ptm_app.task_kinds.metrics import GenerationScores, SacreScore

ROOT = Path(__file__).resolve().parents[2]
HYPS = ["En el principio creó Dios los cielos y la tierra.", "Y la tierra estaba desordenada y vacía,",
        "y dijo Dios: Sea la luz", "Y vió Dios que la luz era buena"]
REFS = ["EN el principio crió Dios los cielos y la tierra.", "Y la tierra estaba desordenada y vacía, y las tinieblas",
        "Y dijo Dios: Sea la luz: y fué la luz.", "Y vió Dios que la luz era buena: y apartó Dios la luz"]


def test_batched_sacrebleu_scores_equal_one_corpus_score():
    import sacrebleu

    for name, reference in (("bleu", sacrebleu.corpus_bleu(HYPS, [REFS])),
                            ("chrf", sacrebleu.corpus_chrf(HYPS, [REFS]))):
        metric = SacreScore(name)
        metric.update(HYPS[:1], REFS[:1])
        metric.update(HYPS[1:], REFS[1:])  # two batches
        assert float(metric.compute()) == pytest.approx(reference.score / 100, abs=1e-6), name
        assert 0.05 < float(metric.compute()) < 0.95
    cased, lowered = GenerationScores(bleu_lowercase=False), GenerationScores()
    for scores in (cased, lowered):
        scores.update(HYPS, REFS)
    assert float(lowered.compute()["bleu"]) > float(cased.compute()["bleu"])  # "EN" vs "En"
    assert float(lowered.compute()["chrf"]) == float(cased.compute()["chrf"])  # chrF: cased in both


def test_seed_mean_interval_is_a_student_t_interval():
    mean, half = seed_mean_interval([20.0, 22.0])
    assert mean == 21.0 and half == pytest.approx(12.706 * math.sqrt(2.0) / math.sqrt(2), abs=1e-3)
    mean, half = seed_mean_interval([1.0, 2.0, 3.0])
    assert half == pytest.approx(4.303 * 1.0 / math.sqrt(3), abs=1e-3)
    assert seed_mean_interval([5.0]) == (5.0, None)  # one seed: an observation, no interval


def write_plan(tmp_path: Path, **changes) -> Path:
    plan = yaml.safe_load((ROOT / "configs" / "sweeps" / "translation_bible.yaml").read_text())
    plan["pretrain"]["config"] = str(ROOT / plan["pretrain"]["config"])
    for row in plan["rows"]:
        row["config"] = str(ROOT / row["config"])
    plan.update(changes)
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    return path


def test_plan_is_checked_in_one_line(tmp_path):
    plan = load_translation_plan(write_plan(tmp_path))
    assert plan["seeds"] == [1, 2] and [r["id"] for r in plan["rows"]] == ["mbart", "random"]
    for bad, match in (({"seeds": []}, "'seeds' is a list"), ({"seeds": [1, 1]}, "'seeds' is a list"),
                       ({"rows": [{"id": "a", "config": "nowhere.yaml"}]}, "config nowhere.yaml not found"),
                       ({"extra": 1}, "needs 'name', 'pretrain', 'rows' and 'seeds'"),
                       ({"bootstrap": 1}, "'bootstrap' is the number of resamples")):
        with pytest.raises(PtmError, match=match):
            load_translation_plan(write_plan(tmp_path, **bad))
    with pytest.raises(PtmError, match="not found"):
        load_translation_plan(tmp_path / "missing.yaml")


def made_runs(tmp_path: Path, monkeypatch) -> Path:
    """A plan whose pre-training is recorded, its mbart row predicted with seeds 1 and 2 (seed 2's first verse
    worse) and its random row's seed 1 made from another pre-training (stale); the plan's path."""
    monkeypatch.setenv("PTM_RUNS_DIR", str(tmp_path / "runs"))
    path = write_plan(tmp_path)
    plan = load_translation_plan(path)
    sweep = fit_plan(plan)
    pre = pretrain_cell(plan)
    pre_run = tmp_path / "runs" / run_name(sweep, pre)
    record_cell(pre_run, cell_fingerprint(sweep, pre), pre)
    upstream = [cell_fingerprint(sweep, pre)]
    rows = [{"id": str(i), "generated": h, "target": r} for i, (h, r) in enumerate(zip(HYPS, REFS))]
    for seed, shift in ((1, 0), (2, 1)):  # seed 2 gets a worse first translation
        cell = finetune_cell(plan, plan["rows"][0], seed, pre_run / "export")
        run = tmp_path / "runs" / run_name(sweep, cell)
        record_cell(run, cell_fingerprint(sweep, cell, upstream), cell, upstream)
        changed = [dict(r, generated="nada") if shift and i == 0 else r for i, r in enumerate(rows)]
        (run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in changed))
    stale = finetune_cell(plan, plan["rows"][1], 1, pre_run / "export")  # made from another pre-training
    stale_run = tmp_path / "runs" / run_name(sweep, stale)
    record_cell(stale_run, "x", stale, ["older"])
    (stale_run / "predictions.jsonl").write_text(json.dumps(rows[0]) + "\n")
    return path


def test_report_scores_predictions_per_seed_and_leaves_out_stale_runs(tmp_path, monkeypatch):
    path = made_runs(tmp_path, monkeypatch)
    plan = load_translation_plan(path)
    sweep, pre_run = fit_plan(plan), tmp_path / "runs" / run_name(fit_plan(plan), pretrain_cell(plan))
    table, sources = collect(plan)
    assert [r["model"] for r in table] == ["mBART pre-trained"]  # the stale random-init run is left out
    scores = [sources["mbart"][s]["bleu"] for s in (1, 2)]
    direct = score_predictions(tmp_path / "runs" / run_name(sweep, finetune_cell(plan, plan["rows"][0], 1,
                                                                                pre_run / "export")) /
                               "predictions.jsonl", 100)
    assert direct["bleu"] == pytest.approx(scores[0]) and direct["verses"] == 4 and direct["bleu_ci"] > 0
    assert scores[1] < scores[0]
    mean, half = seed_mean_interval(scores)
    assert table[0]["BLEU"] == f"{mean:.2f} ± {half:.2f}" and table[0]["seeds"] == 2

    readme = tmp_path / "translation.md"
    readme.write_text("# t\n<!-- translation_bible:start -->\nold\n<!-- translation_bible:end -->\ntail\n")
    assert translation_report(str(path), collect_only=True, readme=str(readme)) == 0
    text = readme.read_text()
    assert "old" not in text and "mBART pre-trained" in text and text.endswith("tail\n") and "nrefs:1" in text
    with pytest.raises(PtmError, match="no '<!-- translation_bible:start -->'"):
        translation_report(str(path), collect_only=True, readme=str(tmp_path / "plan.yaml"))


def test_a_ledger_keeps_the_current_scores_and_a_run_gone_counts_as_done(tmp_path, monkeypatch, capsys):
    """--ledger: the current runs' scores go to DIR/scores.json (the stale run's never); with the runs directory
    gone the table is the same from the entries, nothing runs (not even the pre-training), and an entry of another
    recipe or bootstrap count does not count."""
    from ptm_app.experiments.translation_report import SCORES_FILE, kept_scores, run_translation_plan

    path = made_runs(tmp_path, monkeypatch)
    plan, ledger, readme = load_translation_plan(path), tmp_path / "ledger", tmp_path / "translation.md"
    readme.write_text("<!-- translation_bible:start -->\n<!-- translation_bible:end -->\n")
    assert translation_report(str(path), collect_only=True, readme=str(readme), ledger=str(ledger)) == 0
    entries = json.loads((ledger / SCORES_FILE).read_text())
    assert sorted(entries) == ["mbart-seed1", "mbart-seed2"]  # random-seed1 was made from another pre-training
    assert entries["mbart-seed1"]["bootstrap"] == 1000 and entries["mbart-seed2"]["bleu"] < entries["mbart-seed1"]["bleu"]
    table = readme.read_text()
    kept = kept_scores(plan, ledger)
    sources = collect(plan, kept)[1]["mbart"]
    assert sources[1]["run"] != "ledger" and sources[2]["run"] != "ledger"  # current runs on disk are scored
    seed1 = Path(sources[1]["run"]) / "cell.json"
    seed1.write_text(json.dumps({**json.loads(seed1.read_text()), "fingerprint": "an older recipe"}))
    assert collect(plan, kept)[1]["mbart"][1]["run"] == "ledger"  # a run older than the kept entry: the entry

    (tmp_path / "runs").rename(tmp_path / "gone")
    assert collect(plan)[0] == []  # without the ledger: no runs, no rows
    kept = kept_scores(plan, ledger)
    assert sorted(kept) == ["mbart-seed1", "mbart-seed2"]
    assert run_translation_plan(plan, ["mbart"], kept) == []  # all kept: nothing runs, the pre-training neither
    assert "mbart-seed2: kept in the ledger, skipped" in capsys.readouterr().out
    assert not (tmp_path / "runs").exists()
    assert translation_report(str(path), collect_only=True, readme=str(readme), ledger=str(ledger)) == 0
    assert readme.read_text() == table  # the same table from the entries
    assert json.loads((ledger / SCORES_FILE).read_text()) == entries  # entries are not rewritten from themselves

    stale = {**entries, "mbart-seed1": {**entries["mbart-seed1"], "fingerprint": "0123456789abcdef"}}
    (ledger / SCORES_FILE).write_text(json.dumps(stale))
    assert sorted(kept_scores(plan, ledger)) == ["mbart-seed2"]
    assert sorted(kept_scores({**plan, "bootstrap": 500}, ledger)) == []
    assert sorted(kept_scores({**plan, "set": {**plan["set"], "trainer.max_steps": 7}}, ledger)) == []
