"""``python main.py sweep PLAN.yaml [--only GLOB ...] [--list]``: run a grid of configs (fit, then test from
the best checkpoint), one run directory per cell, then write the plan's results table with ``report``.

A plan is YAML: ``name`` (run directories are ``<name>-<cell>``), ``set`` (config overrides added to every fit and
test, a mapping of dotted keys to values, e.g. ``{trainer.max_steps: 250}``), ``test: true`` to test each cell's best
checkpoint (``last`` for cells that do not fit), and ``cells``: ``{name, config, set, fit, test_ckpt}`` each
(``fit: false`` for zero-shot cells that only test).  ``seeds: [1, 2, 3]`` runs every cell once per seed
(``seed_everything``; run directories ``<name>-<cell>-seed<N>``) and adds ``<name>_seeds.md``: per cell and metric the
mean ± std and the 95 % t interval over the seeds (``experiments.stats``); ``baseline: <cell>`` adds each cell's
paired difference from that cell, seed by seed (or ``{cell: its baseline cell, ...}``).  A cell's ``config`` may be a list: a recipe, then the overlays added
to it in order (``configs/optim/``, ``configs/strategy/``).  Plans written before overrides were mappings (``common`` and
``args`` as lists of command-line words, ``[--trainer.max_steps, '250']``) still load.
A cell whose run directory already has test metrics is skipped and an interrupted fit resumes exactly from its
``last.ckpt``, so a stopped sweep (Ctrl-C, SIGTERM) continues where it stopped; ``--force`` reruns from scratch.
Each run directory records what made it (``cell.json``: a hash of the config's settings, the arguments and the
cells it starts from); a cell whose config or arguments changed since is not skipped or resumed but run afresh,
its old directory kept beside it as ``<run>.stale-N``.  The table is ``<runs>/<name>.md`` and ``.csv``, built from
the runs' ``summary.json`` files.  ``--ledger DIR`` keeps each finished cell's results (``<run>.json``: its
``summary.json``, its recipe's fingerprint and the machine it ran on; no weights) in DIR, and a cell whose run
directory is gone but whose ledger entry is of its current recipe counts as done: a grid longer than one machine's
life (a scratch disk, a lent node) is finished in parts, and its tables stay whole.
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence
from unittest import mock

import yaml

from ptm_app.errors import check_renamed, read_yaml
from ptm_app.errors import PtmError
from ptm_app.paths import check_run_name, runs_root, write_json

CELL_KEYS = {"name", "config", "set", "fit", "test_ckpt"}
PLAN_KEYS = {"name", "set", "test", "cells", "seeds", "baseline"}
OLD_KEYS = {"common": "set", "args": "set"}  # plans from before overrides were mappings: lists of argv words
CELL_FILE = "cell.json"
REMADE = "remade_from_ledger"  # cell.json's mark on a run directory remade from a ledger entry (no weights)
EXAMPLE = "{model.init_args.optim.lr: 1.0e-4, trainer.max_steps: 250}"


def load_plan(path: str | Path) -> dict:
    """The plan, checked, with every cell's overrides as a mapping (``overrides``)."""
    path = Path(path)
    if not path.is_file():
        raise PtmError(f"sweep plan {path} not found; give a YAML file like configs/sweeps/adapt_minilm.yaml")
    plan = read_yaml(path) or {}
    if not isinstance(plan, dict):
        raise PtmError(f"sweep plan {path}: a mapping with 'name' and 'cells' is expected, not a "
                       f"{type(plan).__name__}; see configs/sweeps/adapt_minilm.yaml")
    plan = upgrade(plan, f"sweep plan {path}")
    unknown = set(plan) - PLAN_KEYS
    if unknown or not plan.get("name") or not isinstance(plan.get("cells"), list) or not plan["cells"]:
        raise PtmError(f"sweep plan {path}: needs 'name' and a list of 'cells' (optional 'set', 'test'); "
                       f"unknown keys: {sorted(unknown) or 'none'}")
    plan["set"] = overrides(plan.get("set"), f"sweep plan {path}")
    for i, cell in enumerate(plan["cells"]):
        if not isinstance(cell, dict):
            raise PtmError(f"sweep plan {path}: cell {i + 1} is a {type(cell).__name__}; each cell is a mapping "
                           f"with 'name' and 'config' (optional 'set', 'fit', 'test_ckpt')")
        cell = plan["cells"][i] = upgrade(cell, f"sweep plan {path}: cell {cell.get('name', i + 1)}")
        bad = set(cell) - CELL_KEYS
        if bad or "name" not in cell or "config" not in cell:
            raise PtmError(f"sweep plan {path}: cell {cell.get('name', '?')} needs 'name' and 'config' "
                           f"(optional 'set', 'fit', 'test_ckpt'); unknown keys: {sorted(bad) or 'none'}")
        files = config_files(cell, f"sweep plan {path}: cell {cell['name']}")
        for file in files:
            check_renamed(file, f"sweep plan {path}: cell {cell['name']}: config")
            if not Path(file).is_file():
                raise PtmError(f"sweep plan {path}: cell {cell['name']}: config {file} not found")
        cell["set"] = overrides(cell.get("set"), f"sweep plan {path}: cell {cell['name']}")
        run_name(plan, cell, path)
    if "baseline" in plan and "seeds" not in plan:
        raise PtmError(f"sweep plan {path}: baseline {plan['baseline']!r} pairs cells over seeds; add seeds: [1, 2, 3]")
    if "seeds" in plan:
        from ptm_app.experiments.stats import check_seeds

        seeds = check_seeds(plan["seeds"], f"sweep plan {path}: seeds")
        names = [cell["name"] for cell in plan["cells"]]
        given = plan.get("baseline")
        named = [given] if isinstance(given, str) else [*given, *given.values()] if isinstance(given, dict) else \
            [given] if "baseline" in plan else []
        bad = [n for n in named if n not in names]
        if bad or (named and len(seeds) < 2):
            raise PtmError(f"sweep plan {path}: baseline {bad[0] if bad else given!r} must be one of the cells "
                           f"({', '.join(names)}), or a mapping of cells to the cell each is compared with, and "
                           f"needs at least 2 seeds to pair on")
        plan["cells"] = [{**cell, "name": f"{cell['name']}/seed{seed}", "set": {**cell["set"], "seed_everything": seed},
                          "base": cell["name"]} for cell in plan["cells"] for seed in seeds]
        for cell in plan["cells"]:
            run_name(plan, cell, path)
    return plan


