"""``python main.py knowledge-report PLAN.yaml [--collect_only] [--only ID[/seedN] ...]``: the knowledge-enhanced PTMs
side by side (issue 16; Qiu et al. 2020 §4.1, Han et al. 2021 on knowledge), from the runs, never typed.

A plan (``configs/sweeps/knowledge_brown.yaml``) names the rows (``models``) and the downstream ``tasks``.  A model
with ``pretrain`` is pre-trained by that config with the plan's ``pretrain_set`` (the same steps for every row), tested
(KEPLER's test is WordNet link prediction: filtered MRR, Hits@k), exported to ``<run>/export``, probed on a LAMA
cloze of one WordNet relation (``analysis.knowledge_probe``: P@1 over the vocabulary) and fine-tuned on every task
from that export.  A model without ``pretrain`` is fine-tuned from the tasks' configs as they are (MiniLM); one with
``adapters`` first trains each named adapter (K-Adapter: ``knowledge.k_adapter``) and runs its own ``tasks`` configs
with those runs as its adapters.  Every run is a sweep cell (``sweep.run_cell``): run directory
``<plan>-<model>-<cell>``, resumed from ``last.ckpt`` when interrupted, skipped when it has test metrics and was
made by the same recipe (``cell.json``: config, arguments and, for a task, the fingerprint of the pre-training or
adapters it started from); a changed recipe runs again, and the table leaves out any number made by an earlier
recipe or from an earlier pre-training.  Pre-trainings are tested on ``last.ckpt``, the checkpoint their export is
made from.

The table is ``<runs>/<plan>/knowledge.md`` (+ ``.csv``, ``.json``) and ``knowledge_runs.json`` names the run
directory and metric key behind every cell; a cell that does not apply to its row (link prediction without relation
embeddings, a cloze without an MLM head, a task the row does not run) stays empty.

``seeds: [1, 2, 3]`` runs every row's whole chain once per seed (``seed_everything`` of its pre-training, adapters
and tasks; run directories ``<plan>-<model>-<cell>-seed<N>``, probes per seed) and each cell becomes the mean ± std
[95 % t interval] over the seeds (``experiments.stats``); ``baseline: <model id>`` adds each row's paired difference
from that row, seed by seed, with its interval and the exact sign-flip p, marked where the interval excludes 0.
The CSV and JSON hold the means.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Optional

from ptm_app.errors import check_renamed, read_yaml
from ptm_app.experiments.chain import (ChainLedger, Link, chain_command, current_runs, export_once, export_overrides,
                                       planned, run_chain, summary_metrics)
from ptm_app.experiments.stats import check_seeds, paired, summarize
from ptm_app.experiments.sweep import is_current, overrides, recorded_fingerprint
from ptm_app.errors import PtmError
from ptm_app.paths import check_run_name, run_path, runs_root, write_json

PROBE_KEYS = {"relation", "facts", "seed", "held_out"}
PLAN_KEYS = {"name", "pretrain_set", "task_set", "probe", "link_prediction", "tasks", "models", "seeds", "baseline"}
OLD_KEYS = {"pretrain_args": "pretrain_set", "task_args": "task_set"}  # lists of argv words, before mappings
MODEL_KEYS = {"id", "label", "pretrain", "adapters", "tasks"}


def load_knowledge_plan(path: str | Path) -> dict:
    """The plan, checked: every config it names exists, every model id is a plain unique name."""
    path = Path(path)
    if not path.is_file():
        raise PtmError(f"knowledge plan {path} not found; give a YAML file like configs/sweeps/knowledge_brown.yaml")
    plan = read_yaml(path) or {}
    if not isinstance(plan, dict):
        raise PtmError(f"knowledge plan {path}: a mapping is expected; see configs/sweeps/knowledge_brown.yaml")
    for old, new in OLD_KEYS.items():
        if old in plan:
            if new in plan:
                raise PtmError(f"knowledge plan {path}: give {new} (a mapping of overrides), not also {old}")
            plan[new] = plan.pop(old)
    unknown = set(plan) - PLAN_KEYS
    if unknown or not plan.get("name") or not plan.get("models") or not plan.get("tasks"):
        raise PtmError(f"knowledge plan {path}: needs 'name', 'tasks' and 'models' (optional 'pretrain_set', "
                       f"'task_set', 'probe', 'link_prediction', 'seeds', 'baseline'); unknown keys: "
                       f"{sorted(unknown) or 'none'}")
    check_run_name(plan["name"], f"knowledge plan {path}: name")
    if "seeds" in plan:
        plan["seeds"] = check_seeds(plan["seeds"], f"knowledge plan {path}: seeds")
    for key in ("pretrain_set", "task_set"):
        plan[key] = overrides(plan.get(key), f"knowledge plan {path}", key)
    if not isinstance(plan["tasks"], dict) or not isinstance(plan["models"], list) \
            or not all(isinstance(m, dict) for m in plan["models"]):
        raise PtmError(f"knowledge plan {path}: 'tasks' maps task names to settings and 'models' is a list of "
                       f"settings; see configs/sweeps/knowledge_brown.yaml")
    for task, spec in plan["tasks"].items():
        if not isinstance(spec, dict) or set(spec) != {"config", "metric", "column"}:
            raise PtmError(f"knowledge plan {path}: task {task} needs exactly 'config', 'metric' and 'column'")
    probe = plan.get("probe") or {}
    if not isinstance(probe, dict) or set(probe) - PROBE_KEYS:
        raise PtmError(f"knowledge plan {path}: 'probe' takes {', '.join(sorted(PROBE_KEYS))}; unknown: "
                       f"{sorted(set(probe) - PROBE_KEYS) if isinstance(probe, dict) else probe}")
    for key, kind in (("facts", int), ("seed", int), ("held_out", bool), ("relation", str)):
        if key in probe and (not isinstance(probe[key], kind) or (kind is int and isinstance(probe[key], bool))):
            wanted = "true or false" if kind is bool else kind.__name__
            raise PtmError(f"knowledge plan {path}: probe.{key} must be {wanted} (got {probe[key]!r})")
    configs = [t["config"] for t in plan["tasks"].values()]
    ids = [m.get("id") for m in plan["models"]]
    if "baseline" in plan and (plan["baseline"] not in ids or len(plan.get("seeds") or []) < 2):
        raise PtmError(f"knowledge plan {path}: baseline {plan['baseline']!r} must be one of the model ids "
                       f"({', '.join(map(str, ids))}) and needs 'seeds' (at least 2) to pair on")
    for model in plan["models"]:
        bad = set(model) - MODEL_KEYS
        if bad or not model.get("id") or not str(model["id"]).isidentifier() or ids.count(model["id"]) > 1:
            raise PtmError(f"knowledge plan {path}: model {model.get('id', '?')} needs a unique 'id' (letters, digits, "
                           f"_) and may have 'label', 'pretrain', 'adapters', 'tasks'; unknown keys: "
                           f"{sorted(bad) or 'none'}")
        if model.get("pretrain") and model.get("adapters"):
            raise PtmError(f"knowledge plan {path}: model {model['id']} has both 'pretrain' and 'adapters'; a row "
                           f"starts from one of them: split it into two rows")
        extra = set(model.get("tasks") or {}) - set(plan["tasks"])
        if extra:
            raise PtmError(f"knowledge plan {path}: model {model['id']}: tasks {sorted(extra)} are not in the plan's "
                           f"tasks ({', '.join(plan['tasks'])})")
        configs += [model.get("pretrain"), *(model.get("adapters") or {}).values(), *(model.get("tasks") or {}).values()]
    for config in configs:
        check_renamed(config, f"knowledge plan {path}: config")
    missing = [c for c in configs if c is not None and not Path(c).is_file()]
    if missing:
        raise PtmError(f"knowledge plan {path}: config {missing[0]} not found (run from the repository root)")
    return plan


def seeds_of(plan: dict) -> list[Optional[int]]:
    """The plan's seeds; ``[None]`` for a plan without ``seeds`` (its runs keep their unseeded names)."""
    return list(plan.get("seeds") or [None])


