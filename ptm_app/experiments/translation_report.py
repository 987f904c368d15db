"""``python main.py translation-report PLAN.yaml [--collect_only] [--readme docs/results/translation.md]``: machine
translation from an mBART pre-training against the same model from random init (Qiu et al. 2020 §7.5; Liu et al.
2020 §3.1), scored by sacreBLEU on the held-out books, from the runs, never typed.

A plan (``configs/sweeps/translation_bible.yaml``) names the pre-training (``pretrain``: a config and its overrides),
the fine-tuning ``rows`` (a config each; ``pretrained: true`` starts from the pre-training's export), the ``seeds``
every row is fine-tuned with and the overrides all fine-tunings share (``set``).  Every run is a sweep cell
(``sweep.run_cell``: run directory ``<plan>-<cell>``, resumed from ``last.ckpt`` when interrupted, recorded in
``cell.json``); the pre-training is exported once to ``<run>/export``, whose tokenizer every row reads (the rows differ
in their weights alone).  Each fine-tuning then ``predict``s the test split from ``last.ckpt`` (greedy translations,
``predictions.jsonl``), skipped when the predictions are there and the cell's recipe and pre-training are unchanged.

The table scores every row's predictions with sacreBLEU (``task_kinds.metrics.sacrebleu_metric``: cased BLEU, 13a,
and chrF2): per seed the corpus score and its 95 % bootstrap interval over test verses (sacreBLEU's
``n_bootstrap``, Koehn 2004), per row the mean over seeds and a 95 % Student-t interval across seeds
(``seed_mean_interval``; with one seed there is none: one seed is an observation).

With ``--ledger DIR`` every current fine-tuning's scores are kept in ``DIR/scores.json`` (one entry per cell: the
run's recipe fingerprint, the bootstrap count and the scores; no weights, no predictions), and a cell whose entry is
current counts as done when its run directory is gone: it is not run again (nor the pre-training, when nothing left
to run starts from it) and the table takes its scores from the entry, so a plan longer than one machine's life is
finished in parts, as ``sweep --ledger`` does.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from ptm_app.errors import read_yaml
from ptm_app.errors import PtmError
from ptm_app.experiments.sweep import (cell_fingerprint, cell_record, override_args, overrides, record_cell,
                                       recorded_fingerprint, run_cell, run_name)
from ptm_app.paths import check_run_name, require_markers, runs_root, write_json

PLAN_KEYS = {"name", "pretrain", "set", "seeds", "rows", "bootstrap"}
SCORES_FILE = "scores.json"  # a ledger's kept scores: cell name -> its recipe fingerprint, bootstrap count, scores
ROW_KEYS = {"id", "label", "config", "pretrained"}


def seed_mean_interval(values: list[float]) -> tuple[float, Optional[float]]:
    """Mean over seeds and the half-width of its 95 % Student-t interval (``experiments.stats.summarize``); None for
    a single seed (an observation)."""
    from ptm_app.experiments.stats import summarize

    summary = summarize(values)
    return summary.mean, None if summary.interval is None else (summary.interval[1] - summary.interval[0]) / 2


def load_translation_plan(path: str | Path) -> dict:
    """The plan, checked: its configs exist, row ids are plain unique names, seeds are integers."""
    path = Path(path)
    if not path.is_file():
        raise PtmError(f"translation plan {path} not found; give a YAML file like "
                       f"configs/sweeps/translation_bible.yaml")
    plan = read_yaml(path) or {}
    if not isinstance(plan, dict) or set(plan) - PLAN_KEYS or not {"name", "pretrain", "rows", "seeds"} <= set(plan):
        raise PtmError(f"translation plan {path}: needs 'name', 'pretrain', 'rows' and 'seeds' (optional 'set', "
                       f"'bootstrap'); see configs/sweeps/translation_bible.yaml")
    check_run_name(plan["name"], f"translation plan {path}: name")
    plan["set"] = overrides(plan.get("set"), f"translation plan {path}")
    pre = plan["pretrain"]
    if not isinstance(pre, dict) or set(pre) - {"config", "set"} or "config" not in pre:
        raise PtmError(f"translation plan {path}: 'pretrain' takes 'config' and 'set'")
    pre["set"] = overrides(pre.get("set"), f"translation plan {path}", "pretrain.set")
    seeds = plan["seeds"]
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool)
                                                          for s in seeds) or len(set(seeds)) != len(seeds):
        raise PtmError(f"translation plan {path}: 'seeds' is a list of different integers, e.g. [1, 2, 3]")
    rows = plan["rows"]
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise PtmError(f"translation plan {path}: 'rows' is a list of {{id, label, config, pretrained}}")
    for row in rows:
        if set(row) - ROW_KEYS or not {"id", "config"} <= set(row):
            raise PtmError(f"translation plan {path}: row {row.get('id', '?')} takes {', '.join(sorted(ROW_KEYS))} "
                           f"('id' and 'config' required)")
        check_run_name(str(row["id"]), f"translation plan {path}: row id")
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise PtmError(f"translation plan {path}: row ids repeat ({', '.join(map(str, ids))})")
    for config in [pre["config"], *(r["config"] for r in rows)]:
        if not Path(config).is_file():
            raise PtmError(f"translation plan {path}: config {config} not found")
    bootstrap = plan.setdefault("bootstrap", 1000)
    if not isinstance(bootstrap, int) or isinstance(bootstrap, bool) or bootstrap < 2:
        raise PtmError(f"translation plan {path}: 'bootstrap' is the number of resamples (at least 2), e.g. 1000")
    return plan


def pretrain_cell(plan: dict) -> dict:
    return {"name": "pretrain", "config": plan["pretrain"]["config"], "set": plan["pretrain"]["set"]}


def finetune_cell(plan: dict, row: dict, seed: int, export: Path) -> dict:
    """The row's fine-tuning with ``seed``: the plan's overrides, the export's tokenizer (and weights if
    ``pretrained``)."""
    given = {**plan["set"], "seed_everything": seed, "data.init_args.tokenizer": {"pretrained": str(export)}}
    if row.get("pretrained"):
        given["model.init_args.backbone"] = str(export)
    return {"name": f"{row['id']}-seed{seed}", "config": row["config"], "set": given}


def fit_plan(plan: dict) -> dict:
    """The sweep plan the cells run under: fit only (the test split is predicted, then scored here)."""
    return {"name": plan["name"], "set": {}, "test": False}


def planned_fingerprints(plan: dict) -> dict[str, str]:
    """Fine-tuning cell name -> the fingerprint of the run the plan makes there now (from the pre-training it makes
    now): what a kept score must have been made by to count."""
    sweep, pre = fit_plan(plan), pretrain_cell(plan)
    export, upstream = runs_root() / run_name(sweep, pre) / "export", [cell_fingerprint(sweep, pre)]
    return {cell["name"]: cell_fingerprint(sweep, cell, upstream)
            for cell in (finetune_cell(plan, row, seed, export) for seed in plan["seeds"] for row in plan["rows"])}


def kept_scores(plan: dict, ledger: Optional[Path]) -> dict[str, dict]:
    """The ledger's current entries (``SCORES_FILE``: made by the recipe the plan makes now, scored with the plan's
    bootstrap count), by cell name; none without a ledger."""
    path = None if ledger is None else ledger / SCORES_FILE
    if path is None or not path.is_file():
        return {}
    from ptm_app.paths import read_object

    planned = planned_fingerprints(plan)
    return {name: entry for name, entry in read_object(path).items()
            if isinstance(entry, dict) and name in planned and entry.get("fingerprint") == planned[name]
            and entry.get("bootstrap") == plan["bootstrap"]}


def keep_scores(plan: dict, sources: dict, ledger: Path) -> int:
    """Put the scores of every run on disk that the plan makes now into ``ledger/SCORES_FILE`` (a stale run's never);
    the ledger's other entries stay.  Returns how many entries changed."""
    from ptm_app.paths import read_object

    planned, path = planned_fingerprints(plan), ledger / SCORES_FILE
    old = read_object(path) if path.is_file() else {}
    new = dict(old)
    for row, seeds in sources.items():
        for seed, scores in seeds.items():
            name = f"{row}-seed{seed}"
            if scores["run"] != "ledger" and recorded_fingerprint(Path(scores["run"])) == planned[name]:
                new[name] = {**{k: v for k, v in scores.items() if k != "run"}, "fingerprint": planned[name],
                             "bootstrap": plan["bootstrap"]}
    changed = sum(new[name] != old.get(name) for name in new)
    if changed:
        ledger.mkdir(parents=True, exist_ok=True)
        write_json(path, new)
    return changed


def run_translation_plan(plan: dict, only: Optional[list[str]] = None, kept: Optional[dict] = None) -> list[str]:
    """Pre-train, export, fine-tune every row and seed, predict the test split; the failed cells' names.  A cell
    with a current ``kept`` score (``kept_scores``) is done; the pre-training runs only when a cell is left."""
    from ptm_app.training.cli import run_lightning
    from ptm_app.errors import guarded
    from ptm_app.experiments.knowledge_report import export_once

    kept = kept or {}
    todo = []
    for seed in plan["seeds"]:  # every row's first seed before a second
        for row in plan["rows"]:
            if only and row["id"] not in only:
                continue
            if f"{row['id']}-seed{seed}" in kept:
                print(f"{row['id']}-seed{seed}: kept in the ledger, skipped", flush=True)
            else:
                todo.append((seed, row))
    if not todo:
        return []
    sweep = fit_plan(plan)
    pre = pretrain_cell(plan)
    pre_run, fingerprint = runs_root() / run_name(sweep, pre), cell_fingerprint(sweep, pre)
    if (pre_run / "export" / "config.json").is_file() and recorded_fingerprint(pre_run) in (None, fingerprint):
        record_cell(pre_run, fingerprint, pre)  # exported already (a run made by hand is adopted as it is)
    elif run_cell(sweep, pre):
        return ["pretrain"]
    export = export_once(pre_run)
    upstream = [recorded_fingerprint(pre_run) or ""]
    failed = []
    for seed, row in todo:
        cell = finetune_cell(plan, row, seed, export)
        run = runs_root() / run_name(sweep, cell)
        current = recorded_fingerprint(run) == cell_fingerprint(sweep, cell, upstream)
        if current and cell_record(run).get("upstream") == upstream and (run / "predictions.jsonl").is_file():
            print(f"{cell['name']}: done, skipped", flush=True)
            continue
        code = run_cell(sweep, cell, upstream=upstream)
        if not code:
            argv = ["predict", "--config", cell["config"], *override_args(cell["set"]), "--run_name",
                    run_name(sweep, cell), "--ckpt_path", "last"]
            code = guarded(run_lightning, argv)
        if code:
            failed.append(cell["name"])
    return failed


def score_predictions(path: Path, bootstrap: int) -> dict:
    """sacreBLEU BLEU and chrF of ``predictions.jsonl`` (``generated`` against ``target``), each with its 95 %
    bootstrap interval over the verses (Koehn 2004; sacreBLEU's ``n_bootstrap``)."""
    from ptm_app.task_kinds.metrics import sacrebleu_metric

    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not rows:
        raise PtmError(f"{path} holds no predictions; run the cell's predict again")
    hyps, refs = [r["generated"] for r in rows], [r["target"] for r in rows]
    out = {"verses": len(rows)}
    for name in ("bleu", "chrf"):
        metric = sacrebleu_metric(name)
        score = metric.corpus_score(hyps, [refs])
        sampled = metric.corpus_score(hyps, [refs], n_bootstrap=bootstrap)
        out[name], out[f"{name}_ci"] = float(score.score), float(sampled._ci)
        out[f"{name}_signature"] = str(metric.get_signature())
    return out


def _cell(mean: float, half: Optional[float]) -> str:
    return f"{mean:.2f}" if half is None else f"{mean:.2f} ± {half:.2f}"


def collect(plan: dict, kept: Optional[dict] = None) -> tuple[list[dict], dict]:
    """Table rows (one per plan row with predictions) and, per row, the runs and per-seed scores behind them.  A
    run made from an earlier pre-training than the one there is left out (stale); a seed with no run on disk, or
    one made by an older recipe than its ``kept`` entry's (``kept_scores``: current), takes the entry's scores (run
    ``"ledger"``)."""
    kept = kept or {}
    sweep = fit_plan(plan)
    pre_run = runs_root() / run_name(sweep, pretrain_cell(plan))
    upstream = [recorded_fingerprint(pre_run) or ""]
    table, sources = [], {}
    for row in plan["rows"]:
        seeds = {}
        for seed in plan["seeds"]:
            run = runs_root() / run_name(sweep, finetune_cell(plan, row, seed, pre_run / "export"))
            predictions = run / "predictions.jsonl"
            entry = kept.get(f"{row['id']}-seed{seed}")
            on_disk = predictions.is_file() and cell_record(run).get("upstream") == upstream
            if on_disk and (entry is None or recorded_fingerprint(run) == entry["fingerprint"]):
                seeds[seed] = {"run": str(run), **score_predictions(predictions, plan["bootstrap"])}
            elif entry is not None:  # no run, or one made by an older recipe than the kept one
                seeds[seed] = {"run": "ledger", **{k: v for k, v in entry.items() if k not in ("fingerprint",
                                                                                               "bootstrap")}}
        if not seeds:
            continue
        bleu = seed_mean_interval([s["bleu"] for s in seeds.values()])
        chrf = seed_mean_interval([s["chrf"] for s in seeds.values()])
        per_seed = "; ".join(f"{seed}: {s['bleu']:.2f} ± {s['bleu_ci']:.2f} / {s['chrf']:.2f} ± {s['chrf_ci']:.2f}"
                             for seed, s in seeds.items())
        table.append({"model": row.get("label") or row["id"], "seeds": len(seeds),
                      "test verses": next(iter(seeds.values()))["verses"], "BLEU": _cell(*bleu), "chrF": _cell(*chrf),
                      "per seed: BLEU / chrF (95 % bootstrap)": per_seed})
        sources[row["id"]] = seeds
    return table, sources


COLUMNS = ["model", "seeds", "test verses", "BLEU", "chrF", "per seed: BLEU / chrF (95 % bootstrap)"]


def write_translation_report(plan: dict, kept: Optional[dict] = None, ledger: Optional[Path] = None) -> Path:
    """``translation.md|csv|json`` and ``translation_runs.json`` in ``<runs>/<plan name>/`` (``collect``); with a
    ``ledger``, the current runs' scores kept there (``keep_scores``)."""
    from ptm_app.analysis.tables import write_table

    rows, sources = collect(plan, kept)
    if ledger is not None and keep_scores(plan, sources, ledger):
        print(f"kept the finished runs' scores in {ledger / SCORES_FILE}", flush=True)
    out = runs_root() / plan["name"]
    signature = next((s["bleu_signature"] for seeds in sources.values() for s in seeds.values()), "")
    md = write_table(rows, COLUMNS, out / "translation",
                     f"English → Spanish on the held-out Bible books ({plan['name']}): sacreBLEU BLEU and chrF, "
                     f"mean over seeds ± 95 % t-interval")
    write_json(out / "translation_runs.json", sources)
    if signature:
        with open(md, "a", encoding="utf-8") as fh:
            fh.write(f"\nBLEU signature `{signature}`; chrF signature "
                     f"`{next(iter(next(iter(sources.values())).values()))['chrf_signature']}`.\n")
    return md


def translation_report(plan: str, collect_only: bool = False, only: Optional[list[str]] = None,
                       readme: Optional[str] = None, ledger: Optional[str] = None) -> int:
    """Machine translation, pre-trained (mBART) against random init: pre-train, export, fine-tune per seed, predict
    the held-out books (resumable), then the sacreBLEU table.

    Args:
        plan: the translation plan (YAML), e.g. configs/sweeps/translation_bible.yaml.
        collect_only: run nothing: the table from the runs there are.
        only: row ids to run (the table has every row that has predictions).
        readme: also put the table into this file (e.g. docs/results/translation.md), between the lines
            <!-- <plan name>:start --> and <!-- <plan name>:end -->.
        ledger: keep every current fine-tuning's scores in this folder (e.g. docs/results/ledger/translation_bible;
            ``DIR/scores.json``), and count a cell whose run directory is gone as done when its entry there is current.
    """
    path, plan = plan, load_translation_plan(plan)
    if readme:
        require_markers(readme, plan["name"])
    unknown = sorted(set(only or []) - {r["id"] for r in plan["rows"]})
    if unknown:
        raise PtmError(f"--only {' '.join(unknown)}: no such row in {path} ({', '.join(r['id'] for r in plan['rows'])})")
    where = Path(ledger) if ledger else None
    kept = kept_scores(plan, where)
    failed = [] if collect_only else run_translation_plan(plan, only, kept)
    from ptm_app.experiments.report import publish

    md = write_translation_report(plan, kept, where)
    return publish(md, readme, plan["name"], f"(+ .csv, .json) and {md.parent / 'translation_runs.json'}",
                   "translation-report", failed)
