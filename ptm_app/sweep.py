"""``python main.py sweep PLAN.yaml [--only GLOB ...] [--list]``: run a grid of configs (fit, then test from
the best checkpoint), one run directory per cell, then write the plan's results table with ``report``.

A plan is YAML: ``name`` (run directories are ``<name>-<cell>``), ``common`` (arguments added to every fit and
test, e.g. a step budget), ``test: true`` to test each cell's best checkpoint (``last`` for cells that do not
fit), and ``cells``: ``{name, config, args, fit}`` each (``fit: false`` for zero-shot cells that only test).
A cell whose run directory already has test metrics is skipped and an interrupted fit resumes exactly from its
``last.ckpt``, so a stopped sweep (Ctrl-C, SIGTERM) continues where it stopped; ``--force`` reruns from scratch.
Each run directory records what made it (``cell.json``: a hash of the config's settings, the arguments and the
cells it starts from); a cell whose config or arguments changed since is not skipped or resumed but run afresh,
its old directory kept beside it as ``<run>.stale-N``.  The table is ``<runs>/<name>.md`` and ``.csv``, built from
the runs' ``summary.json`` files.
"""
from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import time
from pathlib import Path
from typing import Optional, Sequence

import yaml

from ptm_app.config_errors import read_yaml
from ptm_app.errors import PtmError
from ptm_app.paths import check_run_name, runs_root, write_json

CELL_KEYS = {"name", "config", "args", "fit", "test_ckpt"}
CELL_FILE = "cell.json"


