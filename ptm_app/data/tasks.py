"""Labelled text classification and regression data: single sentences and sentence pairs.

Each split is tokenized once into an ``EncodedSplit`` (``data.encoded``, cached by file content, fields, tokenizer
and length settings).
Labels are checked against the label set with ``file:line`` on any stranger.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

from ptm_app.data.encoded import EncodedSplit, encoded_split, read_rows, record_ids
from ptm_app.data.tokenizer import tokenizer_fingerprint
from ptm_app.errors import DataFormatError, PtmError
from ptm_app.paths import sha256_file

Overlong = Literal["truncate", "error"]
Unlabelled = Literal["error", "skip"]


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
    rows = read_rows(path, required + ((label_field,) if unlabelled == "error" else ()))
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
        ids=record_ids(path, rows, id_field),
        path=str(path),
    )


def tokenize_texts(tokenizer, path: Path, lines: list[int], texts: list[str], pairs: Optional[list[str]],
                   max_length: int, overlong: Overlong) -> dict[str, list]:
    """Columns ``input_ids`` (and ``token_type_ids`` when the tokenizer gives them) of texts (and pairs), truncated
    to ``max_length``, or (``overlong: error``) a ``file:line`` error for the first longer one."""
    enc = tokenizer(texts, pairs, truncation=(overlong == "truncate"), max_length=max_length, verbose=False)
    if overlong == "error":
        for line, ids in zip(lines, enc["input_ids"]):
            if len(ids) > max_length:
                raise DataFormatError(path, line, f"text is {len(ids)} tokens, longer than max_length={max_length}",
                                      "raise data.max_length (up to the backbone's limit) or set data.overlong: truncate")
    columns = {"input_ids": enc["input_ids"]}
    if enc.get("token_type_ids") is not None:
        columns["token_type_ids"] = enc["token_type_ids"]
    return columns


def encode_split(
    path: Path, tokenizer, *, text_field: str, text_pair_field: Optional[str], label_field: str,
    max_length: int, overlong: Overlong, id_field: str = "id", unlabelled: Unlabelled = "error",
) -> EncodedSplit:
    """Tokenize a labelled file once (columns ``input_ids`` and, if the tokenizer gives them, ``token_type_ids``;
    fields ``text`` and ``label``); later calls read the cache."""
    key = [sha256_file(path), text_field, text_pair_field, label_field, id_field, max_length,
           overlong, tokenizer_fingerprint(tokenizer)] + ([unlabelled] if unlabelled != "error" else [])

    def build() -> EncodedSplit:
        rec = read_labelled(path, text_field=text_field, text_pair_field=text_pair_field, label_field=label_field,
                            id_field=id_field, unlabelled=unlabelled)
        columns = tokenize_texts(tokenizer, path, rec.lines, rec.texts, rec.pairs, max_length, overlong)
        return EncodedSplit(columns=columns, fields={"text": rec.texts, "label": rec.labels}, lines=rec.lines,
                            path=rec.path, ids=rec.ids)

    return encoded_split("sequence", key, build)


def label_values(split: EncodedSplit, label_set: list[str], from_training: bool) -> list[float]:
    """Regression targets: each label must read as a finite number; otherwise an error naming ``file:line``."""
    out = []
    for label, line in zip(split.fields["label"], split.lines):
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
    for label, line in zip(split.fields["label"], split.lines):
        if label not in index:
            origin = "the labels seen in training" if from_training else "data.labels"
            raise DataFormatError(split.path, line, f"label '{label}' is not in the label set {label_set} ({origin})",
                                  "fix the label or add it to data.labels")
        out.append(index[label])
    return out
