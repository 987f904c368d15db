"""Multiple choice: a question (stem) and N candidate answers, one right (SWAG / RACE style, Devlin et al.
2019 §4.4).  Each (question, choice) pair is tokenized as a sentence pair; a batch of B questions is
``input_ids [B·N, L]`` with ``labels [B]`` (the right choice's index), so one score per pair can be soft-maxed
over the question's choices.

Records (JSONL, CSV, parquet): ``text`` (the question), ``choices`` (a list of N strings; in CSV a JSON list) and
``label`` (the right choice's 0-based index); the field names are settings.  ``data prepare wordnet_choice``
makes a WordNet-derived set: a word and four definitions, its own and three of other words.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
from torch.utils.data import Dataset

from ptm_app.data.collators import ChoiceCollator
from ptm_app.data.datamodules import _Base, holdout_split, seeded_subset
from ptm_app.data.datasets import _index
from ptm_app.data.encoded import EncodedSplit, encoded_split, pick, record_ids
from ptm_app.data.formats import read_records
from ptm_app.data.tokenizer import TokenizerSpec, tokenizer_fingerprint
from ptm_app.errors import DataFormatError, PtmError
from ptm_app.paths import sha256_file


def read_choices(path: Path, tokenizer, *, text_field: str, choices_field: str, label_field: str, id_field: str,
                 num_choices: Optional[int], max_length: int) -> EncodedSplit:
    """Tokenize a multiple-choice file once (cached): columns ``input_ids`` (and ``token_type_ids``) hold a
    question's N (question, choice) pairs; fields ``text``, ``choices`` and ``label`` (the right choice's index).
    A malformed record is a ``file:line`` error."""
    key = [sha256_file(path), text_field, choices_field, label_field, id_field, num_choices, max_length,
           tokenizer_fingerprint(tokenizer)]

    def build() -> EncodedSplit:
        texts, choices, labels, rows = [], [], [], []
        width = num_choices
        for line, record in read_records(path, required=(text_field, choices_field, label_field)):
            options = record[choices_field]
            if isinstance(options, str):
                try:
                    options = json.loads(options)
                except json.JSONDecodeError:
                    options = None
            if not isinstance(options, list) or len(options) < 2 or not all(isinstance(o, str) for o in options):
                raise DataFormatError(path, line, f"'{choices_field}' must be a list of at least 2 strings")
            width = width or len(options)
            if len(options) != width:
                raise DataFormatError(path, line, f"{len(options)} choices where the others have {width}",
                                      "give every question the same number of choices (data.num_choices)")
            try:
                label = int(record[label_field])
            except (TypeError, ValueError):
                label = -1
            if not 0 <= label < width:
                raise DataFormatError(path, line, f"label {record[label_field]!r} is not a choice index 0..{width - 1}")
            texts.append(str(record[text_field]))
            choices.append(options)
            labels.append(label)
            rows.append((line, record))
        if not texts:
            raise PtmError(f"{path}: no multiple-choice records; check the file and data.text_field / choices_field")
        flat = tokenizer([t for t, opts in zip(texts, choices) for _ in opts], [o for opts in choices for o in opts],
                         truncation="longest_first", max_length=max_length, verbose=False)
        n = len(choices[0])
        group = lambda seq: [seq[i:i + n] for i in range(0, len(seq), n)]  # noqa: E731
        columns = {"input_ids": group(flat["input_ids"])}
        if flat.get("token_type_ids"):
            columns["token_type_ids"] = group(flat["token_type_ids"])
        return EncodedSplit(columns=columns, fields={"text": texts, "choices": choices, "label": labels},
                            lines=[line for line, _ in rows], path=str(path), ids=record_ids(path, rows, id_field))

    return encoded_split("choice", key, build)


class ChoiceDataset(Dataset):
    """One question per item: its choices' token ids and the right choice's index."""

    def __init__(self, split: EncodedSplit, index: list[int]):
        self.columns, self.labels, self.index = split.columns, split.fields["label"], index

    def __len__(self) -> int:
        return len(self.index)

    def lengths(self) -> list[int]:
        return [max(len(ids) for ids in self.columns["input_ids"][i]) for i in self.index]

    def __getitem__(self, key) -> dict:
        i = self.index[_index(key)]
        item = {"choices": [torch.as_tensor(ids, dtype=torch.long) for ids in self.columns["input_ids"][i]],
                "label": self.labels[i], "key": key}
        if "token_type_ids" in self.columns:
            item["choice_types"] = [torch.as_tensor(t, dtype=torch.long) for t in self.columns["token_type_ids"][i]]
        return item


class MultipleChoiceDataModule(_Base):
    """Multiple-choice questions (see the module docstring).

    Args:
        source: a prepared set (``wordnet_choice``), a directory with split files, or one file.
        text_field / choices_field / label_field / id_field: column names.
        num_choices: the number of choices per question (default: the first record's).
        max_length: longest (question, choice) pair in tokens; the longer of the two is cut first.
        limit_train: use only N training questions.
    """

    def __init__(self, tokenizer: TokenizerSpec, source: str = "wordnet_choice", text_field: str = "text",
                 choices_field: str = "choices", label_field: str = "label", id_field: str = "id",
                 num_choices: Optional[int] = None, max_length: int = 96, batch_size: int = 16,
                 eval_batch_size: Optional[int] = None, num_workers: int = 0, seed: int = 1234, holdout: float = 0.1,
                 limit_train: Optional[int] = None, group_by_length: bool = True):
        super().__init__(source, tokenizer, batch_size, eval_batch_size, num_workers, seed, holdout)
        self.text_field, self.choices_field, self.label_field, self.id_field = (text_field, choices_field,
                                                                                label_field, id_field)
        self.num_choices, self.max_length, self.limit_train = num_choices, max_length, limit_train
        self.group_by_length = group_by_length
        self.kind = "choice"
        self.splits: dict[str, tuple[EncodedSplit, list[int]]] = {}

    def _read(self, path: Path) -> EncodedSplit:
        return read_choices(path, self.load_tokenizer(), text_field=self.text_field,
                            choices_field=self.choices_field, label_field=self.label_field, id_field=self.id_field,
                            num_choices=self.num_choices, max_length=self.max_length)

    def prepare_data(self) -> None:
        for path in self.files.values():
            self._read(path)

    def label_set(self) -> list[str]:
        """The choice positions, as labels ("0" … "N-1"): what a multitask head and its accuracy count."""
        n = self.num_choices or len(self._read(self.files["train"]).fields["choices"][0])
        return [str(i) for i in range(n)]

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        for split, path in self.files.items():
            enc = self._read(path)
            index = list(range(len(enc)))
            if split == "train" and "validation" not in self.files:
                index, held = holdout_split(len(index), self.holdout, self.seed)
                self._add("validation", enc, held)
            if split == "train" and self.limit_train:
                index = seeded_subset(index, self.limit_train, self.seed)
            self._add(split, enc, index)

    def _add(self, split: str, enc: EncodedSplit, index: list[int]) -> None:
        self.splits[split] = (enc, index)
        self.datasets[split] = ChoiceDataset(enc, index)

    def records(self, split: str) -> dict:
        """Ids, questions and choices of a split, aligned with its dataset (for writing predictions)."""
        enc, index = self.splits[split]
        return {"ids": pick(enc.ids, index), "texts": pick(enc.fields["text"], index),
                "choices": pick(enc.fields["choices"], index)}

    def default_collator(self) -> ChoiceCollator:
        return ChoiceCollator(self.tokenizer.pad_token_id)