def run_dir(plan: dict, model: dict, cell: str, seed: Optional[int] = None) -> Path:
    tag = "" if seed is None else f"-seed{seed}"
    return run_path(f"{plan['name']}-{model['id']}-{cell}{tag}", "the knowledge plan's name, model id and cell give")


def probe_key(model: dict, seed: Optional[int]) -> str:
    return model["id"] if seed is None else f"{model['id']}/seed{seed}"


def cells(plan: dict, model: dict, seed: Optional[int] = None) -> list[tuple[dict, dict]]:
    """``(sweep cell, common overrides)`` in run order: pre-training or adapters first, then the tasks; with a
    ``seed``, every cell of the chain is seeded with it and named ``.../seed<N>``."""
    out, task_set = [], plan.get("task_set") or {}
    tag, seeded = ("", {}) if seed is None else (f"/seed{seed}", {"seed_everything": seed})
    task_configs = {task: spec["config"] for task, spec in plan["tasks"].items()}
    extra: dict[str, str] = {}  # JSON strings, as earlier plans passed them (the cells' fingerprints stay the same)
    if model.get("pretrain"):  # tested on the checkpoint the tasks start from (the export of last.ckpt)
        out.append(({"name": f"{model['id']}/pretrain{tag}", "config": model["pretrain"], "test_ckpt": "last",
                     **({"set": seeded} if seeded else {})}, plan.get("pretrain_set") or {}))
        extra = export_overrides(run_dir(plan, model, "pretrain", seed) / "export")
    adapters = model.get("adapters") or {}
    for name, config in adapters.items():
        out.append(({"name": f"{model['id']}/adapter_{name}{tag}", "config": config,
                     **({"set": seeded} if seeded else {})}, task_set))
    if adapters:
        runs = {name: str(run_dir(plan, model, f"adapter_{name}", seed)) for name in adapters}
        extra = {"model.init_args.adapters": json.dumps(runs)}
    if model.get("tasks"):
        task_configs = dict(model["tasks"])
    for task, config in task_configs.items():
        out.append(({"name": f"{model['id']}/{task}{tag}", "config": config, "set": {**extra, **seeded}}, task_set))
    return out