def upgrade(entry: dict, where: str) -> dict:
    """``entry`` with the old list keys (``common``, ``args``) renamed to ``set``; both at once is refused."""
    old = [k for k in OLD_KEYS if k in entry]
    if not old:
        return entry
    if "set" in entry or len(old) > 1:
        raise PtmError(f"{where}: give the overrides once, as 'set' (a mapping), not also as {' and '.join(old)}")
    return {("set" if k == old[0] else k): v for k, v in entry.items()}


def overrides(value: Any, where: str, key: str = "set") -> dict[str, Any]:
    """Config overrides as a mapping ``{dotted.key: value}``; an old list of argv words (``[--key, value, ...]``) is
    read into one.  Anything else is one line naming the plan and the form."""
    if value is None:
        return {}
    if isinstance(value, list):
        return _from_argv([str(v) for v in value], where, key)
    if not isinstance(value, dict) or not all(isinstance(k, str) and k and not k.startswith("-") for k in value):
        raise PtmError(f"{where}: '{key}' maps config keys (without --) to values, e.g. {key}: {EXAMPLE}; "
                       f"got {value!r:.80}")
    return dict(value)


def _from_argv(words: list[str], where: str, key: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    i = 0
    while i < len(words):
        option, eq, value = words[i].partition("=")
        if not option.startswith("--") or len(option) < 3 or (not eq and i + 1 >= len(words)):
            raise PtmError(f"{where}: {words[i]!r} is not '--key value'; write the overrides as a mapping, e.g. "
                           f"{key}: {EXAMPLE}")
        if not eq:
            value, i = words[i + 1], i + 1
        found[option[2:]] = value
        i += 1
    return found


def override_args(values: dict[str, Any]) -> list[str]:
    """The overrides as command-line words for LightningCLI: a mapping or list value in YAML flow style, a string as
    it is, ``null`` / ``true`` / ``false`` for None and bools."""
    words = []
    for key, value in values.items():
        if isinstance(value, (dict, list)):
            text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1 << 30).strip()
        elif value is None or isinstance(value, bool):
            text = json.dumps(value)
        else:
            text = str(value)
        words += [f"--{key}", text]
    return words


