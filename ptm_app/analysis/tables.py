"""Analysis tables, generated from the computed numbers (never typed): ``NAME.md``, ``NAME.csv`` and ``NAME.json``
side by side (the format of ``ptm_app.experiments.report``: floats with 4 decimals in the Markdown and CSV, full precision in
the JSON)."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Sequence

from ptm_app.paths import atomic_file, write_json


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