def links(plan: dict, models: list[dict]) -> list[Link]:
    """Every (model, seed)'s chain in run order: its pre-training or adapters (the first runs), then its tasks."""
    out = []
    for m in models:
        for seed in seeds_of(plan):
            for cell, common in cells(plan, m, seed):
                pretrain = cell["name"].split("/")[1] == "pretrain"
                out.append(Link(probe_key(m, seed), cell, common, first=pretrain or "/adapter_" in cell["name"],
                                after=export_once if pretrain else None))
    return out


def run_plan(plan: dict, only: Optional[list[str]] = None) -> list[str]:
    """Run every cell that has no test metrics yet (resuming interrupted fits), export each pre-trained model and
    probe it; returns the cells that failed.  A SIGTERM stops at once (exit 143 raised as one line)."""
    chains = chosen(plan, only)
    rows = {probe_key(m, seed) for m, seed in chains}
    failed = run_chain(plan["name"], [link for link in links(plan, plan["models"]) if link.row in rows],
                       "knowledge-report")
    probe_models(plan, [(m, seed) for m, seed in chains
                        if m.get("pretrain") and cells(plan, m, seed)[0][0]["name"] not in failed])
    return failed


def chosen(plan: dict, only: Optional[list[str]] = None) -> list[tuple[dict, Optional[int]]]:
    """The (model, seed) chains to run, in the plan's order: all of them, or those ``only`` names (a model id: each
    of its seeds; ``<id>/seed<N>``: that seed's chain alone, so a long plan can be run a part at a time)."""
    return [(m, seed) for m in plan["models"] for seed in seeds_of(plan)
            if not only or m["id"] in only or (seed is not None and probe_key(m, seed) in only)]


