"""Read records from local files: JSONL, CSV/TSV, plain text, Parquet, Arrow (the files of a HF ``datasets``
``save_to_disk`` directory); text formats may be gzip (``.gz``) or zstd (``.zst``) compressed (``train.jsonl.gz``),
and every format is read as a stream.  Uncompressed JSONL and text can be read by byte range (``byte_range``), the
pieces a parallel preparation hands its workers (``data.pieces``).

Every record comes with its 1-based line number so that bad input is reported as ``file:line``.
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import zlib
from pathlib import Path
from typing import Iterator

from ptm_app.errors import DataFormatError, PtmError, not_utf8_lines

SUFFIXES = (".jsonl", ".json", ".csv", ".tsv", ".txt", ".parquet", ".arrow")
COMPRESSIONS = (".gz", ".zst")


def format_suffix(path: Path) -> str:
    """The record format of ``path``: ``.jsonl`` for ``x.jsonl`` and ``x.jsonl.gz`` alike."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSIONS:
        suffixes = suffixes[:-1]
    return suffixes[-1] if suffixes else ""


def open_text(path: Path, byte_range: tuple[int, int] | None = None, **kwargs):
    """``path`` opened for reading text, decompressing ``.gz`` (gzip) and ``.zst`` (zstandard) on the fly;
    ``byte_range`` (uncompressed files): only bytes ``[start, stop)``."""
    compression = path.suffix.lower()
    if byte_range is not None:
        return io.TextIOWrapper(io.BufferedReader(_ByteWindow(path, *byte_range)), encoding="utf-8", **kwargs)
    if compression == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", **kwargs)
    if compression == ".zst":
        return io.TextIOWrapper(io.BufferedReader(_ZstdReader(path)), encoding="utf-8", **kwargs)
    return open(path, encoding="utf-8", **kwargs)


