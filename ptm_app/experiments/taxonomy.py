"""``python main.py taxonomy-report PLAN.yaml [--only ID ...] [--collect_only] [--readme PAGE]``: which pre-training
objective gives the best representations for the compute spent?  The surveys' central comparison (Qiu et al. 2020
§3.1 and Table 1; Liu et al. 2023 §3-4) measured as ELECTRA measured it (Clark et al. 2020, Figure 1): every
objective trained for the same **training FLOPs** (``trainer.max_flops``, counted by ``TrainingFlops``: ELECTRA's
generator and every extra head included), at two budgets, then fine-tuned on the same tasks, over seeds.

A plan (``configs/sweeps/taxonomy.yaml``) names the ``objectives`` (one shipped ``configs/pretrain`` recipe each, with
the row's own overrides), the shared ``corpus`` and ``pretrain_set`` (tokenizer, sequence length, batch, schedule:
the same for every row), the FLOPs ``budgets``, the ``pretrain_seeds`` and ``finetune_seeds`` and the ``tasks``.
One row has ``floor: true``: the **no pre-training** floor, the same network and tokenizer from random
initialisation (one optimizer step at learning rate 0: the weights stay as initialised, and the export is written
as for every other row).  Each (objective, budget, pre-training seed) is a chain of sweep cells
(``experiments.chain``): the pre-training (stopped by FLOPs, not tested: not every objective has a test step;
exported from ``last.ckpt`` to ``<run>/export``),
then each task fine-tuned from that export once per fine-tuning seed.  Cells are resumable and skipped when done; a
changed pre-training reruns the fine-tunings that start from it.

The report (``<runs>/<plan>/taxonomy.md`` + ``.json`` + ``.png``) has per objective × budget the measured training
FLOPs, wall time, tokens seen and parameter count (means over the pre-training seeds, from ``summary.json``) and per
task the mean ± std [95 % t interval] over the pre-training seeds, each the mean of its fine-tuning runs
(``stats.summarize``); then the paired differences against plain MLM (same budget) and against the floor, paired
on the pre-training seeds the same way (``stats.paired``; ``*`` where the interval excludes 0); a check line per
budget that the rows' FLOPs agree within 5 %; a line for each task a row cannot run and why; and the figure:
downstream score against pre-training FLOPs, one line per objective.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

from ptm_app.errors import read_yaml
from ptm_app.errors import PtmError
from ptm_app.experiments.chain import (ChainLedger, Link, chain_command, current_runs, export_once, export_overrides,
                                       run_chain, summary, summary_metrics)
from ptm_app.experiments.sweep import is_current, overrides
from ptm_app.paths import check_run_name, run_path, runs_root, write_json

PLAN_KEYS = {"name", "corpus", "pretrain_set", "task_set", "budgets", "pretrain_seeds", "finetune_seeds", "baseline",
             "tasks", "objectives"}
OBJECTIVE_KEYS = {"id", "label", "pretrain", "set", "floor", "tasks", "note"}
TASK_KEYS = {"config", "metric", "column"}
CORPUS_FORMAT = "PretrainDataModule"  # the plan's corpus is plain text documents
FLOOR_SET = {"model.init_args.optim.lr": 0.0, "trainer.max_steps": 1}  # one step that changes nothing
FLOPS_TOLERANCE = 0.05
EXAMPLE = "configs/sweeps/taxonomy.yaml"


def load_taxonomy_plan(path: str | Path) -> dict:
    """The plan, checked: configs exist, objectives read the corpus's format, budgets are FLOPs, seeds integers."""
    from ptm_app.experiments.stats import check_seeds

    path = Path(path)
    where = f"taxonomy plan {path}"
    if not path.is_file():
        raise PtmError(f"{where} not found; give a YAML file like {EXAMPLE}")
    plan = read_yaml(path) or {}
    if not isinstance(plan, dict):
        raise PtmError(f"{where}: a mapping is expected; see {EXAMPLE}")
    unknown = set(plan) - PLAN_KEYS
    missing = [k for k in ("name", "corpus", "budgets", "pretrain_seeds", "finetune_seeds", "baseline", "tasks",
                           "objectives") if not plan.get(k)]
    if unknown or missing:
        raise PtmError(f"{where}: missing {missing or 'nothing'}; unknown keys: {sorted(unknown) or 'none'} "
                       f"(keys: {', '.join(sorted(PLAN_KEYS))})")
    check_run_name(plan["name"], f"{where}: name")
    for key in ("pretrain_set", "task_set"):
        plan[key] = overrides(plan.get(key), where, key)
    for key in ("pretrain_seeds", "finetune_seeds"):
        plan[key] = check_seeds(plan[key], f"{where}: {key}")
    budgets = plan["budgets"]
    if not isinstance(budgets, dict):
        raise PtmError(f"{where}: 'budgets' maps a label to training FLOPs, e.g. {{short: 2.0e+13, long: 6.0e+13}}")
    for label, flops in budgets.items():
        check_run_name(str(label), f"{where}: budget label")
        budgets[label] = _flops(flops)
        if budgets[label] is None or not budgets[label] > 0:
            raise PtmError(f"{where}: budget {label} must be a positive number of training FLOPs (got {flops!r}), "
                           f"e.g. 2.0e+13")
    if not isinstance(plan["tasks"], dict) or not isinstance(plan["objectives"], list) \
            or not all(isinstance(o, dict) for o in plan["objectives"]):
        raise PtmError(f"{where}: 'tasks' maps task names to settings and 'objectives' is a list of settings; "
                       f"see {EXAMPLE}")
    for task, spec in plan["tasks"].items():
        if not isinstance(spec, dict) or set(spec) != TASK_KEYS:
            raise PtmError(f"{where}: task {task} needs exactly 'config', 'metric' and 'column'")
        check_run_name(str(task), f"{where}: task name")
        if not Path(spec["config"]).is_file():
            raise PtmError(f"{where}: task {task}: config {spec['config']} not found (run from the repository root)")
    ids = [o.get("id") for o in plan["objectives"]]
    for objective in plan["objectives"]:
        check_objective(plan, objective, ids, where)
    floors = [o["id"] for o in plan["objectives"] if o.get("floor")]
    if len(floors) != 1:
        raise PtmError(f"{where}: exactly one objective is the no-pre-training floor ('floor: true'); found "
                       f"{floors or 'none'}")
    if plan["baseline"] not in ids or plan["baseline"] in floors:
        raise PtmError(f"{where}: baseline {plan['baseline']!r} must be the id of a pre-trained objective "
                       f"(plain MLM), one of {', '.join(i for i in ids if i not in floors)}")
    return plan


