"""Read records from local files: JSONL, CSV/TSV, plain text, Parquet.

Every record comes with its 1-based line number so that bad input is reported as ``file:line``.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Iterator

from ptm_app.errors import DataFormatError, PtmError

SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".txt", ".parquet")


def read_records(path: str | Path, required: tuple[str, ...] = ()) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, record)``; a missing field or a malformed line raises ``DataFormatError``.

    Plain ``.txt`` files yield one record per document: documents are separated by blank lines
    and each non-blank line becomes one line of the ``text`` field.
    """
    path = Path(path)
    if not path.is_file():
        raise PtmError(f"data file {path} does not exist; check the path or run: python main.py data prepare")
    reader = {
        ".jsonl": _jsonl, ".json": _jsonl, ".csv": _csv, ".tsv": _csv, ".txt": _txt, ".parquet": _parquet,
    }.get(path.suffix.lower())
    if reader is None:
        raise PtmError(f"data file {path}: unsupported format '{path.suffix}'; use one of {', '.join(SUFFIXES)}")
    for line, record in reader(path):
        for field in required:
            if field not in record or record[field] is None:
                raise DataFormatError(path, line, f"missing field '{field}'", "add it, or point the data module's *_field option at the right column")
        yield line, record


def _jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataFormatError(path, line_no, f"malformed JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(record, dict):
                raise DataFormatError(path, line_no, "expected a JSON object per line")
            yield line_no, record


def _csv(path: Path) -> Iterator[tuple[int, dict]]:
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh, delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
        for record in reader:
            if None in record:
                raise DataFormatError(path, reader.line_num, "more columns than the header")
            yield reader.line_num, record


def _txt(path: Path) -> Iterator[tuple[int, dict]]:
    lines: list[str] = []
    start = 1
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if line.strip():
                if not lines:
                    start = line_no
                lines.append(line.strip())
            elif lines:
                yield start, {"text": "\n".join(lines)}
                lines = []
    if lines:
        yield start, {"text": "\n".join(lines)}


def _parquet(path: Path) -> Iterator[tuple[int, dict]]:
    import pyarrow.parquet as pq

    for row, record in enumerate(pq.read_table(path).to_pylist(), 1):
        yield row, record


def split_files(source: str | Path, splits=("train", "validation", "test")) -> dict[str, Path]:
    """Map split names to files in a directory (``train.jsonl``, ``validation.csv`` ...)."""
    source = Path(source)
    found = {}
    for split in splits:
        for suffix in SUFFIXES:
            candidate = source / f"{split}{suffix}"
            if candidate.is_file():
                found[split] = candidate
                break
    if "train" not in found:
        raise PtmError(f"no train split in {source}: expected train.jsonl (or .csv/.tsv/.txt/.parquet)")
    return found
