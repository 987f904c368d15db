"""The texts an inference command works on: ``--text`` values, or a file (``-`` = standard input).

``.txt`` (and standard input): one text per non-blank line.  ``.jsonl`` / ``.csv`` / ``.tsv``: one record per
line with a text field (``text`` unless ``--text_field`` names another), read by ``data.formats.read_records`` so
a bad line is reported as ``file:line``.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from ptm_app.data.formats import read_records
from ptm_app.errors import DataFormatError, PtmError

RECORD_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv")


def read_texts(texts: Optional[list[str]], input_path: Optional[str], text_field: str = "text") -> list[str]:
    """The texts to embed / classify / continue, in order; no texts at all is a one-line error."""
    return read_inputs(texts, input_path, text_field)[0]


def read_inputs(texts: Optional[list[str]], input_path: Optional[str], text_field: str = "text",
                id_field: str = "id") -> tuple[list[str], Optional[list]]:
    """The texts and, when every record of a .jsonl / .csv file has one, their ids (else None)."""
    if texts and input_path:
        raise PtmError("give the texts either with --text or with --input FILE, not both")
    if texts:
        return list(texts), None
    if not input_path:
        raise PtmError("no input: give --text \"...\" (repeatable) or --input FILE (.txt, .jsonl, .csv; - for stdin)")
    ids = None
    if input_path == "-":
        found, where = _lines(sys.stdin.read().splitlines()), "standard input"
    else:
        path = Path(input_path)
        if not path.is_file():
            raise PtmError(f"--input {path} does not exist; check the path")
        where = str(path)
        if path.suffix.lower() in RECORD_SUFFIXES:
            found, ids = _records(path, text_field, id_field)
        else:
            found = _lines(path.read_text(encoding="utf-8").splitlines())
    if not found:
        raise PtmError(f"{where}: no texts in it (it is empty); give one text per line (.txt) or one record with a "
                       f"'{text_field}' field per line (.jsonl, .csv)")
    return found, ids


def _lines(lines: list[str]) -> list[str]:
    return [line.strip() for line in lines if line.strip()]


def _records(path: Path, field: str, id_field: str) -> tuple[list[str], Optional[list]]:
    found, ids = [], []
    for line, record in read_records(path):
        value = record.get(field)
        if not isinstance(value, str):
            problem = f"no '{field}' field" if value is None else f"'{field}' is not a string"
            raise DataFormatError(path, line, problem, "add it, or name the text field with --text_field")
        found.append(value)
        ids.append(record.get(id_field))
    return found, (ids if all(i is not None for i in ids) else None)