def _flops(value) -> Optional[float]:
    """A number of FLOPs; YAML 1.1 reads ``6.0e8`` (no exponent sign) as a string, so a numeric string counts."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def check_objective(plan: dict, objective: dict, ids: list, where: str) -> None:
    bad = set(objective) - OBJECTIVE_KEYS
    oid = objective.get("id")
    if bad or not oid or not str(oid).isidentifier() or ids.count(oid) > 1 or not objective.get("pretrain"):
        raise PtmError(f"{where}: objective {oid or '?'} needs a unique 'id' (letters, digits, _) and 'pretrain' (a "
                       f"config), and may have {', '.join(sorted(OBJECTIVE_KEYS - {'id', 'pretrain'}))}; unknown keys: "
                       f"{sorted(bad) or 'none'}")
    config = Path(objective["pretrain"])
    if not config.is_file():
        raise PtmError(f"{where}: objective {oid}: config {config} not found (run from the repository root)")
    objective["set"] = overrides(objective.get("set"), f"{where}: objective {oid}")
    data = (read_yaml(config) or {}).get("data") or {}
    kind = str(data.get("class_path", "")).rsplit(".", 1)[-1]
    if kind != CORPUS_FORMAT:
        raise PtmError(f"{where}: objective {oid}: {config} reads {kind or 'no'} data, not the plan's corpus "
                       f"({plan['corpus']}: plain text for {CORPUS_FORMAT}); leave it out of the plan or give an "
                       f"objective that pre-trains on text")
    extra = set(objective.get("tasks") or []) - set(plan["tasks"])
    if extra:
        raise PtmError(f"{where}: objective {oid}: tasks {sorted(extra)} are not in the plan's tasks "
                       f"({', '.join(plan['tasks'])})")


def budgets_of(plan: dict, objective: dict) -> dict[str, Optional[float]]:
    """The budgets a row is trained at: the plan's, or for the floor one, ``init`` (no FLOPs budget)."""
    return {"init": None} if objective.get("floor") else dict(plan["budgets"])


