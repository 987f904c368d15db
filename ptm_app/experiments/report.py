"""``python main.py report RUN_DIR_OR_GLOB ... [--output results]``: a results table (Markdown + CSV)
built from the runs' ``summary.json`` files (written by ``RunSummary``), never typed by hand."""
from __future__ import annotations

import csv
import glob
import json
import re
from pathlib import Path
from typing import Literal, Optional, Union

from ptm_app.errors import PtmError
from ptm_app.paths import atomic_file, runs_root, write_between_markers

COLUMNS = ["run", "style", "module", "backbone", "data", "trainable_params", "trainable_percent", "last_ckpt_mb",
           "fit_seconds"]
METRIC_PREFIXES = ("test/", "val/")
FORMATS = {"trainable_percent": "{:.3g}", "last_ckpt_mb": "{:.1f}", "fit_seconds": "{:.0f}"}  # metrics: 4 decimals


def matched_runs(patterns: list[str]) -> list[Path]:
    """Run directories (with a ``summary.json``) matched by ``patterns``: names under checkpoints/, paths or globs."""
    runs = []
    for pattern in patterns:
        matches = glob.glob(pattern) or glob.glob(str(runs_root() / pattern))
        runs += [run for run in sorted(Path(m) for m in matches) if (run / "summary.json").is_file()]
    return runs


def collect(patterns: list[str]) -> list[dict]:
    """Summaries of every run directory matched by ``patterns`` (names under checkpoints/ or paths/globs)."""
    rows = [{"run": run.name, **json.loads((run / "summary.json").read_text())} for run in matched_runs(patterns)]
    if not rows:
        raise PtmError(f"no run directories with a summary.json match {' '.join(patterns)}; "
                       f"run 'fit' (and 'test') first, or check the path")
    return rows


def table(rows: list[dict], stages: tuple[str, ...] = METRIC_PREFIXES,
          drop: tuple[str, ...] = ()) -> tuple[list[str], list[list[str]]]:
    """Header and formatted cells: the fixed columns but ``drop``, then every metric of ``stages`` the rows have."""
    metric_names = sorted(metric_columns([rows], stages), key=lambda k: (not k.startswith("test/"), k))
    columns = [c for c in COLUMNS if c not in drop]
    header = columns + metric_names
    body = []
    for r in rows:
        cells = [(c, r.get(c, "")) for c in columns] + [(m, r.get("metrics", {}).get(m, "")) for m in metric_names]
        body.append([FORMATS.get(name, "{:.4f}").format(c) if isinstance(c, float) else
                     f"{c:,}" if isinstance(c, int) else str(c) for name, c in cells])
    return header, body


