"""Analysis tables, generated from the computed numbers (never typed): ``NAME.md``, ``NAME.csv`` and ``NAME.json``
side by side (the format of ``ptm_app.experiments.report``: floats with 4 decimals in the Markdown and CSV, full precision in
the JSON)."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Optional, Sequence

from ptm_app.paths import atomic_file, require_markers, write_between_markers, write_json


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def markdown(rows: Sequence[dict], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_table(rows: Sequence[dict], columns: Sequence[str], stem: str | Path, title: str = "") -> Path:
    """Write ``stem``.md / .csv / .json; returns the Markdown path."""
    stem = Path(stem)
    md = stem.with_suffix(".md")
    with atomic_file(md, "w", encoding="utf-8") as fh:
        fh.write((f"### {title}\n\n" if title else "") + markdown(rows, columns))
    with atomic_file(stem.with_suffix(".csv"), "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        writer.writerows([cell(r.get(c)) for c in columns] for r in rows)
    write_json(stem.with_suffix(".json"), [{c: r.get(c) for c in columns} for r in rows])
    return md


def check_readme(readme: Optional[str], out: Path) -> None:
    """Refuse a ``readme`` page without the run's markers before the analysis runs, not after."""
    if readme:
        require_markers(readme, out.name)


def show(mds: Sequence[Path], readme: Optional[str], out: Path, figure: Optional[Path] = None) -> None:
    """The analysis commands' ending: print their tables and, with ``readme``, write them into that page between
    the ``<!-- NAME:start/end -->`` lines of the output directory's name, and copy ``figure`` to ``NAME.png`` in
    the page's figures folder (``figures_dir``), so no docs table or picture is put there by hand."""
    text = "\n".join(md.read_text(encoding="utf-8") for md in mds)
    if readme:
        write_between_markers(readme, out.name, text)
        if figure is not None:
            copy_figure(figure, readme, out.name)
    print(text, end="")


def copy_figure(figure: Path, readme: str, name: str) -> Path:
    """Copy ``figure`` to ``NAME.png`` in the page's figures folder (``figures_dir``), atomically; returns where."""
    where = figures_dir(Path(readme)) / f"{name}.png"
    with atomic_file(where, "wb") as fh:
        fh.write(figure.read_bytes())
    return where


def figures_dir(page: Path) -> Path:
    """The ``figures`` folder of the page's nearest folder that has one (docs/results/x.md -> docs/figures), else
    ``figures`` beside the page."""
    for folder in Path(page).resolve().parents:
        if (folder / "figures").is_dir():
            return folder / "figures"
    return Path(page).parent / "figures"
