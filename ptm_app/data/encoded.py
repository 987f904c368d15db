"""One tokenized split, for every kind of labelled data, and the tokenize-once cache it is kept in.

A split file is read once and tokenized once (design principle 5, "tokenize once"): the result is JSON under
``<cache>/encoded`` (``data.cache``), keyed by the kind, the file's content, the fields, the settings and the
tokenizer.  Each data module names its own columns, e.g. ``input_ids``/``token_type_ids`` (classification,
BERT §3), ``first_token`` (tagging, BERT §4.3), one row per window with ``offsets`` (QA, BERT §4.2), the N
choices of a question (SWAG, BERT §4.4), ``source_ids``/``target_ids`` (seq2seq), and keeps the record fields it
reports back (texts, labels, gold answers).  Splits too large for JSON (parallel pairs) keep their columns as
memory-mapped ``Ragged`` arrays in their own cache directory.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np

from ptm_app.data.cache import cached_json
from ptm_app.data.formats import read_records
from ptm_app.errors import PtmError

FORMAT_VERSION = 2  # 2: one EncodedSplit layout for every kind (1: a class per kind, keys without the kind)


@dataclass
class EncodedSplit:
    """One tokenized split, in file order.

    ``columns``: what the dataset reads, one entry per row (a record; for QA a window of one); a column a
    tokenizer does not give (``token_type_ids``) or a setting leaves out (a text pair) is absent.
    ``fields``: record values kept as read, one entry per record (texts, labels, gold answers ...).
    ``stats``: counts of what was cut or left unlabelled, for ``prepare_data`` to report.
    """

    columns: dict[str, Any]
    fields: dict[str, list]
    lines: Sequence[int]
    path: str
    ids: list[str] = field(default_factory=list)  # empty for parallel pairs, which have only lines
    stats: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        """The number of records."""
        return len(self.lines)


@dataclass(frozen=True)
class Ragged:
    """Rows of different lengths stored flat: row ``i`` is ``values[offsets[i]:offsets[i + 1]]``."""

    values: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> list[int]:
        return self.values[self.offsets[i]: self.offsets[i + 1]].tolist()


def encoded_split(kind: str, key: list, build: Callable[[], EncodedSplit]) -> EncodedSplit:
    """``build()`` once per ``kind`` and ``key`` (file digest, fields, settings, tokenizer fingerprint);
    later calls read the cache."""
    return EncodedSplit(**cached_json(["encoded", FORMAT_VERSION, kind, *key], lambda: vars(build())))


def read_rows(path: Path, required: Iterable[str]) -> list[tuple[int, dict]]:
    """``(line, record)`` of a split file; a file without records is an error."""
    rows = list(read_records(path, tuple(required)))
    if not rows:
        raise PtmError(f"data file {path} has no records; check the file")
    return rows


def record_ids(path: Path, rows: list[tuple[int, dict]], id_field: str) -> list[str]:
    """Each record's ``id_field``, or ``file:line`` where it has none."""
    return [str(r.get(id_field, f"{Path(path).name}:{line}")) for line, r in rows]


def pick(seq: Optional[Sequence], index: Sequence[int]) -> Optional[list]:
    """The entries of ``seq`` at ``index`` (None stays None: an absent column)."""
    return None if seq is None else [seq[i] for i in index]