def row_key(objective: dict, budget: str, seed: int) -> str:
    return f"{objective['id']}/{budget}/p{seed}"


def pretrain_run(plan: dict, objective: dict, budget: str, seed: int) -> Path:
    return run_path(f"{plan['name']}-{objective['id']}-{budget}-p{seed}-pretrain",
                    "the taxonomy plan's name, objective id, budget and seed give")


def task_run(plan: dict, objective: dict, budget: str, seed: int, task: str, ft_seed: int) -> Path:
    return run_path(f"{plan['name']}-{objective['id']}-{budget}-p{seed}-{task}-f{ft_seed}",
                    "the taxonomy plan's name, objective id, budget, seeds and task give")


def model_type(plan: dict, objective: dict) -> Optional[str]:
    """The backbone's ``model_type`` a row pre-trains (its override, else its config's)."""
    given = {**plan["pretrain_set"], **objective["set"]}.get("model.init_args.backbone_config")
    if isinstance(given, dict) and given.get("model_type"):
        return given["model_type"]
    model = ((read_yaml(objective["pretrain"]) or {}).get("model") or {}).get("init_args") or {}
    return (model.get("backbone_config") or {}).get("model_type")


def why_not(plan: dict, objective: dict, task: str) -> Optional[str]:
    """Why a row cannot run a task (None: it can): the plan leaves it out (the row's ``tasks``, its ``note`` saying
    why), or transformers has no model of the task's model class for the export's architecture.  (Frozen features of an
    encoder-decoder are its encoder's layers: ``adaptation.policies.FrozenFeatures``.)"""
    if objective.get("tasks") is not None and task not in objective["tasks"]:
        return objective.get("note") or "left out by the plan"
    import transformers

    import ptm_app.backbones.bilstm  # noqa: F401  (registers ELMo's BiLSTM with the Auto classes)
    from ptm_app.backbones.model_classes import auto_class
    from ptm_app.checkpoint_io.module_classes import registered

    task_model = ((read_yaml(plan["tasks"][task]["config"]) or {}).get("model") or {}).get("class_path")
    module = registered(task_model)
    mtype = model_type(plan, objective)
    if module is None or mtype is None:
        return None
    try:
        config_class = transformers.CONFIG_MAPPING[mtype]
    except KeyError:
        config_class = None
    mapping = getattr(auto_class(module.model_class), "_model_mapping", None)
    if config_class is None or mapping is None:
        return None
    if config_class not in mapping:
        return f"transformers has no {module.model_class} model for {mtype} (the export's architecture)"
    return None


