"""Training blocks cut by index arithmetic, never materialised: block ``i`` is computed when it is read.

The same cuts as ``corpus.pack_blocks`` (RoBERTa FULL-SENTENCES packing, Liu et al. 2019 §4.2, or one
document at a time), over an in-memory ``TokenizedCorpus`` or a prepared ``litcorpus.LitCorpus`` (anything with
``num_documents``, ``doc_spans`` and ``tokens``).
Setup costs a cumulative sum over the chosen documents' lengths; reading block ``i`` a binary search.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ptm_app.data.corpus import Packing
from ptm_app.errors import PtmError


class LazyBlocks:
    """``blocks[i]`` is ``(ids, owners)``: ``prefix + chunk + suffix`` and each token's document index,
    exactly as ``pack_blocks(..., with_documents=True)`` would return them at position ``i``."""

    def __init__(self, corpus, block_len: int, prefix: list[int], suffix: list[int],
                 doc_sep: list[int], mode: Packing = "pack", documents: Sequence[int] | np.ndarray | None = None):
        self.content = block_len - len(prefix) - len(suffix)
        if self.content < 1:
            raise PtmError(f"max_length={block_len} leaves no room for tokens after the special tokens")
        self.corpus, self.mode = corpus, mode
        self.pre, self.suf = np.asarray(prefix, np.int32), np.asarray(suffix, np.int32)
        self.sep = np.asarray(doc_sep, np.int32) if mode == "pack" else np.zeros(0, np.int32)
        docs = np.arange(corpus.num_documents) if documents is None else np.asarray(documents, np.int64)
        self.docs = docs
        self.doc_start, self.doc_len = corpus.doc_spans(docs)
        if mode == "pack":
            self.seg_end = np.cumsum(self.doc_len + len(self.sep))  # end of each document (+ separator) in the stream
            total = int(self.seg_end[-1]) if len(docs) else 0
            self.total = total
            self.n = total // self.content or (1 if total else 0)
        else:
            per_doc = -(-self.doc_len // self.content)
            self.block_end = np.cumsum(per_doc)
            self.n = int(self.block_end[-1]) if len(docs) else 0

    def __len__(self) -> int:
        return self.n

    def _doc(self, k: int, lo: int, hi: int) -> np.ndarray:
        """Tokens ``lo:hi`` of the k-th chosen document followed by its separator."""
        n, start = int(self.doc_len[k]), int(self.doc_start[k])
        parts = []
        if lo < n:
            parts.append(self.corpus.tokens(start + lo, start + min(hi, n)))
        if hi > n:
            parts.append(self.sep[max(lo, n) - n: hi - n])
        return np.concatenate(parts) if len(parts) > 1 else np.asarray(parts[0], np.int32)

    def chunk(self, i: int, owners: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
        """Block ``i`` without its special tokens, and (``owners``) each token's document index."""
        if not 0 <= i < self.n:
            raise IndexError(i)
        if self.mode != "pack":
            k = int(np.searchsorted(self.block_end, i, side="right"))
            j = i - (int(self.block_end[k]) - -(-int(self.doc_len[k]) // self.content))
            ids = self._doc(k, j * self.content, min((j + 1) * self.content, int(self.doc_len[k])))
            return ids, (np.full(len(ids), self.docs[k], np.int64) if owners else None)
        start = i * self.content
        stop = min(start + self.content, self.total) if self.total >= self.content else self.total
        k = int(np.searchsorted(self.seg_end, start, side="right"))
        parts, owned = [], []
        while start < stop:
            seg_start = int(self.seg_end[k]) - int(self.doc_len[k]) - len(self.sep)
            end = min(stop, int(self.seg_end[k]))
            part = self._doc(k, start - seg_start, end - seg_start)
            parts.append(part)
            if owners:
                owned.append(np.full(len(part), self.docs[k], np.int64))
            start, k = end, k + 1
        ids = np.concatenate(parts).astype(np.int32, copy=False) if len(parts) > 1 else parts[0]
        return ids, (np.concatenate(owned) if owners else None)

    def ids(self, i: int) -> np.ndarray:
        return np.concatenate([self.pre, self.chunk(int(i), owners=False)[0], self.suf])

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        chunk, owner = self.chunk(int(i))
        ids = np.concatenate([self.pre, chunk, self.suf])
        owners = np.concatenate([np.full(len(self.pre), owner[0]), owner, np.full(len(self.suf), owner[-1])])
        return ids, owners


class BlockView:
    """One side of ``LazyBlocks`` as a sequence: the ids (``part=0``) or the owners (``part=1``)."""

    def __init__(self, blocks: LazyBlocks, part: int):
        self.blocks, self.part = blocks, part

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.blocks.ids(i) if self.part == 0 else self.blocks[i][1]