def markdown(rows: list[dict], by: Optional[str] = None, stages: tuple[str, ...] = METRIC_PREFIXES) -> str:
    """One table, or with ``by`` (e.g. ``data``) one table per value, each with only its rows' metric columns."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(str(r.get(by, "")) if by else "", []).append(r)
    parts = []
    for name, group in groups.items():
        header, body = table(group, stages, drop=(by,) if by else ())
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        parts.append((f"### {by}: {name}\n\n" if by else "") + "\n".join(lines) + "\n")
    return "\n".join(parts)


def write_report(patterns: list[str], output: str | Path, by: Optional[str] = None,
                 stages: tuple[str, ...] = METRIC_PREFIXES) -> tuple[Path, Path]:
    """``output``.md (``markdown``) and ``output``.csv (every run and metric in one flat table)."""
    rows = collect(patterns)
    output = Path(output)
    md, csv_path = output.with_suffix(".md"), output.with_suffix(".csv")
    with atomic_file(md, "w", encoding="utf-8") as fh:
        fh.write(markdown(rows, by, stages))
    header, body = table(rows)
    with atomic_file(csv_path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(body)
    return md, csv_path


def report(runs: list[str], output: str = "results", by: Optional[Literal["data", "style", "module", "backbone"]] = None,
           stages: list[Literal["test", "val"]] = ["test", "val"], over_seeds: bool = False) -> int:
    """A results table (Markdown + CSV) from the runs' summary.json files.

    Args:
        runs: run directories, run names under checkpoints/, or globs.
        output: output path without suffix (writes .md and .csv).
        by: one Markdown table per value of this column (the CSV stays one table).
        stages: whose metrics the Markdown shows (the CSV has all).
        over_seeds: also write ``output``_seeds.md (+ .png, ``draw_seeds``): runs whose names differ only in a
            ``seed<N>`` part (``x-seed1``, ``x-seed2``, as ``sweep`` names them) are one cell, reported as mean ±
            std with a 95 % t interval over their seeds (``experiments.stats``); ``by`` splits it as above.
    """
    prefixes = tuple(f"{s}/" for s in stages)
    md, csv_path = write_report(runs, output, by, prefixes)
    print(md.read_text(), end="")
    print(f"wrote {md} and {csv_path}")
    if over_seeds:
        seeds_md = write_seed_report(seed_groups(runs), f"{output}_seeds", prefixes, by=by)
        print(seeds_md.read_text(), end="")
        print(f"wrote {seeds_md} and {seeds_md.with_suffix('.png')}")
    return 0


SEED_PART = re.compile(r"(?:^|[-_.])seed\d+(?=$|[-_.])")


def seed_groups(patterns: list[str]) -> dict[str, list[str]]:
    """Run directories matched by ``patterns`` grouped into cells: a name without its ``seed<N>`` part.  Two runs of
    one cell that recorded the same seed (``summary.json``'s ``seed``) are refused: they are not seeds of it."""
    groups: dict[str, list[str]] = {}
    seen: dict[tuple[str, int], str] = {}
    for row, path in zip(collect(patterns), matched_runs(patterns)):
        cell = SEED_PART.sub("", row["run"]) or row["run"]
        if "seed" in row:
            other = seen.setdefault((cell, row["seed"]), row["run"])
            if other != row["run"]:
                raise PtmError(f"runs {other} and {row['run']} both ran seed {row['seed']}: they are not seeds of one "
                               f"cell; rename one or leave it out of the report")
        groups.setdefault(cell, []).append(str(path))
    return groups


HEADLINE_METRICS = ("macro", "entity_f1", "em", "acc", "f1_macro", "rougeL", "mcc", "f1")  # the figure's, in turn


def write_seed_report(groups: dict[str, list[str]], output: str | Path,
                      stages: tuple[str, ...] = ("test/",), baseline: Union[str, dict, None] = None,
                      by: Optional[str] = None) -> Path:
    """``output``.md: one row per group of runs (the same cell over seeds), per metric of ``stages`` the mean ± std
    and 95 % t interval over the runs that logged it (``experiments.stats.summarize``; one run: an observation).
    With ``baseline`` (a group, or a mapping of groups to the group each is compared with), each other group's
    paired difference from its baseline per metric, on the seeds both ran (``summary.json``'s ``seed``;
    ``stats.paired``).  With ``by`` (e.g. ``data``), one pair of tables per value, each with only its cells' metric
    columns.  ``output``.png: per table, its headline metric (``HEADLINE_METRICS``) as mean and interval per cell."""
    from ptm_app.analysis.figures import save_png

    summaries = {name: collect(runs) for name, runs in groups.items()}
    parts: dict[str, list[str]] = {}
    for name, rows in summaries.items():
        parts.setdefault(str(rows[0].get(by, "")) if by else "", []).append(name)
    tables = [(f"### {by}: {part}\n\n" if by else "") + seed_tables(summaries, names, stages, baseline)
              for part, names in parts.items()]
    md = Path(output).with_suffix(".md")
    with atomic_file(md, "w", encoding="utf-8") as fh:
        fh.write("Mean ± std [95 % t interval] over seeds (experiments.stats); one seed is an observation.\n\n")
        fh.write("\n".join(tables))
    save_png(draw_seeds(summaries, parts, stages, by), md.with_suffix(".png"))
    return md


def seed_values(rows: list[dict], metric: str) -> dict:
    """``{seed: value}`` of ``metric`` over the runs that recorded both."""
    return {r["seed"]: r["metrics"][metric] for r in rows
            if "seed" in r and isinstance(r.get("metrics", {}).get(metric), (int, float))}


def seed_tables(summaries: dict[str, list[dict]], names: list[str], stages: tuple[str, ...],
                baseline: Union[str, dict, None]) -> str:
    """The seeds table of the cells ``names`` and, with ``baseline``, their paired differences (Markdown)."""
    from ptm_app.experiments.stats import paired, summarize

    metrics = metric_columns([summaries[n] for n in names], stages)
    lines = ["| cell | seeds | " + " | ".join(metrics) + " |", "|---|---|" + "---|" * len(metrics)]
    for name in names:
        rows = summaries[name]
        cells = []
        for m in metrics:
            values = [r["metrics"][m] for r in rows if isinstance(r.get("metrics", {}).get(m), (int, float))]
            cells.append(summarize(values).text() if values else "")
        lines.append(f"| {name} | {len(rows)} | " + " | ".join(cells) + " |")
    if baseline is not None:
        against = ({n: b for n, b in baseline.items() if n in names} if isinstance(baseline, dict)
                   else {n: baseline for n in names if n != baseline})
        against = {n: b for n, b in against.items() if b in summaries}  # a baseline not run yet: no pairs to show
        if against:
            one = f"cell − {baseline}" if isinstance(baseline, str) else "cell − its baseline"
            lines += ["", f"Paired difference: {one}, on the seeds both ran (95 % t interval, exact sign-flip "
                          f"p; * the interval excludes 0):", "",
                      "| cell | baseline | pairs | " + " | ".join(metrics) + " |",
                      "|---|---|---|" + "---|" * len(metrics)]
        for name, base in against.items():
            cells, pairs = [], 0
            for m in metrics:
                mine, theirs = seed_values(summaries[name], m), seed_values(summaries.get(base, []), m)
                keys = sorted(set(mine) & set(theirs))
                pairs = max(pairs, len(keys))
                cells.append(paired([mine[k] for k in keys], [theirs[k] for k in keys]).text() if keys else "")
            lines.append(f"| {name} | {base} | {pairs} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def metric_columns(row_lists: list[list[dict]], stages: tuple[str, ...]) -> list[str]:
    """The sorted metric names of ``stages`` that any of the runs logged (not the per-step copies)."""
    return sorted({k for rows in row_lists for r in rows for k in r.get("metrics", {})
                   if k.startswith(stages) and not k.endswith("_step")})


def headline_metric(metrics: list[str]) -> Optional[str]:
    """The first of ``HEADLINE_METRICS`` among ``metrics`` (by the name's last part), else the first non-loss one."""
    last = {m.rsplit("/", 1)[-1]: m for m in reversed(metrics)}
    for name in HEADLINE_METRICS:
        if name in last:
            return last[name]
    return next((m for m in metrics if not m.endswith("loss")), metrics[0] if metrics else None)


def draw_seeds(summaries: dict[str, list[dict]], parts: dict[str, list[str]], stages: tuple[str, ...],
               by: Optional[str] = None):
    """One panel per table: each cell's mean of the table's headline metric, with its 95 % t interval as a bar
    (one seed: a hollow dot, no bar), in the table's order top down."""
    from ptm_app.analysis.figures import new_figure
    from ptm_app.experiments.stats import summarize

    fig, axes = new_figure(len(parts), width=4.6, height=0.32 * max(len(n) for n in parts.values()) + 1.3)
    for ax, (part, names) in zip(axes, parts.items()):
        metric = headline_metric(metric_columns([summaries[n] for n in names], stages))
        for y, name in enumerate(names):
            values = [r["metrics"][metric] for r in summaries[name]
                      if metric and isinstance(r.get("metrics", {}).get(metric), (int, float))]
            if not values:
                continue
            s = summarize(values)
            if s.interval is None:
                ax.plot(s.mean, y, "o", mfc="none", color="C0")
            else:
                ax.errorbar(s.mean, y, xerr=[[s.mean - s.interval[0]], [s.interval[1] - s.mean]], fmt="o",
                            color="C0", capsize=3)
        ax.set_yticks(range(len(names)), names, fontsize="x-small")
        ax.set_ylim(len(names) - 0.5, -0.5)  # the table's order, top down
        what = f"{metric} (mean, 95 % interval)" if metric else "no metric logged"
        ax.set_title(f"{part + ': ' if by else ''}{what}", fontsize="small")
        ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig


def publish(md: Path, readme: Optional[str], name: str, also: str, command: str, failed: list[str]) -> int:
    """Print a report's table, put it into ``readme`` between ``<!-- name:start/end -->`` (when given) with its
    figure (``md``'s ``.png``, if the report drew one) copied to ``name.png`` in the page's figures folder, say what
    was written (``md`` and ``also``), and end in one line naming the runs that failed (the report commands'
    ending)."""
    from ptm_app.analysis.tables import copy_figure

    print(md.read_text(encoding="utf-8"), end="")
    if readme:
        write_between_markers(readme, name, md.read_text(encoding="utf-8"))
        if md.with_suffix(".png").is_file():
            copy_figure(md.with_suffix(".png"), readme, name)
    print(f"wrote {md} {also}")
    if failed:
        raise PtmError(f"{command}: {len(failed)} run(s) failed: {', '.join(failed)}; see their output above")
    return 0
