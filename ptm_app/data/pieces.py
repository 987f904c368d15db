"""Units of work for a parallel preparation (``data.litcorpus``): pieces of about ``piece_bytes`` of input text.

A piece is a newline-aligned byte range of an uncompressed ``.jsonl`` (a blank-line-aligned one of a ``.txt``),
a run of row groups of a Parquet file, or a whole file of any other format (CSV, Arrow, small compressed files).
A large compressed ``.jsonl``/``.txt`` is first decompressed once into ``scratch`` (streamed; removed by the caller
when done), so its pieces too are tokenized in parallel; errors still name the original file.  Piece boundaries depend on the data
only, never on the worker count, so the prepared records are the same for any number of workers.  A piece is a
JSON string (litdata's ``optimize`` stores its inputs as JSON and compares them on a restart).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator, Sequence

from ptm_app.data.formats import COMPRESSIONS, decompress_to, format_suffix, read_records
from ptm_app.errors import PtmError

Piece = str
SPLITTABLE = (".jsonl", ".json", ".txt")


def document_lines(text: str) -> list[str]:
    """A document's non-blank lines (its sentences), as ``corpus.tokenize_corpus`` splits them."""
    return [ln for ln in text.split("\n") if ln.strip()]


def _ranges(path: Path, piece_bytes: int, blank_line: bool) -> Iterator[tuple[int, int, int]]:
    """``(start, stop, first line)`` of consecutive ranges of about ``piece_bytes`` that end after a newline
    (``blank_line``: after a blank line, so no ``.txt`` document is cut).  One pass over the file."""
    start, line_no, size = 0, 1, path.stat().st_size
    with open(path, "rb") as fh:
        at, first = 0, 1
        while True:
            line = fh.readline()
            if not line:
                break
            at, line_no = at + len(line), line_no + 1
            if at - start >= piece_bytes and (not blank_line or not line.strip()):
                yield start, at, first
                start, first = at, line_no
    if start < size:
        yield start, size, first


def plan_pieces(files: Sequence[Path], piece_bytes: int, scratch: Path | None = None) -> list[Piece]:
    """The pieces of ``files``, in order: their records, read with ``piece_documents``, are the files' records."""
    pieces: list[Piece] = []
    for i, path in enumerate(files):
        path = Path(path)
        compressed = path.suffix.lower() in COMPRESSIONS
        if compressed and scratch is not None and format_suffix(path) in SPLITTABLE \
                and path.stat().st_size > piece_bytes // 2:  # text compresses 3-5x: several pieces' worth
            plain = scratch / f"{i:05d}-{path.stem}"
            if not plain.exists():  # written atomically: present means complete (a restart reuses it)
                decompress_to(path, plain)
            blank = format_suffix(path) == ".txt"
            pieces.extend(json.dumps([str(plain), a, b, line, str(path)])
                          for a, b, line in _ranges(plain, piece_bytes, blank))
            continue
        splittable = format_suffix(path) in SPLITTABLE and not compressed
        if format_suffix(path) == ".parquet" and path.stat().st_size > piece_bytes:
            pieces.extend(json.dumps([str(path), "row_groups", a, b]) for a, b in _row_group_runs(path, piece_bytes))
            continue
        if not splittable or path.stat().st_size <= piece_bytes:
            pieces.append(json.dumps([str(path)]))
            continue
        blank = format_suffix(path) == ".txt"
        pieces.extend(json.dumps([str(path), a, b, line]) for a, b, line in _ranges(path, piece_bytes, blank))
    return pieces


def _row_group_runs(path: Path, piece_bytes: int) -> Iterator[tuple[int, int]]:
    """``[first, stop)`` runs of a Parquet file's row groups of about ``piece_bytes`` (uncompressed) each."""
    import pyarrow.parquet as pq

    meta, first, size = pq.ParquetFile(path).metadata, 0, 0
    for group in range(meta.num_row_groups):
        size += meta.row_group(group).total_byte_size
        if size >= piece_bytes:
            yield first, group + 1
            first, size = group + 1, 0
    if first < meta.num_row_groups:
        yield first, meta.num_row_groups


def _named(records, copy: str, original: str):
    try:
        yield from records
    except PtmError as exc:
        raise PtmError(str(exc).replace(copy, original)) from None


def piece_documents(piece: Piece, text_field: str) -> Iterator[list[str]]:
    """The non-empty documents of a piece, each as its lines."""
    path, *window = json.loads(piece)
    if window and window[0] == "row_groups":
        records = read_records(path, (text_field,), row_groups=(window[1], window[2]))
    elif window:
        records = read_records(path, (text_field,), byte_range=(window[0], window[1]), first_line=window[2])
        if len(window) == 4:  # a range of a decompressed copy: errors name the original file (same line numbers)
            records = _named(records, path, window[3])
    else:
        records = read_records(path, (text_field,))
    for _, record in records:
        lines = document_lines(str(record[text_field]))
        if lines:
            yield lines