PROBE_FILE = "probe.json"


def probe_file(plan: dict) -> Path:
    return runs_root() / plan["name"] / PROBE_FILE


def probe_models(plan: dict, models: list[tuple[dict, Optional[int]]]) -> None:
    """LAMA cloze P@1 of the plan's relation for each pre-trained (model, seed)'s export, into ``probe.json`` (kept
    per model and seed; one probed before is not probed again)."""
    from ptm_app.analysis.knowledge_facts import read_facts, relation_file, valid_objects
    from ptm_app.analysis.knowledge_probe import load_language_model, sample_facts, score_relation, summaries
    from ptm_app.knowledge.seen_pairs import held_out, knowledge_training_pairs

    settings = probe_settings(plan)
    path = probe_file(plan)
    results = json.loads(path.read_text()) if path.is_file() else {}
    made_by = {probe_key(m, s): recorded_fingerprint(run_dir(plan, m, "pretrain", s)) for m, s in models}
    models = [(m, s) for m, s in models if probe_key(m, s) not in results
              or not probe_is_current(results[probe_key(m, s)], settings, made_by[probe_key(m, s)])]
    if not models:
        return
    facts = read_facts(relation_file(settings["relation"]))
    pool = held_out(facts, knowledge_training_pairs(settings["relation"])) if settings["held_out"] else facts
    if not pool:
        raise PtmError(f"probe.held_out leaves no fact of '{settings['relation']}': every pair is a LIBERT or KEPLER "
                       "training pair; set probe.held_out: false")
    # the filtered ranking still leaves out every valid object, held out or not
    valid, sample = valid_objects(facts), sample_facts(pool, settings["facts"], settings["seed"])
    for model, seed in models:
        export = run_dir(plan, model, "pretrain", seed) / "export"
        if not (export / "config.json").is_file():
            raise PtmError(f"{export}: no export to probe (its pre-training was remade from a ledger entry, which "
                           f"keeps no weights); remove {export.parent} to pre-train it again")
        lm = load_language_model(str(export))
        scored, skipped = score_relation(lm, sample, valid, 16)
        relation = sample[0].relation
        row = next(r for r in summaries(lm.name, scored, {relation: skipped})
                   if r["relation"] == relation and r["ranking"] == "vocabulary")
        results[probe_key(model, seed)] = {**row, "facts_scored": row["facts"], "export": str(export),
                                           "pretrain": made_by[probe_key(model, seed)], **settings,
                                           "facts_of_relation": len(facts), "facts_held_out": len(pool)}
        write_json(path, results)


def probe_settings(plan: dict) -> dict:
    """The plan's ``probe`` over the defaults: hypernymy, 200 facts, seed 0, from all facts."""
    return {"relation": "hypernym", "facts": 200, "seed": 0, "held_out": False, **(plan.get("probe") or {})}


def probe_is_current(result: dict, settings: dict, pretrain: Optional[str]) -> bool:
    """A stored probe result is of this pre-training's export, with the plan's probe settings."""
    return result.get("pretrain") == pretrain and all(result.get(k) == v for k, v in settings.items())


def columns_of(plan: dict) -> tuple[dict, dict, list[str]]:
    """The link-prediction and probe columns (column -> metric key) and every column of the table in order."""
    link = plan.get("link_prediction", "test")
    link_columns = {"link MRR": f"test/{link}/mrr", "link Hits@10": f"test/{link}/hits@10",
                    "link MRR, unseen entities": f"test/inductive/{link}/mrr"}  # transductive, then inductive
    relation = probe_settings(plan)["relation"]
    probe_columns = {f"{relation} P@1": "p_at_1", f"{relation} MRR": "mrr"}  # the cloze over the vocabulary
    tasks = [spec["column"] for spec in plan["tasks"].values()]
    return link_columns, probe_columns, ["model", *link_columns, *probe_columns, *tasks]


