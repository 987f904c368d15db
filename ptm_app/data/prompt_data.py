"""Data for prompt-based learning (survey §5.7, App. C.4): labelled records whose text fields are tokenized once,
without special tokens, so that the LightningModule's template can place them (a PET pattern, Schick & Schütze
2021 §3, or GPT-3 in-context demonstrations, Brown et al. 2020 §2).  Few-shot training sets are a seeded random
sample of the training split (PET §4 draws its small training sets at random).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from torch.utils.data import Dataset

from ptm_app.data.datamodules import TaskDataModule
from ptm_app.data.datasets import _index
from ptm_app.data.encoded import EncodedSplit, encoded_split, pick
from ptm_app.data.tasks import read_labelled
from ptm_app.data.tokenizer import TokenizerSpec, tokenizer_fingerprint
from ptm_app.paths import sha256_file


def encode_fields(path: Path, tokenizer, *, text_field: str, text_pair_field: Optional[str], label_field: str,
                  id_field: str, max_length: int) -> EncodedSplit:
    """Tokenize a labelled file's fields once, each record's text (and text pair) as token ids without special
    tokens, cut to ``max_length`` (columns ``text_ids``, ``pair_ids``; fields ``text``, ``label``); later calls
    read the cache (keyed like ``tasks.encode_split``)."""
    key = [sha256_file(path), text_field, text_pair_field, label_field, id_field, max_length,
           tokenizer_fingerprint(tokenizer)]

    def ids(values: list[str]) -> list[list[int]]:
        return tokenizer(values, add_special_tokens=False, truncation=True, max_length=max_length,
                         verbose=False)["input_ids"]

    def build() -> EncodedSplit:
        rec = read_labelled(path, text_field=text_field, text_pair_field=text_pair_field, label_field=label_field,
                            id_field=id_field)
        columns = {"text_ids": ids(rec.texts), **({"pair_ids": ids(rec.pairs)} if rec.pairs else {})}
        return EncodedSplit(columns=columns, fields={"text": rec.texts, "label": rec.labels}, lines=rec.lines,
                            path=rec.path, ids=rec.ids)

    return encoded_split("prompt", key, build)


class PromptDataset(Dataset):
    """Examples as field token ids: ``text_ids``, ``pair_ids`` (None without a pair field), ``label``, ``key``."""

    def __init__(self, text_ids: list[list[int]], labels: list[int], pair_ids: Optional[list[list[int]]] = None):
        self.text_ids, self.labels, self.pair_ids = text_ids, labels, pair_ids

    def __len__(self) -> int:
        return len(self.text_ids)

    def fields(self, i: int) -> dict[str, Optional[list[int]]]:
        """The template fields of example ``i``: ``text`` and ``text_pair`` token ids."""
        return {"text": self.text_ids[i], "text_pair": self.pair_ids[i] if self.pair_ids is not None else None}

    def __getitem__(self, key) -> dict:
        i = _index(key)
        return {"fields": self.fields(i), "label": self.labels[i], "key": key}


class PromptDataModule(TaskDataModule):
    """Labelled records for ``PromptClassifierModule`` (cloze) and ``InContextEvalModule`` (demonstrations).

    Args as ``TaskDataModule``, except:
        max_length: the longest cloze input in tokens, special tokens included (texts are cut to fit, never the
            template or its mask); for in-context learning, the longest text of one example.
        limit_train: use N training examples drawn at random with ``seed`` (few-shot; also the pool of
            in-context demonstrations).  ``TaskDataModule`` keeps the first N instead, which for a file sorted
            by label (``bbc``, ``tweets``) is a single class.
    """

    def __init__(self, tokenizer: TokenizerSpec, source: str = "bbc", text_field: str = "text",
                 text_pair_field: Optional[str] = None, label_field: str = "label", id_field: str = "id",
                 labels: Optional[list[str]] = None, max_length: int = 128, batch_size: int = 8,
                 eval_batch_size: Optional[int] = None, num_workers: int = 0, seed: int = 1234, holdout: float = 0.1,
                 limit_train: Optional[int] = None):
        super().__init__(tokenizer, source, text_field=text_field, text_pair_field=text_pair_field,
                         label_field=label_field, id_field=id_field, labels=labels, max_length=max_length,
                         batch_size=batch_size, eval_batch_size=eval_batch_size, num_workers=num_workers, seed=seed,
                         holdout=holdout, limit_train=limit_train, group_by_length=False)

    def _encode(self, path: Path) -> EncodedSplit:
        return encode_fields(path, self.load_tokenizer(), text_field=self.text_field,
                             text_pair_field=self.text_pair_field, label_field=self.label_field,
                             id_field=self.id_field, max_length=self.max_length)

    def _dataset(self, enc: EncodedSplit, labels: list[int], index: list[int]) -> PromptDataset:
        return PromptDataset(pick(enc.columns["text_ids"], index), labels, pick(enc.columns.get("pair_ids"), index))