def links(plan: dict, objectives: list[dict]) -> list[Link]:
    """The chains in run order: per (pre-training seed, budget, objective), seed-major so that a run stopped part
    way has every objective at the first seeds rather than one objective at every seed, the pre-training, then
    each task it can run once per fine-tuning seed (from its export)."""
    chains = [(objective, budget, flops, seed) for objective in objectives
              for budget, flops in budgets_of(plan, objective).items() for seed in plan["pretrain_seeds"]]
    order = {name: i for i, name in enumerate(["init", *plan["budgets"]])}
    chains.sort(key=lambda c: (plan["pretrain_seeds"].index(c[3]), order[c[1]]))  # stable: objectives in order
    out = []
    for objective, budget, flops, seed in chains:
        row = row_key(objective, budget, seed)
        limit = FLOOR_SET if objective.get("floor") else {"trainer.max_flops": float(flops)}
        pre = {"name": f"{row}/pretrain", "config": objective["pretrain"],
               "set": {**objective["set"], **limit, "seed_everything": seed}}
        common = {"data.init_args.source": plan["corpus"], **plan["pretrain_set"]}
        out.append(Link(row, pre, common, first=True, after=export_once,
                        fitted=lambda run, flops=flops: pretrained(run, flops)))
        start = export_overrides(pretrain_run(plan, objective, budget, seed) / "export")
        for task, spec in plan["tasks"].items():
            if why_not(plan, objective, task) is not None:
                continue
            for ft_seed in plan["finetune_seeds"]:
                cell = {"name": f"{row}/{task}/f{ft_seed}", "config": spec["config"],
                        "set": {**start, "seed_everything": ft_seed}}
                out.append(Link(row, cell, plan["task_set"], first=False))
    return out


def pretrained(run: Path, flops: Optional[float]) -> bool:
    """A pre-training is complete when its fit ended having spent its FLOPs budget (the floor: its one step)."""
    done = summary(run)
    if "fit_seconds" not in done:
        return False
    return done.get("global_step", 0) >= 1 if flops is None else done.get("train_flops", 0.0) >= flops


def run_plan(plan: dict, only: Optional[list[str]] = None) -> list[str]:
    """Run every cell not done yet; returns the cells that failed.  A run refused as bad input (a FLOPs budget
    smaller than one step) stops the plan: its one line is the message."""
    objectives = [o for o in plan["objectives"] if not only or o["id"] in only]
    return run_chain(plan["name"], links(plan, objectives), "taxonomy-report", stop_on_bad_input=True)