def read_records(path: str | Path, required: tuple[str, ...] = (), byte_range: tuple[int, int] | None = None,
                 first_line: int = 1, row_groups: tuple[int, int] | None = None) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, record)``; a missing field or a malformed line raises ``DataFormatError``.

    Plain ``.txt`` files yield one record per document: documents are separated by blank lines
    and each non-blank line becomes one line of the ``text`` field.  ``byte_range`` (uncompressed ``.jsonl``
    or ``.txt``) reads only the records in ``[start, stop)``, the first of them on line ``first_line``;
    ``row_groups`` (Parquet) only the row groups ``[first, stop)``.
    """
    path = Path(path)
    if not path.is_file():
        raise PtmError(f"data file {path} does not exist; check the path or run: python main.py data prepare")
    suffix = format_suffix(path)
    reader = {
        ".jsonl": _jsonl, ".json": _jsonl, ".csv": _csv, ".tsv": _csv, ".txt": _txt, ".parquet": _parquet,
        ".arrow": _arrow,
    }.get(suffix)
    if reader is None or (suffix in (".parquet", ".arrow") and path.suffix.lower() in COMPRESSIONS):
        raise PtmError(f"data file {path}: unsupported format '{''.join(path.suffixes)}'; use one of "
                       f"{', '.join(SUFFIXES)} (text formats optionally {' or '.join(COMPRESSIONS)} compressed)")
    try:
        if byte_range is not None:
            if reader not in (_jsonl, _txt) or path.suffix.lower() in COMPRESSIONS:
                raise PtmError(f"data file {path}: byte ranges need an uncompressed .jsonl or .txt file")
            records = reader(path, byte_range, first_line)
        elif row_groups is not None and reader is _parquet:
            records = _parquet(path, row_groups)
        else:
            records = reader(path)
        for line, record in records:
            for field in required:
                if field not in record or record[field] is None:
                    raise DataFormatError(path, line, f"missing field '{field}'", "add it, or point the data module's *_field option at the right column")
            yield line, record
    except _read_errors() as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise _read_error(path, exc) from None


def not_utf8(path: str | Path) -> PtmError:
    """The first line of ``path`` that is not UTF-8, as ``file:line`` with the byte (read again as bytes)."""
    path = Path(path)
    compression = path.suffix.lower()
    opened = (gzip.open(path, "rb") if compression == ".gz" else io.BufferedReader(_ZstdReader(path))
              if compression == ".zst" else open(path, "rb"))
    with opened as fh:
        return not_utf8_lines(path, fh)




def _read_error(path: Path, exc: BaseException) -> PtmError:
    if isinstance(exc, UnicodeDecodeError):
        try:
            return not_utf8(path)
        except _read_errors():  # a compressed file that is also damaged: the general line below
            pass
    if path.suffix.lower() in COMPRESSIONS:
        return PtmError(f"data file {path} does not decompress ({type(exc).__name__}: {exc}); "
                        f"the file is truncated or not {path.suffix} compressed: re-download or re-compress it")
    return PtmError(f"data file {path} cannot be read ({type(exc).__name__}: {exc}); check it is UTF-8 text")


def decompress_to(path: Path, target: Path) -> None:
    """Write the text of the compressed ``path`` to ``target`` (atomically, streamed: bounded memory)."""
    import shutil

    from ptm_app.paths import atomic_file

    try:
        with open_text(path) as source, atomic_file(target, "w", encoding="utf-8") as out:
            shutil.copyfileobj(source, out, 1 << 20)
    except _read_errors() as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise _read_error(path, exc) from None


class _ZstdReader(io.RawIOBase):
    """A zstd file decompressed as a stream (frames one after another); a truncated frame raises ``EOFError``
    (zstandard's own ``stream_reader`` ends silently there)."""

    def __init__(self, path: Path):
        import zstandard

        self._new = zstandard.ZstdDecompressor().decompressobj
        self._file, self._dec, self._pending = open(path, "rb"), self._new(), b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._pending:
            chunk = self._file.read(1 << 20)
            if not chunk:
                if not self._dec.eof and self._started:
                    raise EOFError("zstd stream ended inside a frame")
                return 0
            self._started = True
            if self._dec.eof:  # the next frame
                self._dec = self._new()
            self._pending = self._dec.decompress(chunk)
        n = min(len(buffer), len(self._pending))
        buffer[:n], self._pending = self._pending[:n], self._pending[n:]
        return n

    _started = False

    def close(self) -> None:
        self._file.close()
        super().close()


def _read_errors() -> tuple[type[BaseException], ...]:
    try:
        from zstandard import ZstdError
    except ImportError:
        return OSError, EOFError, zlib.error, UnicodeDecodeError
    return OSError, EOFError, zlib.error, UnicodeDecodeError, ZstdError


class _ByteWindow(io.RawIOBase):
    """Bytes ``[start, stop)`` of a file as a stream."""

    def __init__(self, path: Path, start: int, stop: int):
        self._file, self._left = open(path, "rb"), stop - start
        self._file.seek(start)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._file.read(min(len(buffer), self._left))
        self._left -= len(data)
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._file.close()
        super().close()


def _jsonl(path: Path, byte_range=None, first_line: int = 1) -> Iterator[tuple[int, dict]]:
    with open_text(path, byte_range) as fh:
        for line_no, line in enumerate(fh, first_line):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                where = f"{exc.msg.removesuffix(' at')} at column {exc.colno}"  # "Unterminated string starting at"
                raise DataFormatError(path, line_no, f"malformed JSON ({where})") from None
            if not isinstance(record, dict):
                raise DataFormatError(path, line_no, "expected a JSON object per line")
            yield line_no, record


def _csv(path: Path) -> Iterator[tuple[int, dict]]:
    with open_text(path, newline="") as fh:
        reader = csv.DictReader(fh, delimiter="\t" if format_suffix(path) == ".tsv" else ",")
        for record in reader:
            if None in record:
                raise DataFormatError(path, reader.line_num, "more columns than the header")
            yield reader.line_num, record


def _txt(path: Path, byte_range=None, first_line: int = 1) -> Iterator[tuple[int, dict]]:
    lines: list[str] = []
    start = first_line
    with open_text(path, byte_range) as fh:
        for line_no, line in enumerate(fh, first_line):
            if line.strip():
                if not lines:
                    start = line_no
                lines.append(line.strip())
            elif lines:
                yield start, {"text": "\n".join(lines)}
                lines = []
    if lines:
        yield start, {"text": "\n".join(lines)}


def _parquet(path: Path, row_groups: tuple[int, int] | None = None) -> Iterator[tuple[int, dict]]:
    """Rows numbered from 1; ``row_groups`` (``[first, stop)``): only those row groups (a piece of the file)."""
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    groups = range(*row_groups) if row_groups is not None else None
    row = sum(parquet.metadata.row_group(g).num_rows for g in range(groups.start)) if groups is not None else 0
    for batch in parquet.iter_batches(batch_size=4096, row_groups=groups):  # streamed, one row group at a time
        for record in batch.to_pylist():
            row += 1
            yield row, record


def _arrow(path: Path) -> Iterator[tuple[int, dict]]:
    """One Arrow file of a HF ``datasets`` ``save_to_disk`` directory (an IPC stream), memory-mapped, by batch."""
    import pyarrow as pa

    row = 0
    with pa.memory_map(str(path)) as source:
        try:
            reader = pa.ipc.open_stream(source)
        except pa.ArrowInvalid as exc:
            raise PtmError(f"data file {path} is not an Arrow stream ({exc}); save the dataset again with "
                           f"datasets' save_to_disk") from None
        for batch in reader:
            for record in batch.to_pylist():
                row += 1
                yield row, record


def split_files(source: str | Path, splits=("train", "validation", "test")) -> dict[str, Path]:
    """Map split names to files in a directory (``train.jsonl``, ``validation.csv`` ...)."""
    source = Path(source)
    found = {}
    for split in splits:
        for suffix in (*SUFFIXES, *(s + c for s in SUFFIXES if s != ".parquet" for c in COMPRESSIONS)):
            candidate = source / f"{split}{suffix}"
            if candidate.is_file():
                found[split] = candidate
                break
    if "train" not in found:
        raise PtmError(f"no train split in {source}: expected train.jsonl (or .csv/.tsv/.txt/.parquet)")
    return found