def run_name(plan: dict, cell: dict, path: str | Path = "sweep plan") -> str:
    """The cell's run directory name (one directory name: ``paths.check_run_name``)."""
    return check_run_name(f"{plan['name']}-{str(cell['name']).replace('/', '-')}",
                          f"{path}: the name and cell name give the run name")


def is_done(run_dir: Path, fingerprint: Optional[str] = None) -> bool:
    """The run has test metrics (and, given ``fingerprint``, was made by that recipe: ``recorded_fingerprint``)."""
    summary = run_dir / "summary.json"
    tested = summary.is_file() and any(k.startswith("test/")
                                       for k in json.loads(summary.read_text()).get("metrics", {}))
    return tested and (fingerprint is None or is_current(run_dir, fingerprint))


def is_current(run_dir: Path, fingerprint: str) -> bool:
    """The run was made by the recipe ``fingerprint`` names (or before sweeps recorded recipes: trusted); a
    report leaves out any other."""
    return recorded_fingerprint(run_dir) in (None, fingerprint)


def config_files(cell: dict, where: str = "sweep cell") -> list[str]:
    """The cell's ``config``: one recipe, or a list of a recipe and the overlays added to it in order (e.g.
    ``[configs/pretrain/bert_mlm_nsp_brown.yaml, configs/optim/lamb_8x_batch.yaml]``), each one ``--config``."""
    files = cell["config"] if isinstance(cell["config"], list) else [cell["config"]]
    if not files or not all(isinstance(f, str) and f for f in files):
        raise PtmError(f"{where}: config is a file or a list of files (a recipe, then its overlays); got "
                       f"{cell['config']!r:.80}")
    return files


def cell_fingerprint(plan: dict, cell: dict, upstream: Sequence[str] = ()) -> str:
    """What makes a cell's run: its config's settings (parsed: comments and layout do not count), the plan's and
    the cell's arguments, whether it fits and which checkpoint it tests, and the fingerprints of the cells it starts
    from (``upstream``: a pre-training whose export it fine-tunes), hashed.  The runs folder's own path (an export
    a fine-tuning starts from is under it) counts as ``$RUNS``, so one recipe has one fingerprint on every machine
    and a ledger's entries match there; a run recorded under the earlier, path-bearing form is upgraded in place."""
    settings = [yaml.safe_load(Path(f).read_text(encoding="utf-8")) for f in config_files(cell)]
    recipe = {"config": settings[0] if isinstance(cell["config"], str) else settings,  # one file: as before
              "args": [*override_args(plan.get("set") or {}), *override_args(cell.get("set") or {})],
              "fit": cell.get("fit", True), "test_ckpt": cell.get("test_ckpt"), "upstream": list(upstream)}
    fingerprint = recipe_digest(recipe, runs=str(runs_root()))
    path_bearing = recipe_digest(recipe)
    if path_bearing != fingerprint and "name" in plan:  # the recipe names the runs folder: upgrade a run made before
        run_dir = runs_root() / run_name(plan, cell)
        record = cell_record(run_dir)
        if record.get("fingerprint") == path_bearing:
            write_json(run_dir / CELL_FILE, {**record, "fingerprint": fingerprint})
    return fingerprint


def recipe_digest(recipe: dict, runs: Optional[str] = None) -> str:
    """A recipe (JSON-able settings) hashed to the 16 hex digits a run's ``cell.json`` records; key order does not
    count, and with ``runs`` (the runs folder's path) neither does where the runs folder is.  ``cell_fingerprint``
    and ``compression_report.recipe_fingerprints`` both use it."""
    text = json.dumps(recipe, sort_keys=True)
    if runs:
        text = text.replace(json.dumps(runs)[1:-1], "$RUNS")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cell_record(run_dir: Path) -> dict:
    """``<run>/cell.json`` (fingerprint, cell, upstream); {} for a directory made before sweeps recorded one."""
    path = run_dir / CELL_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def recorded_fingerprint(run_dir: Path) -> Optional[str]:
    """The fingerprint in ``<run>/cell.json``; None for a directory made before sweeps recorded one (trusted)."""
    return cell_record(run_dir).get("fingerprint")