def load_plan(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise PtmError(f"sweep plan {path} not found; give a YAML file like configs/adapt/table_minilm.yaml")
    plan = read_yaml(path) or {}
    unknown = set(plan) - {"name", "common", "test", "cells"}
    if unknown or not plan.get("name") or not plan.get("cells"):
        raise PtmError(f"sweep plan {path}: needs 'name' and 'cells' (optional 'common', 'test'); "
                       f"unknown keys: {sorted(unknown) or 'none'}")
    for cell in plan["cells"]:
        bad = set(cell) - CELL_KEYS
        if bad or "name" not in cell or "config" not in cell:
            raise PtmError(f"sweep plan {path}: cell {cell.get('name', '?')} needs 'name' and 'config' "
                           f"(optional 'args', 'fit', 'test_ckpt'); unknown keys: {sorted(bad) or 'none'}")
        if not Path(cell["config"]).is_file():
            raise PtmError(f"sweep plan {path}: cell {cell['name']}: config {cell['config']} not found")
        run_name(plan, cell, path)
    return plan


def run_name(plan: dict, cell: dict, path: str | Path = "sweep plan") -> str:
    """The cell's run directory name (one directory name: ``paths.check_run_name``)."""
    return check_run_name(f"{plan['name']}-{str(cell['name']).replace('/', '-')}",
                          f"{path}: the name and cell name give the run name")


def is_done(run_dir: Path, fingerprint: Optional[str] = None) -> bool:
    """The run has test metrics (and, given ``fingerprint``, was made by that recipe: ``recorded_fingerprint``)."""
    summary = run_dir / "summary.json"
    tested = summary.is_file() and any(k.startswith("test/")
                                       for k in json.loads(summary.read_text()).get("metrics", {}))
    return tested and (fingerprint is None or recorded_fingerprint(run_dir) in (None, fingerprint))


def cell_fingerprint(plan: dict, cell: dict, upstream: Sequence[str] = ()) -> str:
    """What makes a cell's run: its config's settings (parsed: comments and layout do not count), the plan's and
    the cell's arguments, whether it fits and which checkpoint it tests, and the fingerprints of the cells it starts
    from (``upstream``: a pre-training whose export it fine-tunes), hashed."""
    recipe = {"config": yaml.safe_load(Path(cell["config"]).read_text(encoding="utf-8")),
              "args": [str(a) for a in [*(plan.get("common") or []), *(cell.get("args") or [])]],
              "fit": cell.get("fit", True), "test_ckpt": cell.get("test_ckpt"), "upstream": list(upstream)}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def cell_record(run_dir: Path) -> dict:
    """``<run>/cell.json`` (fingerprint, cell, upstream); {} for a directory made before sweeps recorded one."""
    path = run_dir / CELL_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def recorded_fingerprint(run_dir: Path) -> Optional[str]:
    """The fingerprint in ``<run>/cell.json``; None for a directory made before sweeps recorded one (trusted)."""
    return cell_record(run_dir).get("fingerprint")


def record_cell(run_dir: Path, fingerprint: str, cell: dict, upstream: Sequence[str] = ()) -> None:
    """Write ``<run>/cell.json`` unless it is there.  A finished directory from before fingerprints is adopted as it
    is, said in one line (its recipe cannot be checked: delete it, or use ``--force``, if its config changed since)."""
    if (run_dir / CELL_FILE).is_file():
        return
    if (run_dir / "summary.json").is_file():
        print(f"{run_dir.name}: made before sweeps recorded their recipe; kept as it is (delete it, or rerun with "
              f"--force, if its config or arguments changed since)", flush=True)
    write_json(run_dir / CELL_FILE, {"fingerprint": fingerprint, "cell": cell, "upstream": list(upstream)})


def set_aside_if_stale(run_dir: Path, fingerprint: str) -> Optional[Path]:
    """Move a run directory made by another recipe to ``<run>.stale-N`` (kept, never deleted); returns where."""
    if recorded_fingerprint(run_dir) in (None, fingerprint):
        return None
    n = 1
    while run_dir.with_name(f"{run_dir.name}.stale-{n}").exists():
        n += 1
    return run_dir.rename(run_dir.with_name(f"{run_dir.name}.stale-{n}"))


def run_cell(plan: dict, cell: dict, fresh: bool = False, upstream: Sequence[str] = ()) -> int:
    """Fit (resuming an interrupted fit of the same recipe from its ``last.ckpt`` unless ``fresh``), then test the
    ``best`` checkpoint (``cell['test_ckpt']`` to choose another, e.g. ``last``)."""
    from ptm_app.cli import run_lightning
    from ptm_app.config_errors import guarded

    name, common = run_name(plan, cell), [str(a) for a in plan.get("common") or []]
    base = ["--config", cell["config"], *common, *[str(a) for a in cell.get("args") or []], "--run_name", name]
    fingerprint, run_dir = cell_fingerprint(plan, cell, upstream), runs_root() / name
    moved = set_aside_if_stale(run_dir, fingerprint)
    if moved is not None:
        print(f"{cell['name']}: its config or arguments changed since {run_dir.name} ran; that run is kept as "
              f"{moved.name} and the cell runs afresh", flush=True)
    record_cell(run_dir, fingerprint, cell, upstream)
    fits = cell.get("fit", True)
    if fits:
        resume = not fresh and moved is None and (run_dir / "checkpoints" / "last.ckpt").exists()
        code = guarded(run_lightning, ["fit", *base, *(["--ckpt_path", "last"] if resume else [])])
        if code:
            return code
    if plan.get("test", True):
        return guarded(run_lightning, ["test", *base, *(["--ckpt_path", cell.get("test_ckpt", "best")] if fits
                                                        else [])])
    return 0


def sweep_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="main.py sweep", description=__doc__.splitlines()[0])
    parser.add_argument("plan", help="the sweep plan (YAML)")
    parser.add_argument("--only", nargs="*", default=None, help="cell name globs to run (default: all)")
    parser.add_argument("--force", action="store_true", help="rerun cells that already have test metrics")
    parser.add_argument("--list", action="store_true", help="list the cells and their state, run nothing")
    args = parser.parse_args(argv)
    plan = load_plan(args.plan)
    cells = [c for c in plan["cells"] if not args.only or any(fnmatch.fnmatch(c["name"], g) for g in args.only)]
    if not cells:
        raise PtmError(f"--only {' '.join(args.only)} matches no cell of {args.plan}")
    failed = []
    for i, cell in enumerate(cells, 1):
        run_dir = runs_root() / run_name(plan, cell)
        fingerprint = cell_fingerprint(plan, cell)
        done = is_done(run_dir, fingerprint)
        if args.list:
            stale = recorded_fingerprint(run_dir) not in (None, fingerprint)
            print(f"{cell['name']:40s} {'done' if done else 'stale' if stale else 'todo'}  {run_dir}")
            continue
        if done and not args.force:
            print(f"[{i}/{len(cells)}] {cell['name']}: done, skipped")
            continue
        start = time.monotonic()
        print(f"[{i}/{len(cells)}] {cell['name']}: {cell['config']}", flush=True)
        code = run_cell(plan, cell, fresh=args.force)
        print(f"[{i}/{len(cells)}] {cell['name']}: exit {code} after {time.monotonic() - start:.0f} s", flush=True)
        if code == 143:  # SIGTERM: the cell saved last.ckpt; stop the sweep (rerun it to continue)
            return 143
        if code:
            failed.append(cell["name"])
    if args.list:
        return 0
    from ptm_app.report import write_report

    runs = [str(runs_root() / run_name(plan, c)) for c in plan["cells"] if (runs_root() / run_name(plan, c)).is_dir()]
    if runs:
        md, _ = write_report(runs, runs_root() / plan["name"], by="data", stages=("test/",) if plan.get("test") else
                             ("val/",))
        print(md.read_text(), end="")
        print(f"wrote {md} and {md.with_suffix('.csv')}")
    if failed:
        raise PtmError(f"sweep: {len(failed)} cell(s) failed: {', '.join(failed)}; see their output above")
    return 0