def seed_cells(plan: dict, model: dict, seed: Optional[int], probes: dict, current: dict[Path, str]
               ) -> tuple[dict, dict]:
    """One chain's numbers (column -> value) and their sources (column -> run directory or probe, and metric key).
    Only the runs the plan makes now count (``current``: ``chain.current_runs``); a run made by an earlier recipe or
    from an earlier pre-training (or adapters), and a probe of an earlier pre-training, are left out: stale."""
    link_columns, probe_columns, _ = columns_of(plan)
    values, where, settings = {}, {}, probe_settings(plan)
    firsts = [run_dir(plan, model, cell, seed) for cell in
              (["pretrain"] if model.get("pretrain") else [f"adapter_{a}" for a in model.get("adapters") or {}])]
    if not all(is_current(run, current[run]) for run in firsts):
        return values, where  # what the chain starts from was remade by another recipe: nothing of it is current
    if model.get("pretrain"):
        run = firsts[0]
        metrics = summary_metrics(run)
        for column, key in link_columns.items():
            if key in metrics:
                values[column], where[column] = metrics[key], {"run": str(run), "metric": key}
        probe = probes.get(probe_key(model, seed))
        if probe is not None and probe_is_current(probe, settings, recorded_fingerprint(run)):
            scored = probe.get("facts_scored", probe["facts"] - probe.get("multi_token", 0))  # (older records)
            for column, key in probe_columns.items():
                values[column] = probe[key]
                where[column] = {"probe": str(probe_file(plan)), "export": probe["export"], "metric": key,
                                 "facts": scored}
    runs_tasks = model.get("tasks") or plan["tasks"]
    for task, spec in plan["tasks"].items():
        if task not in runs_tasks:
            continue
        run = run_dir(plan, model, task, seed)
        key = f"test/{spec['metric']}"
        value = summary_metrics(run).get(key) if is_current(run, current[run]) else None
        if value is not None:
            values[spec["column"]], where[spec["column"]] = value, {"run": str(run), "metric": key}
    return values, where


def collect(plan: dict) -> tuple[list[dict], list[str], dict]:
    """Rows, columns, and per row and column where the number came from.  Without seeds a cell is its run's number
    and its source the run directory (or probe) and metric key; with seeds a cell is the mean over the seeds that
    have it, and its source holds each seed's value and source and the summary (``stats.summarize``)."""
    columns = columns_of(plan)[2]
    probes = json.loads(probe_file(plan).read_text()) if probe_file(plan).is_file() else {}
    current = current_runs(plan["name"], links(plan, plan["models"]))
    rows, sources = [], {}
    for model in plan["models"]:
        label = model.get("label") or model["id"]
        if not plan.get("seeds"):
            values, where = seed_cells(plan, model, None, probes, current)
            rows.append({"model": label, **values})
            sources[label] = where
            continue
        per_seed = {seed: seed_cells(plan, model, seed, probes, current) for seed in plan["seeds"]}
        row, where = {"model": label}, {}
        for column in columns[1:]:
            have = {seed: v[column] for seed, (v, _) in per_seed.items() if column in v}
            if have:
                s = summarize(list(have.values()))
                row[column] = s.mean
                where[column] = {"seeds": {f"seed{k}": {"value": v, **per_seed[k][1][column]} for k, v in have.items()},
                                 "mean": s.mean, "std": s.std, "interval": list(s.interval) if s.interval else None,
                                 "n": s.n, "of": len(plan["seeds"])}
        rows.append(row)
        sources[label] = where
    return rows, columns, sources


