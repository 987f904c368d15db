"""Sequence tagging data (one label per word), following BERT (Devlin et al. 2019 §4.3, NER): each word's label
sits on its *first* sub-token; the other sub-tokens, the special tokens and padding get ``-100`` and are ignored by
the loss and the metrics.

Each split is tokenized once into an ``EncodedSplit`` (``data.encoded``, cached by file content, fields, tokenizer
and length settings); a label outside the label set or a words/tags length mismatch is an error naming
``file:line``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
from torch.utils.data import Dataset

from ptm_app.data import IGNORE_INDEX
from ptm_app.data.datamodules import _Base
from ptm_app.data.datasets import _index
from ptm_app.data.encoded import EncodedSplit, encoded_split, pick, read_rows, record_ids
from ptm_app.data.formats import read_records
from ptm_app.data.tokenizer import TokenizerSpec, fast_tokenizer_fingerprint
from ptm_app.errors import DataFormatError
from ptm_app.paths import sha256_file


def align_words(tokenizer, words: list[list[str]], max_length: int) -> tuple[list, list, int, int]:
    """Tokenize pre-split words (``is_split_into_words``, cut at ``max_length``) and locate each word's first
    sub-token: ``(input_ids, first_token, truncated_words, empty_words)``.  ``first_token[i][w]`` is the position
    of word ``w``'s first sub-token in ``input_ids[i]``, or -1 if the word has none (cut off by ``max_length``,
    or no sub-token at all); ``truncated_words`` counts the words after the last one that fits, ``empty_words``
    those the tokenizer turns into nothing (e.g. control characters only)."""
    enc = tokenizer(words, is_split_into_words=True, truncation=True, max_length=max_length, verbose=False)
    first, truncated, empty = [], 0, 0
    for i, sentence in enumerate(words):
        positions = [-1] * len(sentence)
        for pos, w in enumerate(enc.word_ids(i)):
            if w is not None and positions[w] < 0:
                positions[w] = pos
        cut = len(enc["input_ids"][i]) >= max_length
        last = max((w for w, p in enumerate(positions) if p >= 0), default=-1) if cut else len(sentence) - 1
        truncated += len(sentence) - 1 - last
        empty += sum(p < 0 for p in positions[: last + 1])
        first.append(positions)
    return enc["input_ids"], first, truncated, empty


def encode_tagged(path: Path, tokenizer, *, words_field: str, tags_field: str, id_field: str,
                  max_length: int) -> EncodedSplit:
    """Tokenize pre-split words once (``is_split_into_words``) and locate each word's first sub-token: columns
    ``input_ids`` and ``first_token``, fields ``words`` and ``tags``, stats ``truncated_words`` and ``empty_words``
    (see ``align_words``)."""
    def build() -> EncodedSplit:
        rows = read_rows(path, (words_field, tags_field))
        for line, r in rows:
            words, tags = r[words_field], r[tags_field]
            if not isinstance(words, list) or not isinstance(tags, list) or len(words) != len(tags):
                raise DataFormatError(path, line, f"'{words_field}' and '{tags_field}' must be lists of equal length",
                                      "give one tag per word")
        words = [[str(w) for w in r[words_field]] for _, r in rows]
        input_ids, first, truncated, empty = align_words(tokenizer, words, max_length)
        return EncodedSplit(
            columns={"input_ids": input_ids, "first_token": first},
            fields={"words": words, "tags": [[str(t) for t in r[tags_field]] for _, r in rows]},
            lines=[line for line, _ in rows], path=str(path), ids=record_ids(path, rows, id_field),
            stats={"truncated_words": truncated, "empty_words": empty})

    key = [sha256_file(path), words_field, tags_field, id_field, max_length, fast_tokenizer_fingerprint(tokenizer)]
    return encoded_split("tagged", key, build)


def tag_ids(split: EncodedSplit, label_set: list[str], from_training: bool) -> list[list[int]]:
    """Map tags to ids; a tag outside the set is an error naming ``file:line``."""
    index = {name: i for i, name in enumerate(label_set)}
    out = []
    for tags, line in zip(split.fields["tags"], split.lines):
        unknown = [t for t in tags if t not in index]
        if unknown:
            origin = "the tags seen in training" if from_training else "data.labels"
            raise DataFormatError(split.path, line,
                                  f"tag '{unknown[0]}' is not in the label set {label_set} ({origin})",
                                  "fix the tag or add it to data.labels")
        out.append([index[t] for t in tags])
    return out


class TaggedDataset(Dataset):
    """Items: ``input_ids``, ``word_index`` (word number on first sub-tokens, else -1) and ``labels``
    (tag id on first sub-tokens, else -100)."""

    def __init__(self, input_ids: list[list[int]], first_token: list[list[int]], tags: list[list[int]]):
        self.input_ids, self.first_token, self.tags = input_ids, first_token, tags

    def __len__(self) -> int:
        return len(self.input_ids)

    def lengths(self) -> list[int]:
        return [len(ids) for ids in self.input_ids]

    def __getitem__(self, key) -> dict:
        i = _index(key)
        n = len(self.input_ids[i])
        word_index = torch.full((n,), -1, dtype=torch.long)
        labels = torch.full((n,), IGNORE_INDEX, dtype=torch.long)
        for w, (pos, tag) in enumerate(zip(self.first_token[i], self.tags[i])):
            if pos >= 0:
                word_index[pos], labels[pos] = w, tag
        return {"input_ids": torch.as_tensor(self.input_ids[i], dtype=torch.long), "word_index": word_index,
                "labels": labels, "key": key}


class TokenTaskDataModule(_Base):
    """Sequence tagging (POS, NER, chunking): records with a list of words and one tag per word.

    Args:
        source: prepared dataset name (``brown_pos``), a directory with split files, or one file.
        words_field / tags_field / id_field: column names (``words`` and ``tags`` are lists).
        labels: the tag set, in order; by default the sorted tags of the training split.
        max_length: longest input in sub-tokens; words beyond it are not labelled (their count is printed).
        holdout: fraction of training sentences held out when the source has no validation split.
        limit_train: use only N training sentences.
        group_by_length: batch sentences of similar length together (see ``TaskDataModule``).
    """

    kind = "token"

    def __init__(self, tokenizer: TokenizerSpec, source: str = "brown_pos", words_field: str = "words",
                 tags_field: str = "tags", id_field: str = "id", labels: Optional[list[str]] = None,
                 max_length: int = 128, batch_size: int = 32, eval_batch_size: Optional[int] = None,
                 num_workers: int = 0, seed: int = 1234, holdout: float = 0.1, limit_train: Optional[int] = None,
                 group_by_length: bool = True):
        super().__init__(source, tokenizer, batch_size, eval_batch_size, num_workers, seed, holdout)
        self.group_by_length = group_by_length
        self.words_field, self.tags_field, self.id_field = words_field, tags_field, id_field
        self.labels, self.max_length, self.limit_train = labels, max_length, limit_train
        self.splits: dict = {}
        self.encoded: dict[Path, EncodedSplit] = {}  # this run's splits, read once

    def _tokenizer_corpus(self):
        train = self.files["train"]
        texts = lambda: [" ".join(map(str, r[self.words_field]))  # noqa: E731
                         for _, r in read_records(train, (self.words_field,))]
        return texts, f"{train}:{self.words_field}"

    def _encode(self, path: Path) -> EncodedSplit:
        if path not in self.encoded:
            self.encoded[path] = encode_tagged(path, self.load_tokenizer(), words_field=self.words_field,
                                               tags_field=self.tags_field, id_field=self.id_field,
                                               max_length=self.max_length)
        return self.encoded[path]

    def prepare_data(self) -> None:
        for path in self.files.values():
            stats = self._encode(path).stats
            if stats["truncated_words"] or stats["empty_words"]:
                print(f"{path}: {stats['truncated_words']} words beyond max_length={self.max_length} and "
                      f"{stats['empty_words']} words without sub-tokens are not labelled (nor scored)")

    def label_set(self) -> list[str]:
        if self.labels is None:
            self.labels = sorted({t for tags in self._encode(self.files["train"]).fields["tags"] for t in tags})
        return list(self.labels)

    @property
    def num_labels(self) -> int:
        return len(self.label_set())

    def setup(self, stage: str | None = None) -> None:
        self.setup_labelled(tag_ids)

    def _add(self, split: str, enc: EncodedSplit, ids: list[list[int]], index: list[int]) -> None:
        self.splits[split] = {"ids": pick(enc.ids, index), "words": pick(enc.fields["words"], index), "path": enc.path}
        self.datasets[split] = TaggedDataset(pick(enc.columns["input_ids"], index),
                                             pick(enc.columns["first_token"], index), pick(ids, index))

    def records(self, split: str) -> dict:
        """Ids and words of a split, aligned with its dataset (for writing predictions)."""
        return self.splits[split]




