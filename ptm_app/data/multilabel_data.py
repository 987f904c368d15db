"""Multi-label text classification data: each record is a text with a list of labels (any number, none included).

Records (JSONL, CSV with the list as JSON text, parquet): ``text`` and ``labels`` (a list of label names); the field
names are settings.  The label set is the sorted labels of the training split unless ``labels`` names it; a label
outside the set is a ``file:line`` error.  Each example's target is a 0/1 vector over the label set.
``data prepare openmoji`` makes a real set: OpenMoji's emoji names with their tags.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from ptm_app.data.datamodules import TaskDataModule
from ptm_app.data.encoded import EncodedSplit, encoded_split, read_rows, record_ids
from ptm_app.data.tasks import Overlong, tokenize_texts
from ptm_app.data.tokenizer import TokenizerSpec, tokenizer_fingerprint
from ptm_app.errors import DataFormatError
from ptm_app.paths import sha256_file


def _label_list(value) -> Optional[list[str]]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return value


def encode_label_sets(path: Path, tokenizer, *, text_field: str, labels_field: str, id_field: str, max_length: int,
                      overlong: Overlong) -> EncodedSplit:
    """Tokenize a multi-label file once (cached): column ``input_ids`` (+ ``token_type_ids``), fields ``text`` and
    ``label`` (each record's label list)."""
    key = [sha256_file(path), text_field, labels_field, id_field, max_length, overlong,
           tokenizer_fingerprint(tokenizer)]

    def build() -> EncodedSplit:
        rows = read_rows(path, (text_field, labels_field))
        texts, label_lists = [], []
        for line, record in rows:
            labels = _label_list(record[labels_field])
            if labels is None:
                raise DataFormatError(path, line, f"'{labels_field}' must be a list of label names",
                                      'give e.g. "labels": ["a", "b"] (or [] for none)')
            texts.append(str(record[text_field]))
            label_lists.append(sorted(set(labels)))
        lines = [line for line, _ in rows]
        columns = tokenize_texts(tokenizer, path, lines, texts, None, max_length, overlong)
        return EncodedSplit(columns=columns, fields={"text": texts, "label": label_lists},
                            lines=lines, path=str(path), ids=record_ids(path, rows, id_field))

    return encoded_split("multilabel", key, build)


def multi_hot(split: EncodedSplit, label_set: list[str], from_training: bool) -> list[list[float]]:
    """Each record's labels as a 0/1 vector over ``label_set``; a label outside it is a ``file:line`` error."""
    index = {name: i for i, name in enumerate(label_set)}
    out = []
    for labels, line in zip(split.fields["label"], split.lines):
        row = [0.0] * len(label_set)
        for label in labels:
            if label not in index:
                origin = "the labels seen in training" if from_training else "data.labels"
                raise DataFormatError(split.path, line, f"label '{label}' is not in the label set ({origin}, "
                                      f"{len(label_set)} labels)", "fix the label or add it to data.labels")
            row[index[label]] = 1.0
        out.append(row)
    return out


class MultiLabelDataModule(TaskDataModule):
    """Texts with label sets (the ``multilabel`` task kind), padded per batch.

    Args:
        source: a prepared set (``openmoji``), a directory with split files, or one file.
        text_field / labels_field / id_field: column names.
        labels: the label set, in order; by default the sorted labels of the training split.
        max_length, overlong, limit_train, group_by_length, batch sizes, seed, holdout: as ``TaskDataModule``.
    """

    def __init__(self, tokenizer: TokenizerSpec, source: str = "openmoji", text_field: str = "text",
                 labels_field: str = "labels", id_field: str = "id", labels: Optional[list[str]] = None,
                 max_length: int = 64, overlong: Overlong = "truncate", batch_size: int = 32,
                 eval_batch_size: Optional[int] = None, num_workers: int = 0, seed: int = 1234, holdout: float = 0.1,
                 limit_train: Optional[int] = None, group_by_length: bool = True):
        super().__init__(tokenizer, source, text_field, None, labels_field, id_field, labels, max_length, overlong,
                         batch_size, eval_batch_size, num_workers, seed, holdout, limit_train, "classification",
                         group_by_length)

    @property
    def kind(self) -> str:
        return "multilabel"

    def _encode(self, path: Path) -> EncodedSplit:
        return encode_label_sets(path, self.load_tokenizer(), text_field=self.text_field,
                                 labels_field=self.label_field, id_field=self.id_field, max_length=self.max_length,
                                 overlong=self.overlong)

    def label_set(self) -> list[str]:
        if self.labels is None:
            self.labels = sorted({label for labels in self._encode(self.files["train"]).fields["label"]
                                  for label in labels})
        return list(self.labels)

    def label_priors(self) -> list[float]:
        """Each label's share of the training examples (the ``multilabel`` kind starts its output biases there)."""
        labels = self._encode(self.files["train"]).fields["label"]
        counts = {name: 0 for name in self.label_set()}
        for row in labels:
            for name in row:
                if name in counts:
                    counts[name] += 1
        return [counts[name] / max(len(labels), 1) for name in self.label_set()]

    def setup(self, stage: str | None = None) -> None:
        self.setup_labelled(multi_hot)