def seeded_markdown(plan: dict, rows: list[dict], columns: list[str], sources: dict) -> str:
    """The seeded table (each cell mean ± std [95 % t interval] over its seeds) and, with a ``baseline``, each row's
    paired difference from it per column, on the seeds both have (``stats.paired``); a row without such a pair
    is left out of that table."""
    from ptm_app.analysis.tables import markdown as table
    from ptm_app.experiments.stats import Summary

    def text(entry: dict) -> str:
        s = Summary(entry["n"], entry["mean"], entry["std"], tuple(entry["interval"]) if entry["interval"] else None)
        return s.text() + ("" if entry["n"] == entry["of"] else f", {entry['n']} of {entry['of']}")

    shown = [{"model": r["model"], **{c: text(sources[r["model"]][c]) for c in columns[1:] if c in sources[r["model"]]}}
             for r in rows]
    out = [f"Mean ± std [95 % t interval] over seeds {plan['seeds']} (``experiments.stats``); a cell of one seed is an "
           f"observation.\n", table(shown, columns)]
    base = next((m for m in plan["models"] if m["id"] == plan.get("baseline")), None)
    if base is not None:
        name = base.get("label") or base["id"]
        diffs = []
        for r in rows:
            if r["model"] == name:
                continue
            line = {"model": r["model"]}
            for c in columns[1:]:
                mine = sources[r["model"]].get(c, {}).get("seeds", {})
                theirs = sources[name].get(c, {}).get("seeds", {})
                keys = sorted(set(mine) & set(theirs))
                if len(keys) >= 2:
                    line[c] = paired([mine[k]["value"] for k in keys], [theirs[k]["value"] for k in keys]).text()
            if len(line) > 1:  # a row with no column of 2 seeds shared with the baseline has no pair to show
                diffs.append(line)
        out += [f"\n#### Paired difference: model − {name} (the same seeds; 95 % t interval, exact sign-flip p; "
                f"* the interval excludes 0)\n",
                table(diffs, columns) if diffs else f"None yet: no model has 2 seeds of a column that {name} has too."]
    return "\n".join(out)


def draw(rows: list[dict], columns: list[str], sources: Optional[dict] = None):
    """One panel per metric column, one bar per model that has the number (a cell that does not apply: no bar);
    with a seeded plan's ``sources`` (``collect``), each bar is the mean with its 95 % t interval as a whisker."""
    from ptm_app.analysis.figures import new_figure

    metrics = [c for c in columns if c != "model"]
    fig, axes = new_figure(len(metrics), width=4.2, height=0.35 * len(rows) + 1.2, columns=4)
    for ax, column in zip(axes, metrics):
        shown = [(i, r["model"], r[column]) for i, r in enumerate(rows)
                 if r.get(column) is not None and math.isfinite(r[column])]
        ax.barh([n for _, n, _ in shown], [v for _, _, v in shown], color=[f"C{i % 10}" for i, _, _ in shown])
        ends = [0.0] + [v for _, _, v in shown]  # the axis spans the bars and their whiskers
        for y, (_, name, v) in enumerate(shown):
            interval = ((sources or {}).get(name, {}).get(column) or {}).get("interval")
            if interval:
                ax.errorbar(v, y, xerr=[[v - interval[0]], [interval[1] - v]], fmt="none", ecolor="black",
                            capsize=2, lw=0.8)
                ends += interval
            ax.annotate(f"{v:.3g}", (v, y), xytext=(2, 4 if interval else 0), textcoords="offset points",
                        va="center", fontsize="x-small")
        ax.set_title(column, fontsize="small")
        ax.set_xlim(min(ends) * 1.25, max(ends) * 1.25 or 1.0)
        ax.invert_yaxis()  # the table's order, top down
        ax.tick_params(axis="y", labelsize="x-small")
        ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig


