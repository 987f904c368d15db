"""``python main.py sweep PLAN.yaml [--only GLOB ...] [--list]``: run a grid of configs (fit, then test from
the best checkpoint), one run directory per cell, then write the plan's results table with ``report``.

A plan is YAML: ``name`` (run directories are ``<name>-<cell>``), ``common`` (arguments added to every fit and
test, e.g. a step budget), ``test: true`` to test each cell's best checkpoint (``last`` for cells that do not
fit), and ``cells``: ``{name, config, args, fit}`` each (``fit: false`` for zero-shot cells that only test).
A cell whose run directory already has test metrics is skipped and an interrupted fit resumes exactly from its
``last.ckpt``, so a stopped sweep (Ctrl-C, SIGTERM) continues where it stopped; ``--force`` reruns from scratch.  The table is ``<runs>/<name>.md`` and ``.csv``, built from the runs'
``summary.json`` files.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import time
from pathlib import Path

import yaml

from ptm_app.errors import PtmError
from ptm_app.paths import runs_root

CELL_KEYS = {"name", "config", "args", "fit"}


def load_plan(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise PtmError(f"sweep plan {path} not found; give a YAML file like configs/adapt/table_minilm.yaml")
    plan = yaml.safe_load(path.read_text()) or {}
    unknown = set(plan) - {"name", "common", "test", "cells"}
    if unknown or not plan.get("name") or not plan.get("cells"):
        raise PtmError(f"sweep plan {path}: needs 'name' and 'cells' (optional 'common', 'test'); "
                       f"unknown keys: {sorted(unknown) or 'none'}")
    for cell in plan["cells"]:
        bad = set(cell) - CELL_KEYS
        if bad or "name" not in cell or "config" not in cell:
            raise PtmError(f"sweep plan {path}: cell {cell.get('name', '?')} needs 'name' and 'config' "
                           f"(optional 'args', 'fit'); unknown keys: {sorted(bad) or 'none'}")
        if not Path(cell["config"]).is_file():
            raise PtmError(f"sweep plan {path}: cell {cell['name']}: config {cell['config']} not found")
    return plan


def run_name(plan: dict, cell: dict) -> str:
    return f"{plan['name']}-{cell['name'].replace('/', '-')}"


def is_done(run_dir: Path) -> bool:
    summary = run_dir / "summary.json"
    return summary.is_file() and any(k.startswith("test/") for k in json.loads(summary.read_text()).get("metrics", {}))


def run_cell(plan: dict, cell: dict, fresh: bool = False) -> int:
    """Fit (resuming an interrupted fit from its ``last.ckpt`` unless ``fresh``), then test."""
    from ptm_app.cli import run_lightning
    from ptm_app.config_errors import guarded

    name, common = run_name(plan, cell), [str(a) for a in plan.get("common") or []]
    base = ["--config", cell["config"], *common, *[str(a) for a in cell.get("args") or []], "--run_name", name]
    fits = cell.get("fit", True)
    if fits:
        resume = not fresh and (runs_root() / name / "checkpoints" / "last.ckpt").exists()
        code = guarded(run_lightning, ["fit", *base, *(["--ckpt_path", "last"] if resume else [])])
        if code:
            return code
    if plan.get("test", True):
        return guarded(run_lightning, ["test", *base, *(["--ckpt_path", "best"] if fits else [])])
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
        done = is_done(run_dir)
        if args.list:
            print(f"{cell['name']:40s} {'done' if done else 'todo'}  {run_dir}")
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
