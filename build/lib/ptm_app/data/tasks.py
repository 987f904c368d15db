"""Labelled text classification and regression data: single sentences and sentence pairs.

Each split is tokenized once (cached by file content, fields, tokenizer and length settings).
Labels are checked against the label set with ``file:line`` on any stranger.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, Optional

from ptm_app.data.cache import cached_json
from ptm_app.data.formats import read_records
from ptm_app.data.tokenizer import tokenizer_fingerprint
from ptm_app.errors import DataFormatError, PtmError
from ptm_app.paths import sha256_file

FORMAT_VERSION = 1
Overlong = Literal["truncate", "error"]
Unlabelled = Literal["error", "skip"]


@dataclass
class EncodedSplit:
    input_ids: list[list[int]]
    token_type_ids: Optional[list[list[int]]]
    labels: list[str]
    lines: list[int]
    ids: list[str]
    texts: list[str]
    path: str


@dataclass
class LabelledRecords:
    """A labelled file's fields in file order, with line numbers for ``file:line`` messages."""

    texts: list[str]
    pairs: Optional[list[str]]
    labels: list[str]
    lines: list[int]
    ids: list[str]
    path: str


def read_labelled(path: Path, *, text_field: str, text_pair_field: Optional[str], label_field: str,
                  id_field: str, unlabelled: Unlabelled = "error") -> LabelledRecords:
    """The labelled records of a file; with ``unlabelled: skip`` records whose label is missing or null are
    left out (and counted on stdout) instead of being a ``file:line`` error."""
    required = (text_field,) + ((text_pair_field,) if text_pair_field else ())
    rows = list(read_records(path, required + ((label_field,) if unlabelled == "error" else ())))
    if unlabelled == "skip":
        kept = [(line, r) for line, r in rows if r.get(label_field) is not None]
        if len(kept) < len(rows):
            print(f"{path}: skipped {len(rows) - len(kept)} of {len(rows)} records without '{label_field}' "
                  f"(data.unlabelled: skip)")
        rows = kept
    if not rows:
        raise PtmError(f"data file {path} has no records; check the file")
    return LabelledRecords(
        texts=[str(r[text_field]) for _, r in rows],
        pairs=[str(r[text_pair_field]) for _, r in rows] if text_pair_field else None,
        labels=[str(r[label_field]) for _, r in rows],
        lines=[line for line, _ in rows],
        ids=[str(r.get(id_field, f"{Path(path).name}:{line}")) for line, r in rows],
        path=str(path),
    )


def encode_split(
    path: Path, tokenizer, *, text_field: str, text_pair_field: Optional[str], label_field: str,
    max_length: int, overlong: Overlong, id_field: str = "id", unlabelled: Unlabelled = "error",
) -> EncodedSplit:
    """Tokenize a labelled file once; later calls read the cache."""
    key = [FORMAT_VERSION, sha256_file(path), text_field, text_pair_field, label_field, id_field, max_length,
           overlong, tokenizer_fingerprint(tokenizer)] + ([unlabelled] if unlabelled != "error" else [])

    def build() -> dict:
        rec = read_labelled(path, text_field=text_field, text_pair_field=text_pair_field, label_field=label_field,
                            id_field=id_field, unlabelled=unlabelled)
        enc = tokenizer(rec.texts, rec.pairs, truncation=(overlong == "truncate"), max_length=max_length,
                        verbose=False)
        if overlong == "error":
            for line, ids in zip(rec.lines, enc["input_ids"]):
                if len(ids) > max_length:
                    raise DataFormatError(path, line, f"text is {len(ids)} tokens, longer than max_length={max_length}",
                                          "raise data.max_length (up to the backbone's limit) or set data.overlong: truncate")
        types = enc.get("token_type_ids") if rec.pairs is not None or "token_type_ids" in enc else None
        return asdict(EncodedSplit(input_ids=enc["input_ids"], token_type_ids=types, labels=rec.labels,
                                   lines=rec.lines, ids=rec.ids, texts=rec.texts, path=rec.path))

    return EncodedSplit(**cached_json(key, build))


def label_values(split: EncodedSplit, label_set: list[str], from_training: bool) -> list[float]:
    """Regression targets: each label must read as a finite number; otherwise an error naming ``file:line``."""
    out = []
    for label, line in zip(split.labels, split.lines):
        try:
            value = float(label)
        except ValueError:
            value = float("nan")
        if not math.isfinite(value):
            raise DataFormatError(split.path, line, f"regression target '{label}' is not a finite number",
                                  "fix the value, or use data.task: classification for label names")
        out.append(value)
    return out


def label_ids(split: EncodedSplit, label_set: list[str], from_training: bool) -> list[int]:
    """Map label strings to ids; a label outside the set is an error naming ``file:line``."""
    index = {name: i for i, name in enumerate(label_set)}
    out = []
    for label, line in zip(split.labels, split.lines):
        if label not in index:
            origin = "the labels seen in training" if from_training else "data.labels"
            raise DataFormatError(split.path, line, f"label '{label}' is not in the label set {label_set} ({origin})",
                                  "fix the label or add it to data.labels")
        out.append(index[label])
    return out