def write_knowledge_report(plan: dict) -> Path:
    """``knowledge.md|csv|json``, ``knowledge.png`` (``draw``) and ``knowledge_runs.json`` in the plan's folder."""
    from ptm_app.analysis.figures import save_png
    from ptm_app.analysis.tables import write_table

    from ptm_app.paths import atomic_file

    rows, columns, sources = collect(plan)
    out = runs_root() / plan["name"]
    title = (f"Knowledge-enhanced pre-training ({plan['name']}): link prediction on WordNet (filtered), LAMA cloze, "
             f"downstream test metrics")
    md = write_table(rows, columns, out / "knowledge", title)
    if plan.get("seeds"):  # the Markdown shows the intervals (and the paired differences); CSV and JSON the means
        with atomic_file(md, "w", encoding="utf-8") as fh:
            fh.write(f"### {title}\n\n" + seeded_markdown(plan, rows, columns, sources))
    write_json(out / "knowledge_runs.json", sources)
    save_png(draw(rows, columns, sources if plan.get("seeds") else None), out / "knowledge.png")
    return md


def knowledge_report(plan: str, collect_only: bool = False, only: Optional[list[str]] = None,
                     readme: Optional[str] = None, ledger: Optional[str] = None) -> int:
    """Knowledge-enhanced PTMs side by side: pre-train, export, probe, fine-tune (resumable), then the table.

    Args:
        plan: the knowledge plan (YAML), e.g. configs/sweeps/knowledge_brown.yaml.
        collect_only: run nothing: the table from the runs there are.
        only: model ids to run, or one seed's chain of a model: ``mlm/seed2`` (the table has every row).
        readme: also put the table into this file (e.g. README.md), between the lines <!-- <plan name>:start -->
            and <!-- <plan name>:end -->.
        ledger: keep each finished run's results and the probe results in this folder (e.g.
            docs/results/ledger/knowledge_brown), and count a run whose directory is gone as done when its ledger entry
            is current (``chain.restore_chain``; a pre-training only with its probe in the ledger too).
    """
    path, plan = plan, load_knowledge_plan(plan)
    return chain_command("knowledge-report", path, plan, [m["id"] for m in plan["models"]], "model", only, readme,
                         collect_only, run_plan, write_knowledge_report,
                         f"(+ .csv, .json, .png) and {runs_root() / plan['name'] / 'knowledge_runs.json'}", ledger,
                         ChainLedger(lambda p: links(p, p["models"]), files=(PROBE_FILE,),
                                      first_ok=probe_in_ledger, current_entry=probe_of_current_pretraining),
                         seeds=plan.get("seeds"))


def probe_of_current_pretraining(plan: dict) -> Callable[[str, object], bool]:
    """Whether a kept probe result (``probe.json``'s ``key``: model/seed) is of the pre-training the plan makes now,
    with the plan's probe settings: of two copies (the runs directory's, the ledger's) that one is kept.  The plan's
    fingerprints are computed once, here, not per entry."""
    made_now = {link.row: fingerprint for link, _, fingerprint, _ in planned(plan["name"], links(plan, plan["models"]))
                if link.first and link.cell["name"].split("/")[1] == "pretrain"}
    settings = probe_settings(plan)
    return lambda key, entry: (isinstance(entry, dict) and key in made_now
                               and probe_is_current(entry, settings, made_now[key]))


def probe_in_ledger(plan: dict, link: Link, fingerprint: str) -> bool:
    """A pre-training may be remade from its ledger entry only when its probe result (of that pre-training, with the
    plan's settings) is kept too: the probe reads the export, which the ledger does not keep.  Adapters: always."""
    if not link.cell["name"].split("/")[1] == "pretrain":
        return True
    probes = json.loads(probe_file(plan).read_text()) if probe_file(plan).is_file() else {}
    probe = probes.get(link.row)
    return probe is not None and probe_is_current(probe, probe_settings(plan), fingerprint)
