"""Source → target text pairs for sequence-to-sequence generation (summarisation, headline generation ...).

Each split is tokenized once into an ``EncodedSplit`` (``data.encoded``, cached by file content, fields, tokenizer
and length settings): the source and the target become *content* token ids, without special tokens.  The model's
collator adds the specials its architecture expects (``adaptation.generation``): ``[CLS] … [SEP]`` around a
BERT2BERT source, EOS after a T5/BART source and after every target, a prompt between source and target for a
decoder-only model.  The raw target text is kept as the reference for ROUGE-L and BLEU, so truncating
the training target never changes what generations are scored against.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
from torch.utils.data import Dataset

from ptm_app.data.datamodules import _Base
from ptm_app.data.datasets import _index
from ptm_app.data.encoded import EncodedSplit, encoded_split, pick, read_rows, record_ids
from ptm_app.data.formats import read_records
from ptm_app.data.tasks import Overlong
from ptm_app.data.tokenizer import TokenizerSpec, tokenizer_fingerprint
from ptm_app.errors import DataFormatError, PtmError
from ptm_app.paths import sha256_file


def _content_ids(tokenizer, texts: list[str]) -> list[list[int]]:
    return tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"] if texts else []


def encode_pairs(path: Path, tokenizer, *, source_field: str, target_field: str, id_field: str,
                 max_source_length: int, max_target_length: int, overlong: Overlong) -> EncodedSplit:
    """Tokenize a source/target file once (columns ``source_ids``, ``target_ids``; fields ``source``, ``target``;
    stats ``truncated_sources``, ``truncated_targets``); an overlong text is cut (``truncate``) or refused with
    ``file:line``."""
    def build() -> EncodedSplit:
        rows = read_rows(path, (source_field, target_field))
        lines = [line for line, _ in rows]
        sources, targets = [str(r[source_field]) for _, r in rows], [str(r[target_field]) for _, r in rows]
        out, cut = {}, {}
        for name, texts, limit in (("source", sources, max_source_length), ("target", targets, max_target_length)):
            ids = _content_ids(tokenizer, texts)
            if overlong == "error":
                for line, seq in zip(lines, ids):
                    if len(seq) > limit:
                        raise DataFormatError(path, line, f"{name} is {len(seq)} tokens, longer than "
                                                          f"max_{name}_length={limit}",
                                              f"raise data.max_{name}_length or set data.overlong: truncate")
            cut[name] = sum(len(seq) > limit for seq in ids)
            out[name] = [seq[:limit] for seq in ids]
        return EncodedSplit(
            columns={"source_ids": out["source"], "target_ids": out["target"]},
            fields={"source": sources, "target": targets}, lines=lines, path=str(path),
            ids=record_ids(path, rows, id_field),
            stats={"truncated_sources": cut["source"], "truncated_targets": cut["target"]})

    key = [sha256_file(path), source_field, target_field, id_field, max_source_length, max_target_length, overlong,
           tokenizer_fingerprint(tokenizer)]
    return encoded_split("seq2seq", key, build)


class PairDataset(Dataset):
    """Items: ``source_ids``, ``target_ids`` (content tokens) and ``target`` (the reference text)."""

    def __init__(self, split: EncodedSplit, index: list[int]):
        self.columns, self.targets, self.index = split.columns, split.fields["target"], index

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, key) -> dict:
        c, i = self.columns, self.index[_index(key)]
        return {"source_ids": torch.as_tensor(c["source_ids"][i], dtype=torch.long),
                "target_ids": torch.as_tensor(c["target_ids"][i], dtype=torch.long), "target": self.targets[i],
                "key": key}


def target_ids(split: EncodedSplit, label_set: list[str], from_training: bool) -> list[list[int]]:
    """The "labels" of a generation task, for ``_Base.setup_labelled``: the target token ids."""
    return split.columns["target_ids"]


class Seq2SeqDataModule(_Base):
    """Source → target pairs (e.g. ``bbc_headlines``: article body → headline).

    Args:
        source: prepared dataset name (``bbc_headlines``), a directory with split files, or one file.
        source_field / target_field / id_field: column names.
        max_source_length / max_target_length: longest source / target in tokens, not counting the special
            tokens (at most two) and the prompt the model adds; longer ones are cut or refused (``overlong``).
        holdout: fraction of training pairs held out when the source has no validation split.
        limit_train: use only N training pairs (a seeded sample, kept in file order).
    """

    labels = None  # no label set: the targets are text (``setup_labelled`` sees none)

    def __init__(self, tokenizer: TokenizerSpec, source: str = "bbc_headlines", source_field: str = "text",
                 target_field: str = "target", id_field: str = "id", max_source_length: int = 256,
                 max_target_length: int = 32, overlong: Overlong = "truncate", batch_size: int = 16,
                 eval_batch_size: Optional[int] = None, num_workers: int = 0, seed: int = 1234,
                 holdout: float = 0.1, limit_train: Optional[int] = None):
        super().__init__(source, tokenizer, batch_size, eval_batch_size, num_workers, seed, holdout)
        if max_source_length < 1 or max_target_length < 1:
            raise PtmError("Seq2SeqDataModule: max_source_length and max_target_length must be at least 1")
        self.source_field, self.target_field, self.id_field = source_field, target_field, id_field
        self.max_source_length, self.max_target_length = max_source_length, max_target_length
        self.overlong, self.limit_train = overlong, limit_train
        self.splits: dict = {}
        self.encoded: dict[Path, EncodedSplit] = {}  # this run's splits, read once

    def _tokenizer_corpus(self):
        train = self.files["train"]
        fields = (self.source_field, self.target_field)
        texts = lambda: [str(r[f]) for _, r in read_records(train, fields) for f in fields]  # noqa: E731
        return texts, f"{train}:{self.source_field}+{self.target_field}"

    def _encode(self, path: Path) -> EncodedSplit:
        if path not in self.encoded:
            self.encoded[path] = encode_pairs(
                path, self.load_tokenizer(), source_field=self.source_field, target_field=self.target_field,
                id_field=self.id_field, max_source_length=self.max_source_length,
                max_target_length=self.max_target_length, overlong=self.overlong)
        return self.encoded[path]

    def prepare_data(self) -> None:
        for path in self.files.values():
            stats = self._encode(path).stats
            if stats["truncated_sources"] or stats["truncated_targets"]:
                print(f"{path}: {stats['truncated_sources']} sources cut to max_source_length="
                      f"{self.max_source_length}, {stats['truncated_targets']} targets cut to max_target_length="
                      f"{self.max_target_length} tokens (references stay whole)")

    def label_set(self) -> list[str]:
        return []

    def setup(self, stage: str | None = None) -> None:
        self.setup_labelled(target_ids)

    def _add(self, split: str, enc: EncodedSplit, ids: list, index: list[int]) -> None:
        self.splits[split] = {"ids": pick(enc.ids, index), "texts": pick(enc.fields["source"], index),
                              "targets": pick(enc.fields["target"], index), "path": enc.path}
        self.datasets[split] = PairDataset(enc, index)

    def records(self, split: str) -> dict:
        """Ids, sources (``texts``) and reference targets of a split, aligned with its dataset."""
        return self.splits[split]