def record_cell(run_dir: Path, fingerprint: str, cell: dict, upstream: Sequence[str] = (),
                remedy: str = "delete it, or rerun with --force,") -> None:
    """Write ``<run>/cell.json`` unless it is there.  A finished directory from before fingerprints is adopted as it
    is, said in one line (its recipe cannot be checked: ``remedy`` if its config changed since)."""
    if (run_dir / CELL_FILE).is_file():
        return
    if (run_dir / "summary.json").is_file():
        print(f"{run_dir.name}: made before its recipe was recorded; kept as it is ({remedy} if its config or "
              f"arguments changed since)", flush=True)
    write_json(run_dir / CELL_FILE, {"fingerprint": fingerprint, "cell": cell, "upstream": list(upstream)})


def entry_file(ledger: Path, run_dir: Path) -> Path:
    return Path(ledger) / f"{run_dir.name}.json"


def read_entry(path: Path) -> dict:
    """A ledger entry that ``write_entry`` wrote (JSON: data, nothing in it is run); one line if it is not one."""
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise PtmError(f"{path}: not a readable ledger entry ({err}); delete it to run its cell again") from None
    if not isinstance(entry, dict) or not {"fingerprint", "summary"} <= set(entry) or not isinstance(
            entry["summary"], dict) or not isinstance(entry["fingerprint"], str):
        raise PtmError(f"{path}: a ledger entry has 'fingerprint' (a string) and 'summary' (a mapping); delete it "
                       f"to run its cell again")
    return entry


