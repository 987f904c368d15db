"""``python main.py plot RUN_DIR... [--metrics train/loss val/acc ...] [--output FILE.png]``: the runs' logged
curves (``logs/metrics.csv``) in one PNG, one panel per metric and one line per run.

A resumed run is one continuous curve: its ``metrics.csv`` files (``logs/metrics.csv``, or Lightning's
``logs/version_N/metrics.csv``) are read in order, and where a later segment logs a step again (a resume from an
earlier checkpoint) the later values replace everything from that step on.
"""
from __future__ import annotations

import csv
import glob
import math
import re
from pathlib import Path
from typing import Optional

from ptm_app.errors import PtmError
from ptm_app.paths import runs_root

Curve = tuple[list[int], list[float]]
THROUGHPUT = "throughput/tokens_per_s"


def run_dirs(patterns: list[str]) -> list[Path]:
    """Run directories named by ``patterns`` (paths, globs, or names under the runs root), in order, once each."""
    found: list[Path] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) or sorted(glob.glob(str(runs_root() / pattern)))
        if not matches:
            raise PtmError(f"run {pattern!r} not found (neither a path nor a run under {runs_root()}); "
                           f"give a run directory or glob")
        found += [Path(m) for m in matches if Path(m) not in found]
    return found


def metric_files(run: Path) -> list[Path]:
    """The run's ``metrics.csv`` files, oldest first (``version_N`` by N, then the run's own log)."""
    def order(path: Path) -> tuple[int, float]:
        version = re.search(r"version_(\d+)", str(path.relative_to(run)))
        return (int(version.group(1)) if version else 1 << 30, path.stat().st_mtime)

    files = sorted((Path(p) for p in glob.glob(str(run / "logs" / "**" / "metrics.csv"), recursive=True)), key=order)
    if not files:
        raise PtmError(f"{run} has no logs/metrics.csv; give a run directory written by 'fit'")
    return files


def read_curves(run: Path) -> dict[str, Curve]:
    """Every logged metric of ``run`` as ``(steps, values)``, the resumed segments joined into one curve."""
    points: dict[str, list[tuple[int, float]]] = {}
    for path in metric_files(run):
        with open(path, newline="", encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                try:
                    step = int(float(row.get("step") or ""))
                except ValueError:
                    continue
                for name, text in row.items():
                    if name in ("step", "epoch") or name is None or text in ("", None):
                        continue
                    value = float(text)
                    if not math.isfinite(value):
                        continue
                    series = points.setdefault(name, [])
                    if series and step <= series[-1][0]:  # a resumed segment logs this step again: it wins
                        series[:] = [p for p in series if p[0] < step]
                    series.append((step, value))
    return {name: ([s for s, _ in pts], [v for _, v in pts]) for name, pts in points.items()}


def default_metrics(curves: list[dict[str, Curve]]) -> list[str]:
    """``train/loss``, every validation metric (not per-step duplicates), and tokens per second."""
    names = set().union(*curves)
    val = sorted(n for n in names if n.startswith("val/") and not n.endswith("_step"))
    return [n for n in ("train/loss", *val, THROUGHPUT) if n in names]


def draw(curves: dict[str, dict[str, Curve]], metrics: list[str]):
    """A figure with one panel per metric and, in each, one line per run that logged it."""
    from ptm_app.analysis.figures import new_figure

    fig, axes = new_figure(len(metrics))
    for ax, metric in zip(axes, metrics):
        for run, run_curves in curves.items():
            if metric in run_curves:
                steps, values = run_curves[metric]
                ax.plot(steps, values, marker="." if len(steps) < 30 else None, label=run)
        ax.set_title(metric)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def plot(runs: list[str], metrics: Optional[list[str]] = None, output: Optional[str] = None) -> Path:
    """Draw the runs' logged metrics against steps into one PNG.

    Args:
        runs: run directories, run names under the runs root (checkpoints/), or globs.
        metrics: metric names as logged (``train/loss``, ``val/acc`` ...); default: the training loss, every
            validation metric and ``throughput/tokens_per_s``.
        output: the PNG to write; default ``RUN/metrics.png`` for one run, ``<runs root>/plots/A_vs_B.png`` for
            several.
    """
    from ptm_app.analysis.figures import save_png

    dirs = run_dirs(runs)
    curves = {d.name: read_curves(d) for d in dirs}
    available = sorted(set().union(*curves.values()))
    chosen = list(metrics) if metrics else default_metrics(list(curves.values()))
    unknown = [m for m in chosen if m not in available]
    if unknown or not chosen:
        raise PtmError(f"metric {unknown[0] if unknown else '(none)'} is not logged by {', '.join(curves)}; "
                       f"logged: {', '.join(available) or 'nothing'}")
    target = Path(output) if output else (dirs[0] / "metrics.png" if len(dirs) == 1 else
                                          runs_root() / "plots" / ("_vs_".join(curves) + ".png"))
    if target.suffix.lower() != ".png":
        raise PtmError(f"--output {target}: give a .png file name")
    return save_png(draw(curves, chosen), target)
