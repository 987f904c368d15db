"""Map-style datasets that accept the sampler's ``(epoch, index)`` keys (or plain indices)."""
from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset


def _index(key) -> int:
    return key[1] if isinstance(key, tuple) else int(key)


class BlockDataset(Dataset):
    """Token blocks for pre-training; with ``documents`` (per block, each token's document index) an item
    also carries ``document_ids``, for document-boundary attention."""

    def __init__(self, blocks: list[np.ndarray], documents: list[np.ndarray] | None = None):
        self.blocks, self.documents = blocks, documents

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, key) -> dict:
        i = _index(key)
        item = {"input_ids": torch.from_numpy(np.asarray(self.blocks[i], dtype=np.int64)), "key": key}
        if self.documents is not None:
            item["document_ids"] = torch.from_numpy(np.asarray(self.documents[i], dtype=np.int64))
        return item

    def lengths(self) -> list[int]:
        return [len(b) for b in self.blocks]


class EncodedDataset(Dataset):
    """Tokenized labelled examples: ``input_ids`` (+ ``token_type_ids``) and an integer ``label``."""

    def __init__(self, input_ids: list, labels: list[int] | None, token_type_ids: list | None = None):
        self.input_ids, self.labels, self.token_type_ids = input_ids, labels, token_type_ids

    def __len__(self) -> int:
        return len(self.input_ids)

    def lengths(self) -> list[int]:
        return [len(ids) for ids in self.input_ids]

    def __getitem__(self, key) -> dict:
        i = _index(key)
        item = {"input_ids": torch.as_tensor(self.input_ids[i], dtype=torch.long), "key": key}
        if self.token_type_ids is not None:
            item["token_type_ids"] = torch.as_tensor(self.token_type_ids[i], dtype=torch.long)
        if self.labels is not None:
            item["label"] = self.labels[i]
        return item


class SentencePairDataset(Dataset):
    """NSP / SOP examples drawn from document boundaries (BERT §3.1 task 2; ALBERT §4.1).

    One anchor per (document, sentence) that has a following sentence.  The pair for a key
    ``(epoch, index)`` is drawn from an rng seeded by the key, so pairs change every epoch
    (like dynamic masking) yet a resumed run sees the same ones.  With ``static_copies`` = k (static
    masking, BERT's pre-built data) the rng is seeded by the example's index alone, copy ``epoch % k``
    (``corruption.static_key``): the same pair in every epoch (k = 1).  ``sentence_label``:
    0 = the real continuation / original order, 1 = a random segment (NSP) / swapped (SOP),
    the convention of transformers' ``BertForPreTraining`` and ``AlbertForPreTraining``.
    """

    def __init__(self, documents: list[list[list[int]]], kind: str, max_length: int, seed: int,
                 cls_id: int, sep_id: int, static_copies: int | None = None):
        self.documents, self.kind, self.seed, self.static_copies = documents, kind, seed, static_copies
        self.max_tokens, self.cls_id, self.sep_id = max_length - 3, cls_id, sep_id
        # anchors (d, s) in document order, found by index arithmetic (no list: documents may be memory-mapped)
        counts = (documents.sentence_counts() if hasattr(documents, "sentence_counts")
                  else np.fromiter((len(doc) for doc in documents), np.int64, len(documents)))
        self.pairs_per_doc = np.maximum(np.asarray(counts, np.int64) - 1, 0)
        self.anchor_end = np.cumsum(self.pairs_per_doc)
        if not len(self):
            from ptm_app.errors import PtmError

            raise PtmError(f"{kind} needs documents with at least two sentences (lines); none found in the corpus")

    def __len__(self) -> int:
        return int(self.anchor_end[-1]) if len(self.anchor_end) else 0

    def anchor(self, i: int) -> tuple[int, int]:
        """The ``i``-th (document, sentence) that has a following sentence."""
        if not 0 <= i < len(self):
            raise IndexError(i)
        d = int(np.searchsorted(self.anchor_end, i, side="right"))
        return d, i - int(self.anchor_end[d] - self.pairs_per_doc[d])

    def __getitem__(self, key) -> dict:
        from ptm_app.data.corruption import pairs
        from ptm_app.data.corruption.masking import draw_rng, static_key

        doc, sentence = self.anchor(_index(key))
        static = self.static_copies is not None
        rng = draw_rng(self.seed, ["pair", static_key(key, self.static_copies)] if static else [key])
        make = pairs.nsp_example if self.kind == "nsp" else pairs.sop_example
        a, b, label = make(self.documents, doc, sentence, rng, max_tokens=self.max_tokens)
        if self.kind == "nsp":
            label = 0 if label else 1  # nsp_example returns is_next
        ids, types = pairs.pair_input(a, b, cls_id=self.cls_id, sep_id=self.sep_id)
        return {"input_ids": torch.tensor(ids), "token_type_ids": torch.tensor(types), "sentence_label": label,
                "key": key}