def write_entry(ledger: Path, run_dir: Path) -> bool:
    """Copy a finished run's results (``summary.json`` and ``cell.json``, never weights) to
    ``ledger/<run>.json``, with the machine it ran on (``throughput.device_name``) and the day; an entry already
    there with the same fingerprint and summary is left as it is (it names the machine that made it); a run
    without a recorded recipe, or remade from an entry (``is_restored``: a copy, perhaps older than the ledger's),
    gets none.  Returns whether it wrote."""
    import torch

    from ptm_app.training.throughput import device_name

    path, summary = entry_file(ledger, run_dir), json.loads((run_dir / "summary.json").read_text())
    cell = cell_record(run_dir)
    if not cell.get("fingerprint") or is_restored(run_dir):  # no recipe to check it against; or a copy of an entry
        return False
    if path.is_file():
        old = read_entry(path)
        if old["fingerprint"] == cell.get("fingerprint") and old["summary"] == summary:
            return False
    machine = summary.get("machine") or device_name(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    write_json(path, {**cell, "summary": summary, "machine": machine,
                      "entered": time.strftime("%Y-%m-%d", time.gmtime())})
    return True


def current_entry(ledger: Path, run_dir: Path, fingerprint: str) -> Optional[dict]:
    """The ledger's entry for ``run_dir`` when it is of the recipe ``fingerprint`` names; else None."""
    path = entry_file(ledger, run_dir)
    entry = read_entry(path) if path.is_file() else None
    return entry if entry is not None and entry["fingerprint"] == fingerprint else None


def restore_entry(ledger: Path, run_dir: Path, fingerprint: str) -> bool:
    """Remake ``run_dir`` (its ``summary.json`` and ``cell.json`` only) from its entry in ``ledger`` when the
    directory is gone and the entry is of the recipe ``fingerprint`` names; returns whether it did."""
    entry = None if run_dir.exists() else current_entry(ledger, run_dir, fingerprint)
    if entry is None:
        return False
    run_dir.mkdir(parents=True)  # cell.json first: a directory with a summary and no mark would pass for a real run
    write_json(run_dir / CELL_FILE, {**{k: v for k, v in entry.items() if k != "summary"}, REMADE: True})
    write_json(run_dir / "summary.json", entry["summary"])
    return True


def is_restored(run_dir: Path) -> bool:
    """The run directory was remade from its ledger entry (``restore_entry``): results only, no checkpoint or export."""
    return bool(cell_record(run_dir).get(REMADE))


def forget_remade(run_dir: Path) -> None:
    """Remove a remade run directory (``is_restored``: its ``cell.json`` and ``summary.json``, which its ledger
    entry still holds), so its cell runs for real; a directory holding anything else is left and refused."""
    made = {run_dir / CELL_FILE, run_dir / "summary.json"}
    other = [p for p in run_dir.iterdir() if p not in made]
    if other:
        raise PtmError(f"{run_dir}: remade from a ledger entry but holds {other[0].name} too; move it away to run "
                       f"its cell again")
    for p in made:
        p.unlink(missing_ok=True)
    run_dir.rmdir()


def restore_entries(plan: dict, ledger: Path) -> list[str]:
    """``restore_entry`` for every cell of ``plan``; returns the names of the cells remade.  An entry of another
    recipe is left alone: its cell runs, and its new entry replaces it."""
    return [cell["name"] for cell in plan["cells"]
            if restore_entry(ledger, runs_root() / run_name(plan, cell), cell_fingerprint(plan, cell))]


def current_cells(plan: dict) -> tuple[dict[str, Path], list[str]]:
    """Of the plan's cells that have a run directory: cell name -> run directory for those made by their cell's
    current recipe (``is_current``), and the names of the others (stale: a report leaves them out)."""
    made = {c["name"]: (c, runs_root() / run_name(plan, c)) for c in plan["cells"]}
    made = {name: (c, run) for name, (c, run) in made.items() if run.is_dir()}
    stale = [name for name, (c, run) in made.items() if not is_current(run, cell_fingerprint(plan, c))]
    return {name: run for name, (_, run) in made.items() if name not in stale}, stale


def set_aside_if_stale(run_dir: Path, fingerprint: str) -> Optional[Path]:
    """Move a run directory made by another recipe to ``<run>.stale-N`` (kept, never deleted); returns where."""
    if is_current(run_dir, fingerprint):
        return None
    n = 1
    while run_dir.with_name(f"{run_dir.name}.stale-{n}").exists():
        n += 1
    return run_dir.rename(run_dir.with_name(f"{run_dir.name}.stale-{n}"))


def run_cell(plan: dict, cell: dict, fresh: bool = False, upstream: Sequence[str] = ()) -> int:
    """Fit (resuming an interrupted fit of the same recipe from its ``last.ckpt`` unless ``fresh``), then test the
    ``best`` checkpoint (``cell['test_ckpt']`` to choose another, e.g. ``last``)."""
    from ptm_app.training.cli import run_lightning
    from ptm_app.errors import guarded

    name = run_name(plan, cell)
    base = [*(w for f in config_files(cell) for w in ("--config", f)), *override_args(plan.get("set") or {}),
            *override_args(cell.get("set") or {}), "--run_name", name]
    fingerprint, run_dir = cell_fingerprint(plan, cell, upstream), runs_root() / name
    moved = set_aside_if_stale(run_dir, fingerprint)
    if moved is None and is_restored(run_dir):  # remade from its ledger entry, run again (--force): a new run
        forget_remade(run_dir)
    if moved is not None:
        print(f"{cell['name']}: its config or arguments changed since {run_dir.name} ran; that run is kept as "
              f"{moved.name} and the cell runs afresh", flush=True)
    record_cell(run_dir, fingerprint, cell, upstream)
    fits = cell.get("fit", True)
    with mock.patch.object(sys, "argv", sys.argv[:1]):  # LightningCLI warns when given args beside sys.argv's
        if fits:
            resume = not fresh and moved is None and (run_dir / "checkpoints" / "last.ckpt").exists()
            code = guarded(run_lightning, ["fit", *base, *(["--ckpt_path", "last"] if resume else [])])
            if code:
                return code
        if plan.get("test", True):
            return guarded(run_lightning, ["test", *base, *(["--ckpt_path", cell.get("test_ckpt", "best")] if fits
                                                            else [])])
    return 0


def sweep(plan: str, only: Optional[list[str]] = None, force: bool = False, list: bool = False,
          readme: Optional[str] = None, ledger: Optional[str] = None) -> int:
    """Run a grid of configs (fit + test), one run directory per cell, then its results table.

    Args:
        plan: the sweep plan (YAML), e.g. configs/sweeps/adapt_minilm.yaml.
        only: cell name globs to run (default: all); with ``seeds``, a cell's name selects all its seeds
            (``squad/full``) and ``<name>/seed<N>`` one of them.
        force: rerun cells that already have test metrics.
        list: list the cells and their state, run nothing.
        readme: also put the tables into this file (e.g. docs/results/adaptation.md), between the lines
            ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``, NAME the plan's name.
        ledger: keep each finished cell's results in this folder (e.g. docs/results/ledger/adapt_minilm), and
            count a cell whose run directory is gone as done when its ledger entry is of its current recipe.
    """
    from ptm_app.paths import require_markers, write_between_markers

    listing = list
    path, plan = plan, load_plan(plan)
    if readme:
        require_markers(readme, plan["name"])
    cells = [c for c in plan["cells"] if not only or any(fnmatch.fnmatch(c["name"], g)
                                                         or fnmatch.fnmatch(c.get("base", ""), g) for g in only)]
    if not cells:
        raise PtmError(f"--only {' '.join(only)} matches no cell of {path}")
    if ledger and not listing:
        restored = restore_entries(plan, Path(ledger))
        if restored:
            print(f"{len(restored)} cell(s) done before, restored from {ledger} (results only, no weights): "
                  f"{', '.join(restored[:5])}{', ...' if len(restored) > 5 else ''}", flush=True)
    failed = []
    for i, cell in enumerate(cells, 1):
        run_dir = runs_root() / run_name(plan, cell)
        fingerprint = cell_fingerprint(plan, cell)
        done = is_done(run_dir, fingerprint)
        if listing:
            stale = recorded_fingerprint(run_dir) not in (None, fingerprint)
            kept = ledger and not run_dir.exists() and current_entry(Path(ledger), run_dir, fingerprint)
            state = "done" if done else "stale" if stale else "ledger" if kept else "todo"
            print(f"{cell['name']:40s} {state}  {run_dir}")
            continue
        if done and not force:
            print(f"[{i}/{len(cells)}] {cell['name']}: done, skipped")
            continue
        start = time.monotonic()
        print(f"[{i}/{len(cells)}] {cell['name']}: {cell['config']}", flush=True)
        code = run_cell(plan, cell, fresh=force)
        print(f"[{i}/{len(cells)}] {cell['name']}: exit {code} after {time.monotonic() - start:.0f} s", flush=True)
        if code == 143:  # SIGTERM: the cell saved last.ckpt; stop the sweep (rerun it to continue)
            return 143
        if code:
            failed.append(cell["name"])
        elif ledger and is_done(run_dir, fingerprint):
            write_entry(Path(ledger), run_dir)
    if listing:
        return 0
    from ptm_app.experiments.report import write_report

    made, stale = current_cells(plan)
    if stale:
        print(f"left out of the tables: {len(stale)} run(s) made by an earlier recipe of their cell "
              f"({', '.join(stale[:5])}{', ...' if len(stale) > 5 else ''}); run those cells again to remake them")
    current = {n: str(d) for n, d in made.items()}
    if ledger:  # cells finished before --ledger was given, too
        kept = [n for n, d in made.items() if is_done(d) and write_entry(Path(ledger), d)]
        if kept:
            print(f"kept the results of {len(kept)} cell(s) in {ledger}")
    runs = [*current.values()]
    if runs:
        stages = ("test/",) if plan.get("test") else ("val/",)
        md, _ = write_report(runs, runs_root() / plan["name"], by="data", stages=stages)
        print(md.read_text(), end="")
        print(f"wrote {md} and {md.with_suffix('.csv')}")
        if plan.get("seeds"):
            from ptm_app.experiments.report import write_seed_report

            groups: dict[str, list[str]] = {}
            for c in plan["cells"]:
                if c["name"] in current:
                    groups.setdefault(c["base"], []).append(current[c["name"]])
            seeds_md = write_seed_report(groups, runs_root() / f"{plan['name']}_seeds", stages, plan.get("baseline"),
                                         by="data")
            print(seeds_md.read_text(), end="")
            print(f"wrote {seeds_md} and {seeds_md.with_suffix('.png')}")
        if readme:  # with seeds: the intervals first, then every run
            tables = ([seeds_md] if plan.get("seeds") else []) + [md]
            write_between_markers(readme, plan["name"], "\n".join(t.read_text(encoding="utf-8") for t in tables))
            if plan.get("seeds"):
                from ptm_app.analysis.tables import copy_figure

                print(f"wrote {copy_figure(seeds_md.with_suffix('.png'), readme, plan['name'])}")
    if failed:
        raise PtmError(f"sweep: {len(failed)} cell(s) failed: {', '.join(failed)}; see their output above")
    return 0