def _mean(values: list[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def collect(plan: dict) -> list[dict]:
    """Per objective × budget: the pre-trainings' measured facts and, per task, every run's test metric keyed by
    ``p<pretrain seed>/f<finetune seed>``, with the run directories behind them.  Only the runs the plan makes now
    count (``chain.current_runs``): one made by an earlier recipe or ``task_set``, or from an earlier pre-training,
    is left out until the plan runs it again."""
    from ptm_app.experiments.stats import summarize

    current = current_runs(plan["name"], links(plan, plan["objectives"]))
    rows = []
    for objective in plan["objectives"]:
        for budget, flops in budgets_of(plan, objective).items():
            row: dict[str, Any] = {"id": objective["id"], "objective": objective.get("label") or objective["id"],
                                   "budget": budget, "budget_flops": flops, "floor": bool(objective.get("floor")),
                                   "pretrain_runs": {}, "tasks": {}, "cannot_run": {}}
            facts: dict[str, list[float]] = {"train_flops": [], "train_tokens": [], "fit_seconds": [],
                                             "total_params": []}
            for seed in plan["pretrain_seeds"]:
                run = pretrain_run(plan, objective, budget, seed)
                done = summary(run)
                if "fit_seconds" not in done or not is_current(run, current[run]):
                    continue
                row["pretrain_runs"][f"p{seed}"] = str(run)
                for key in facts:
                    if done.get(key) is not None:
                        facts[key].append(float(done[key]))
            row.update({key: _mean(values) for key, values in facts.items()})
            for task, spec in plan["tasks"].items():
                reason = why_not(plan, objective, task)
                if reason is not None:
                    row["cannot_run"][task] = reason
                    continue
                values, runs = {}, {}
                for seed in plan["pretrain_seeds"]:
                    if f"p{seed}" not in row["pretrain_runs"]:
                        continue
                    for ft_seed in plan["finetune_seeds"]:
                        run = task_run(plan, objective, budget, seed, task, ft_seed)
                        value = summary_metrics(run).get(f"test/{spec['metric']}")
                        if value is not None and is_current(run, current[run]):
                            values[f"p{seed}/f{ft_seed}"], runs[f"p{seed}/f{ft_seed}"] = float(value), str(run)
                entry: dict[str, Any] = {"values": values, "runs": runs, "expected": len(plan["pretrain_seeds"])
                                         * len(plan["finetune_seeds"])}
                if values:  # over the pre-training seeds, each the mean of its fine-tunings (by_pretraining_seed)
                    s = summarize(by_pretraining_seed(values, values)[1])
                    entry.update({"mean": s.mean, "std": s.std, "interval": list(s.interval) if s.interval else None,
                                  "n": s.n})
                row["tasks"][task] = entry
            rows.append(row)
    compare(plan, rows)
    return rows


def by_pretraining_seed(mine: dict[str, float], theirs: dict[str, float]) -> tuple[list[str], list[float],
                                                                                 list[float]]:
    """The pre-training seeds both rows have runs of (``p<N>``), and per seed each row's mean over the fine-tuning
    seeds both have.  The pre-training seed is the unit a paired test may count: the fine-tunings of one
    pre-trained model share it, so their differences are not independent draws."""
    groups: dict[str, list[str]] = {}
    for key in set(mine) & set(theirs):
        groups.setdefault(key.split("/")[0], []).append(key)
    seeds = sorted(groups, key=lambda p: int(p[1:]))
    return (seeds, [sum(mine[k] for k in groups[p]) / len(groups[p]) for p in seeds],
            [sum(theirs[k] for k in groups[p]) / len(groups[p]) for p in seeds])


def compare(plan: dict, rows: list[dict]) -> None:
    """Each row's paired differences per task against plain MLM at its budget and against the floor, paired on the
    pre-training seeds both have, each seed's value the mean over its fine-tuning seeds (``by_pretraining_seed``,
    ``stats.paired``): at least two pre-training seeds, or no comparison."""
    from ptm_app.experiments.stats import paired

    floor = next(r for r in rows if r["floor"])
    for row in rows:
        row["paired"] = {}
        base = next((r for r in rows if r["id"] == plan["baseline"] and r["budget"] == row["budget"]), None)
        for against, other in (("baseline", base), ("floor", floor)):
            if other is None or other is row:
                continue
            for task in plan["tasks"]:
                mine, theirs = row["tasks"].get(task, {}).get("values", {}), other["tasks"].get(task, {}).get("values", {})
                seeds, a, b = by_pretraining_seed(mine, theirs)
                if len(seeds) < 2:
                    continue
                p = paired(a, b)
                row["paired"].setdefault(against, {})[task] = {
                    "n": p.n, "diff": p.diff.mean, "interval": list(p.diff.interval), "p_t": p.p_t,
                    "p_perm": p.p_perm, "significant": p.significant, "pairs": seeds,
                    "runs": len(set(mine) & set(theirs))}


def flops_checks(plan: dict, rows: list[dict]) -> list[dict]:
    """Per budget: the smallest and largest mean training FLOPs over the pre-trained rows that have runs, and
    whether they agree within 5 % of the smallest."""
    checks = []
    for budget, flops in plan["budgets"].items():
        spent = [(r["objective"], r["train_flops"]) for r in rows
                 if r["budget"] == budget and not r["floor"] and r["train_flops"]]
        if not spent:
            continue
        low, high = min(f for _, f in spent), max(f for _, f in spent)
        spread = (high - low) / low
        checks.append({"budget": budget, "budget_flops": flops, "rows": len(spent), "min": low, "max": high,
                       "spread": spread, "agree": spread <= FLOPS_TOLERANCE,
                       "outliers": [name for name, f in spent if (f - low) / low > FLOPS_TOLERANCE]})
    return checks


def _number(value: Optional[float], digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}g}"


def _cell(entry: dict) -> str:
    from ptm_app.experiments.stats import Summary

    if not entry.get("values"):
        return ""
    s = Summary(entry["n"], entry["mean"], entry["std"], tuple(entry["interval"]) if entry["interval"] else None)
    runs = len(entry["values"])
    return s.text().replace(" seeds)", f" pre-training seeds, {runs} runs)").replace(
        "(1 seed:", f"(1 pre-training seed, {runs} run{'s' if runs > 1 else ''}:")


def _diff(entry: Optional[dict]) -> str:
    from ptm_app.experiments.stats import diff_text

    return diff_text(entry["diff"], entry["interval"], entry["p_perm"], entry["significant"]) if entry else ""


def markdown(plan: dict, rows: list[dict], checks: list[dict]) -> str:
    """The report's text: the main table, the paired tables, the FLOPs check lines and the rows' missing tasks."""
    from ptm_app.analysis.tables import markdown as table

    columns = ["objective", "budget", "train FLOPs", "wall s", "tokens", "params",
               *[spec["column"] for spec in plan["tasks"].values()]]
    main = []
    for r in rows:
        line = {"objective": r["objective"],
                "budget": "none (random init)" if r["floor"] else f"{r['budget']} ({r['budget_flops']:.2g})",
                "train FLOPs": _number(r["train_flops"]), "wall s": _number(r["fit_seconds"]),
                "tokens": _number(r["train_tokens"]), "params": _number(r["total_params"])}
        for task, spec in plan["tasks"].items():
            line[spec["column"]] = "cannot run" if task in r["cannot_run"] else _cell(r["tasks"].get(task, {}))
        main.append(line)
    base = next(o.get("label") or o["id"] for o in plan["objectives"] if o["id"] == plan["baseline"])
    floor = next(o.get("label") or o["id"] for o in plan["objectives"] if o.get("floor"))
    text = [f"### Objective taxonomy ({plan['name']}): test metrics at equal pre-training FLOPs\n",
            f"Mean ± std [95 % t interval] over the pre-training seeds, each seed's value the mean over its "
            f"fine-tuning seeds ({len(plan['pretrain_seeds'])} × {len(plan['finetune_seeds'])} runs per cell): the "
            f"fine-tunings of one pre-trained model are not independent draws; train FLOPs, wall time, tokens "
            f"and parameters (of the pre-training module) are means over the pre-training seeds, from each run's "
            f"summary.json.\n", table(main, columns)]
    for against, name in (("baseline", base), ("floor", floor)):
        paired_rows = []
        for r in rows:
            if against in r["paired"]:
                paired_rows.append({"objective": r["objective"], "budget": r["budget"],
                                    **{spec["column"]: _diff(r["paired"][against].get(task))
                                       for task, spec in plan["tasks"].items()}})
        if paired_rows:
            text += [f"\n#### Paired difference: objective − {name} (same budget for {name}; paired on the "
                     f"pre-training seeds, each the mean over its fine-tuning seeds; 95 % t interval over the "
                     f"pre-training seeds, exact sign-flip p; * the interval excludes 0)\n",
                     table(paired_rows, ["objective", "budget", *[s["column"] for s in plan["tasks"].values()]])]
    text.append("")
    for c in checks:
        verdict = "yes" if c["agree"] else f"NO ({', '.join(c['outliers'])} spent more)"
        text.append(f"- FLOPs check, budget {c['budget']} ({c['budget_flops']:.3g}): {c['rows']} rows spent "
                    f"{c['min']:.4g} to {c['max']:.4g} training FLOPs, a spread of {100 * c['spread']:.2f} % of the "
                    f"smallest; within {100 * FLOPS_TOLERANCE:.0f} %: {verdict}")
    said = set()
    for r in rows:
        for task, reason in r["cannot_run"].items():
            if (r["id"], task) not in said:
                said.add((r["id"], task))
                text.append(f"- {r['objective']} cannot run {task}: {reason}")
        for task, entry in r["tasks"].items():
            if entry.get("values") and len(entry["values"]) < entry["expected"]:
                text.append(f"- {r['objective']}, {r['budget']}: {task} has {len(entry['values'])} of "
                            f"{entry['expected']} runs")
    return "\n".join(text).rstrip() + "\n"


def draw(plan: dict, rows: list[dict]):
    """One panel per task: the mean test metric (with its 95 % interval) against the mean training FLOPs, one line
    per objective through its budgets (Clark et al. 2020, Figure 1); the floor is a dashed horizontal line."""
    from ptm_app.analysis.figures import new_figure

    import matplotlib

    tasks = list(plan["tasks"])
    fig, axes = new_figure(len(tasks), width=4.6, height=3.4, columns=3)
    colours, markers = matplotlib.colormaps["tab20"], "os^Dvp<>h*"  # 14 objectives: no colour twice
    for ax, task in zip(axes, tasks):
        for i, objective in enumerate(plan["objectives"]):
            points = sorted((r["train_flops"], r["tasks"][task]) for r in rows
                            if r["id"] == objective["id"] and r["tasks"].get(task, {}).get("values")
                            and r["train_flops"] and math.isfinite(r["tasks"][task]["mean"]))
            if not points:
                continue
            label = objective.get("label") or objective["id"]
            if objective.get("floor"):
                ax.axhline(points[0][1]["mean"], color="0.4", linestyle="--", label=label)
                continue
            x, y = [p[0] for p in points], [p[1]["mean"] for p in points]
            err = [[p[1]["mean"] - (p[1]["interval"] or [p[1]["mean"]] * 2)[0] for p in points],
                   [(p[1]["interval"] or [p[1]["mean"]] * 2)[1] - p[1]["mean"] for p in points]]
            ax.errorbar(x, y, yerr=err, marker=markers[i % len(markers)], capsize=2, color=colours(i % 20),
                        label=label)
        ax.set_xscale("log")
        ax.set_xlabel("pre-training FLOPs")
        ax.set_title(plan["tasks"][task]["column"], fontsize="small")
        ax.grid(alpha=0.3)
    legend = {}  # every objective once (a task a row cannot run leaves it out of that panel), below the panels
    for ax in axes:
        legend.update(zip(*reversed(ax.get_legend_handles_labels())))
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=min(5, len(legend)), fontsize="small")
    fig.tight_layout(rect=(0, 0.04 * (1 + (len(legend) - 1) // 5), 1, 1))
    return fig


def write_taxonomy_report(plan: dict) -> Path:
    """``taxonomy.md``, ``taxonomy.json`` (every number and the runs behind it) and ``taxonomy.png``."""
    from ptm_app.analysis.figures import save_png
    from ptm_app.paths import atomic_file

    rows = collect(plan)
    checks = flops_checks(plan, rows)
    out = runs_root() / plan["name"]
    md = out / "taxonomy.md"
    out.mkdir(parents=True, exist_ok=True)
    with atomic_file(md, "w", encoding="utf-8") as fh:
        fh.write(markdown(plan, rows, checks))
    write_json(out / "taxonomy.json", {"rows": rows, "flops_checks": checks})
    save_png(draw(plan, rows), out / "taxonomy.png")
    return md


def taxonomy_report(plan: str, collect_only: bool = False, only: Optional[list[str]] = None,
                    readme: Optional[str] = None, ledger: Optional[str] = None) -> int:
    """Pre-training objectives at equal FLOPs, over seeds: pre-train, export, fine-tune (resumable), then the table.

    Args:
        plan: the taxonomy plan (YAML): configs/sweeps/taxonomy.yaml (make taxonomy), or the quick one,
            configs/sweeps/taxonomy_quick.yaml.
        collect_only: run nothing: the table from the runs there are.
        only: objective ids to run (the table has every row).
        readme: also put the table into this file (e.g. docs/results/taxonomy.md), between the lines
            <!-- <plan name>:start --> and <!-- <plan name>:end -->.
        ledger: keep each finished run's results in this folder (e.g. docs/results/ledger/taxonomy), and count a
            run whose directory is gone as done when its ledger entry is current (``chain.restore_chain``).
    """
    path, plan = plan, load_taxonomy_plan(plan)
    return chain_command("taxonomy-report", path, plan, [o["id"] for o in plan["objectives"]], "objective", only,
                         readme, collect_only, run_plan, write_taxonomy_report, "(+ .json, .png)", ledger,
                         ChainLedger(lambda p: links(p, p["objectives"])))
