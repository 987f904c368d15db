"""Chains of sweep cells: a first run (a pre-training, an adapter) and the runs that start from what it made (its
export, fine-tuned per task), as ``knowledge-report`` and ``taxonomy-report`` run them.

Every run is a sweep cell (``sweep.run_cell``): resumed from ``last.ckpt`` when interrupted, skipped when it has test
metrics and was made by the same recipe.  A run that starts from a first run has that run's fingerprint in its own
(``cell.json``'s ``upstream``), so a changed pre-training reruns its fine-tunings.  A report counts a run only when
it is the one the plan makes now (``current_runs``): a run made by an earlier recipe, an earlier ``task_set`` or from
an earlier pre-training is left out until the plan runs it again.  With ``--ledger DIR`` each finished run's results
are kept in DIR (``sweep.write_entry``) and a run whose directory is gone counts as done when its ledger entry is
current (``restore_chain``); a first run is remade so only when nothing left to run starts from its weights.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from ptm_app.errors import PtmError
from ptm_app.experiments.sweep import (cell_fingerprint, forget_remade, is_current, is_done, is_restored, record_cell,
                                      restore_entry, run_cell, run_name, write_entry)
from ptm_app.paths import read_object, require_markers, runs_root, write_json


@dataclass(frozen=True)
class Link:
    """One run of a chain: ``row`` (the chain it belongs to), the sweep ``cell``, the ``common`` overrides it shares
    with its kind of run, whether it is a ``first`` run (the others start from the row's first runs), ``after``:
    what to do with its run directory once it is done (export a pre-training), and ``fitted``: for a run that is
    only fitted, never tested (a pre-training whose module has no test step), when its fit is complete."""

    row: str
    cell: dict
    common: dict
    first: bool
    after: Optional[Callable[[Path], object]] = None
    fitted: Optional[Callable[[Path], bool]] = None


def cell_plan(plan_name: str, link: Link) -> dict:
    """The one-cell sweep plan a link runs as: the plan's name, its kind's common overrides, and whether it is
    tested (a first run only fitted is not)."""
    return {"name": plan_name, "set": link.common, "test": link.fitted is None}


def planned(plan_name: str, links: list[Link]) -> list[tuple[Link, Path, str, list[str]]]:
    """Each link with its run directory, the fingerprint of the run the plan makes there now (``cell_fingerprint``:
    its recipe, its kind's common overrides and, for a run that starts from its row's first runs, their
    fingerprints), and those first runs' fingerprints (none for a first run)."""
    out, upstream = [], {}  # per row: the fingerprints of its first runs
    for link in links:
        starts_from = [] if link.first else list(upstream.get(link.row, []))
        fingerprint = cell_fingerprint(cell_plan(plan_name, link), link.cell, starts_from)
        if link.first:
            upstream.setdefault(link.row, []).append(fingerprint)
        out.append((link, runs_root() / run_name({"name": plan_name}, link.cell), fingerprint, starts_from))
    return out


def current_runs(plan_name: str, links: list[Link]) -> dict[Path, str]:
    """Run directory -> the fingerprint of the run the plan makes there now; a report counts a run only when
    ``is_current(run, current_runs(...)[run])``."""
    return {where: fingerprint for _, where, fingerprint, _ in planned(plan_name, links)}


def link_done(link: Link, where: Path, fingerprint: str) -> bool:
    """The run is finished and made by its current recipe: tested, or for a run only fitted, ``link.fitted``."""
    if link.fitted is None:
        return is_done(where, fingerprint)
    return is_current(where, fingerprint) and link.fitted(where)


def restore_chain(plan_name: str, links: list[Link], ledger: Path,
                  first_ok: Callable[[Link, str], bool] = lambda link, fingerprint: True) -> list[str]:
    """Remake from ``ledger`` (``sweep.restore_entry``: results only) the runs whose directory is gone and whose
    entry is current: every later run, and a first run only when every later run of its row is then done (the
    ledger keeps no weights, and nothing will start from it) and ``first_ok(link, its fingerprint)`` (e.g. its
    probe is in the ledger too).  Returns the cells' names."""
    items = planned(plan_name, links)
    restored = [link.cell["name"] for link, where, fingerprint, _ in items
                if not link.first and restore_entry(ledger, where, fingerprint)]
    for link, where, fingerprint, _ in items:
        later = [(other, w, f) for other, w, f, _ in items if other.row == link.row and not other.first]
        if (link.first and all(link_done(*item) for item in later) and first_ok(link, fingerprint)
                and restore_entry(ledger, where, fingerprint)):
            restored.append(link.cell["name"])
    return restored


def write_chain_entries(plan_name: str, links: list[Link], ledger: Path) -> int:
    """``sweep.write_entry`` of every finished current run of the chain; returns how many it wrote."""
    return sum(write_entry(ledger, where) for link, where, fingerprint, _ in planned(plan_name, links)
               if link_done(link, where, fingerprint))


def merge_json(source: Path, target: Path, overwrite: bool,
               current: Optional[Callable[[str, object], bool]] = None) -> bool:
    """Add to ``target`` (a JSON object) the entries of ``source`` it lacks (``overwrite``: and those it holds
    otherwise); returns whether it wrote.  Kept derived results (a plan's ``probe.json``: one entry per model and
    seed, each naming the run it was made from) move so between a runs directory and a ledger.  With ``current``
    (key, entry -> made from the run the plan makes now?), an entry both hold is the current one of the two
    whichever way it moves (a stale local probe never hides the ledger's current one, nor replaces it)."""
    if not source.is_file():
        return False
    new, old = read_object(source), read_object(target) if target.is_file() else {}
    merged = dict(old)
    for key, entry in new.items():
        take = key not in old or overwrite
        if key in old and current is not None and current(key, entry) != current(key, old[key]):
            take = current(key, entry)
        if take:
            merged[key] = entry
    if merged == old:
        return False
    write_json(target, merged)
    return True


def run_chain(plan_name: str, links: list[Link], command: str, stop_on_bad_input: bool = False) -> list[str]:
    """Run every link that is not done, in order; a row whose first run failed runs nothing more.  Returns the
    names of the cells that failed.  A SIGTERM stops at once (exit 143 raised as one line); with
    ``stop_on_bad_input`` a run refused as bad input (exit 2, its one line printed) stops the chain too, raised as
    ``BadInput`` (nothing more to print)."""
    failed, items = [], planned(plan_name, links)
    for link, where, fingerprint, _ in items:  # a first run remade from the ledger whose weights are needed again
        if link.first and is_restored(where) and not all(
                link_done(other, w, f) for other, w, f, _ in items if other.row == link.row and not other.first):
            forget_remade(where)
    for i, (link, where, fingerprint, starts_from) in enumerate(items, 1):
        if any(f == link.row for f, _ in failed):
            continue  # an earlier run of this row failed (its pre-training, an adapter): nothing to start from
        if not link_done(link, where, fingerprint):
            start = time.monotonic()
            print(f"[{i}/{len(links)}] {link.cell['name']}: {link.cell['config']}", flush=True)
            code = run_cell(cell_plan(plan_name, link), link.cell, upstream=starts_from)
            print(f"[{i}/{len(links)}] {link.cell['name']}: exit {code} after {time.monotonic() - start:.0f} s",
                  flush=True)
            if code == 143:
                raise PtmError(f"{command} stopped by SIGTERM in {link.cell['name']}; run it again to continue")
            if code == 2 and stop_on_bad_input:
                raise BadInput(link.cell["name"])
            if code:
                failed.append((link.row, link.cell["name"]))
                continue
        else:
            record_cell(where, fingerprint, link.cell, starts_from)  # a run from before fingerprints: adopted
        if link.after is not None and not is_restored(where):  # a run remade from its ledger entry has no weights
            link.after(where)
    return [name for _, name in failed]


class BadInput(Exception):
    """A run of a chain refused its input (its one line is printed); the command exits 2 without more."""


def export_once(run: Path) -> Path:
    """``<run>/export``: the pre-trained model the tasks start from (written once, from ``last.ckpt``)."""
    out = run / "export"
    if not (out / "config.json").is_file():
        from ptm_app.backbones.build import quiet_transformers
        from ptm_app.inference.export import export_checkpoint

        with quiet_transformers():
            export_checkpoint(run, out)
    return out


def export_overrides(export: Path) -> dict[str, str]:
    """A task config's overrides that start it from ``export`` (its weights and its tokenizer); JSON strings, as the
    first plans passed them (the cells' fingerprints stay the same)."""
    return {"model.init_args.backbone": str(export), "data.init_args.tokenizer": json.dumps({"pretrained": str(export)})}


def summary(run: Path) -> dict:
    """``<run>/summary.json`` ({} when the run has none)."""
    path = run / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def summary_metrics(run: Path) -> dict:
    return summary(run).get("metrics", {})


@dataclass(frozen=True)
class ChainLedger:
    """How a chain report keeps its results in a ledger (``--ledger``): every link of its plan, the derived files
    it keeps beside the runs' entries (JSON objects under ``runs_root()/<plan name>/``, merged both ways:
    ``merge_json``), and which first runs may be remade from their entries (``restore_chain``'s
    ``first_ok``)."""

    links: Callable[[dict], list[Link]]
    files: tuple[str, ...] = ()
    first_ok: Callable[[dict, Link, str], bool] = lambda plan, link, fingerprint: True
    current_entry: Optional[Callable[[dict], Callable[[str, object], bool]]] = None  # plan -> (key, entry) -> current?

    def restore(self, plan: dict, ledger: Path) -> list[str]:
        for name in self.files:
            merge_json(ledger / name, runs_root() / plan["name"] / name, overwrite=False, current=self._current(plan))
        return restore_chain(plan["name"], self.links(plan), ledger,
                             lambda link, fingerprint: self.first_ok(plan, link, fingerprint))

    def keep(self, plan: dict, ledger: Path) -> int:
        kept = write_chain_entries(plan["name"], self.links(plan), ledger)
        return kept + sum(merge_json(runs_root() / plan["name"] / name, ledger / name, overwrite=True,
                                     current=self._current(plan)) for name in self.files)

    def _current(self, plan: dict) -> Optional[Callable[[str, object], bool]]:
        return None if self.current_entry is None else self.current_entry(plan)


def chain_command(command: str, path: str, plan: dict, rows: list[str], kind: str, only: Optional[list[str]],
                  readme: Optional[str], collect_only: bool, run: Callable[[dict, Optional[list[str]]], list[str]],
                  write: Callable[[dict], Path], also: str, ledger: Optional[str] = None,
                  how: Optional[ChainLedger] = None, seeds: Optional[list[int]] = None) -> int:
    """A chain report command: check ``--readme``'s markers and ``--only``'s ids (of ``rows``, each a ``kind``; with
    ``seeds``, also ``<id>/seed<N>``: one seed's chain) before anything runs, remake what ``ledger`` holds (``how``),
    ``run`` the plan (unless ``collect_only``), keep the finished runs' entries, ``write`` the report, print it and
    put it into the readme; the failed runs are one line at the end (a run refused as bad input has said its line:
    exit 2)."""
    if readme:
        require_markers(readme, plan["name"])
    one_seed = {f"{row}/seed{seed}" for row in rows for seed in seeds or []}
    unknown = sorted(set(only or []) - set(rows) - one_seed)
    if unknown:
        also = f"; one seed's chain: {rows[0]}/seed<N>, N one of {', '.join(map(str, seeds))}" if seeds else ""
        raise PtmError(f"--only {' '.join(unknown)}: no such {kind} in {path} ({', '.join(rows)}{also})")
    if ledger and how is not None:
        restored = how.restore(plan, Path(ledger))
        if restored:
            print(f"{len(restored)} run(s) done before, restored from {ledger} (results only, no weights): "
                  f"{', '.join(restored[:5])}{', ...' if len(restored) > 5 else ''}", flush=True)
    try:
        failed = [] if collect_only else run(plan, only)
    except BadInput:
        return 2
    finally:  # after a SIGTERM too; a ledger that cannot be written says so without hiding why the run stopped
        try:
            if ledger and how is not None and how.keep(plan, Path(ledger)):
                print(f"kept the finished runs' results in {ledger}", flush=True)
        except PtmError as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
    from ptm_app.experiments.report import publish

    return publish(write(plan), readme, plan["name"], also, command, failed)
