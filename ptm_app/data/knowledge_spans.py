"""Span-annotated corpora for knowledge-enriched MLM: ERNIE (Baidu) phrase/entity masking (Sun et al. 2019 §3.2)
and SenseBERT's supersense targets (Levine et al. 2020 §3).

A corpus record (``data prepare brown_spans``) is one sentence: ``text``, character spans ``phrases`` and
``entities`` (``[[start, end], ...]``) and ``senses`` (``[[start, end, mask], ...]``, bit k = WordNet
lexicographer file k).  Each sentence is tokenized once with the fast tokenizer's offsets (cached like
``corpus.py``); a token belongs to a span when their characters overlap, so phrases and entities become per-token
unit ids (``-1`` outside) and a word's supersense mask goes to its first sub-token.  Blocks pack whole sentences
of one document (a longer sentence is cut); the collator (``KnowledgeMLMCollator``) draws the masks per batch.
"""
from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ptm_app.data import IGNORE_INDEX
from ptm_app.data.collators import MLMCollator, pad
from ptm_app.data.corruption.knowledge import LEVELS, knowledge_mask
from ptm_app.data.datasets import _index
from ptm_app.data.formats import read_records
from ptm_app.data.tokenizer import is_bert_style, tokenizer_fingerprint
from ptm_app.errors import PtmError
from ptm_app.paths import atomic_dir, cache_root, sha256_file

FORMAT_VERSION = 1
# the examples a target may need (data.examples) -> the record fields they read
SPAN_FIELDS = {"knowledge_spans": ("phrases", "entities"), "supersenses": ("senses",)}


def _cache_dir(path: Path, tokenizer) -> Path:
    key = json.dumps(["spans", FORMAT_VERSION, sha256_file(path), tokenizer_fingerprint(tokenizer)])
    return cache_root() / "tokenized" / hashlib.sha256(key.encode()).hexdigest()[:20]


def _overlapping(ends: list[int], offsets: list[tuple[int, int]], a: int, b: int) -> range:
    """Indices of the tokens whose characters overlap ``[a, b)`` (offsets sorted, as a tokenizer gives them)."""
    first = bisect.bisect_right(ends, a)
    last = first
    while last < len(offsets) and offsets[last][0] < b:
        last += 1
    return range(first, last)


def token_units(offsets: list[tuple[int, int]], spans, first: int) -> tuple[list[int], int]:
    """Per token the index (``first``, ``first + 1`` ...) of the char span it overlaps, ``-1`` if none."""
    out, ends = [-1] * len(offsets), [e for _, e in offsets]
    for k, span in enumerate(spans):
        for t in _overlapping(ends, offsets, int(span[0]), int(span[1])):
            out[t] = first + k
    return out, first + len(spans)


def token_senses(offsets: list[tuple[int, int]], senses) -> list[int]:
    """Per token the supersense mask of the word it starts (its first overlapping sub-token), else 0."""
    out, ends = [0] * len(offsets), [e for _, e in offsets]
    for a, b, mask in senses:
        hit = _overlapping(ends, offsets, int(a), int(b))
        if len(hit):
            out[hit[0]] = int(mask)
    return out


def tokenize_spans(path: Path, tokenizer, required: tuple[str, ...], progress: bool = True) -> Path:
    """Tokenize a span-annotated split once into the cache; returns the cache directory."""
    if not getattr(tokenizer, "is_fast", False):
        raise PtmError("knowledge spans need a fast tokenizer (character offsets); use a tokenizers-backed one")
    fields = tuple(f for kind in required for f in SPAN_FIELDS[kind])
    for line, rec in read_records(path, ("text",)):
        missing = [f for f in fields if f not in rec]
        if missing:
            raise PtmError(f"{path}:{line}: no '{missing[0]}' span field: this corpus has no knowledge spans; "
                           f"use data.init_args.source: brown_spans (python main.py data prepare brown_spans)")
        break
    target = _cache_dir(path, tokenizer)
    if (target / "meta.json").exists():
        return target
    records = [rec for _, rec in read_records(path, ("text",))]
    from rich.progress import track

    ids, phrase, entity, senses, lengths, docs = [], [], [], [], [], []
    next_phrase = next_entity = 0
    for rec in track(records, description=f"tokenizing spans {path.name}", disable=not progress, transient=True):
        enc = tokenizer(rec["text"], add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        offsets = [tuple(o) for o in enc["offset_mapping"]]
        ids += enc["input_ids"]
        units, next_phrase = token_units(offsets, rec.get("phrases", ()), next_phrase)
        phrase += units
        units, next_entity = token_units(offsets, rec.get("entities", ()), next_entity)
        entity += units
        senses += token_senses(offsets, rec.get("senses", ()))
        lengths.append(len(offsets))
        docs.append(str(rec.get("doc", rec.get("id", len(docs)))))
    starts = [0] + [i for i in range(1, len(docs)) if docs[i] != docs[i - 1]]
    with atomic_dir(target) as tmp:
        np.save(tmp / "ids.npy", np.asarray(ids, np.int32))
        np.save(tmp / "phrase.npy", np.asarray(phrase, np.int32))
        np.save(tmp / "entity.npy", np.asarray(entity, np.int32))
        np.save(tmp / "senses.npy", np.asarray(senses, np.int64))
        np.save(tmp / "line_offsets.npy", np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
        np.save(tmp / "doc_offsets.npy", np.asarray(starts + [len(docs)], np.int64))
        (tmp / "meta.json").write_text(json.dumps({"source": str(path), "sentences": len(docs),
                                                   "documents": len(starts), "tokens": len(ids)}))
    return target


@dataclass
class SpanCorpus:
    ids: np.ndarray
    phrase: np.ndarray
    entity: np.ndarray
    senses: np.ndarray
    line_offsets: np.ndarray
    doc_offsets: np.ndarray

    @classmethod
    def load(cls, cache: Path) -> "SpanCorpus":
        return cls(*(np.load(cache / f"{name}.npy") for name in
                     ("ids", "phrase", "entity", "senses", "line_offsets", "doc_offsets")))

    @property
    def num_documents(self) -> int:
        return len(self.doc_offsets) - 1

    def blocks(self, content: int, documents) -> list[tuple[int, int]]:
        """Token ranges of at most ``content`` tokens: whole sentences of one document packed greedily, a longer
        sentence cut into pieces."""
        out = []
        for d in documents:
            first, last = self.doc_offsets[d], self.doc_offsets[d + 1]
            start = end = int(self.line_offsets[first])
            for s in range(first, last):
                a, b = int(self.line_offsets[s]), int(self.line_offsets[s + 1])
                if b - start > content and end > start:
                    out.append((start, end))
                    start = a
                while b - start > content:
                    out.append((start, start + content))
                    start += content
                end = b
            if end > start:
                out.append((start, end))
        return out


class SpanBlockDataset(Dataset):
    """``[CLS] block [SEP]`` with per-token ``phrase_ids``, ``entity_ids`` (``-1`` outside a unit and at the
    special tokens) and ``senses`` (a supersense bit mask at a word's first sub-token, else 0)."""

    def __init__(self, corpus: SpanCorpus, ranges: list[tuple[int, int]], cls_id: int, sep_id: int):
        self.corpus, self.ranges, self.cls_id, self.sep_id = corpus, ranges, cls_id, sep_id

    def __len__(self) -> int:
        return len(self.ranges)

    def lengths(self) -> list[int]:
        return [b - a + 2 for a, b in self.ranges]

    def __getitem__(self, key) -> dict:
        a, b = self.ranges[_index(key)]
        c = self.corpus

        def framed(values: np.ndarray, first: int, last: int) -> torch.Tensor:
            return torch.from_numpy(np.concatenate([[first], values[a:b], [last]]).astype(np.int64))

        return {"input_ids": framed(c.ids, self.cls_id, self.sep_id), "phrase_ids": framed(c.phrase, -1, -1),
                "entity_ids": framed(c.entity, -1, -1), "senses": framed(c.senses, 0, 0), "key": key}


def span_datasets(dm, required: tuple[str, ...], holdout_split, progress: bool = False) -> dict[str, SpanBlockDataset]:
    """The splits of ``dm`` (a ``PretrainDataModule``) as span blocks of ``dm.max_length`` tokens; without a
    validation file, ``holdout_split(n, fraction, seed)`` holds documents out of train."""
    tok = dm.load_tokenizer()
    if not is_bert_style(tok):
        raise PtmError("knowledge spans need a BERT-style tokenizer ([CLS]/[SEP]); use train: wordpiece")
    content = dm.max_length - 2
    if content < 1:
        raise PtmError(f"max_length={dm.max_length} leaves no room for tokens after [CLS] and [SEP]")
    corpora = {split: SpanCorpus.load(tokenize_spans(path, tok, required, progress))
               for split, path in dm.files.items() if not isinstance(path, tuple)}
    docs = {split: list(range(c.num_documents)) for split, c in corpora.items()}
    if "validation" not in corpora:
        docs["train"], docs["validation"] = holdout_split(corpora["train"].num_documents, dm.holdout, dm.seed)
        corpora["validation"] = corpora["train"]
    if dm.limit_documents:
        docs["train"] = docs["train"][: dm.limit_documents]
    return {split: SpanBlockDataset(c, c.blocks(content, docs[split]), tok.cls_token_id, tok.sep_token_id)
            for split, c in corpora.items()}


@dataclass
class KnowledgeMLMCollator(MLMCollator):
    """``MLMCollator`` over span blocks: pads the unit ids and sense masks, and with ``masking: knowledge``
    draws ERNIE's unit masks (``corruption.knowledge``).  ``knowledge_levels``: ``staged`` gives the batch one
    view per level (``knowledge_views``: word, phrase, entity) and the module trains on its current stage's
    view; ``mixed`` masks entities, phrases and words in one draw."""

    knowledge_levels: str = "staged"

    def pad_batch(self, examples: list[dict]) -> dict:
        batch = super().pad_batch(examples)
        for name, fill in (("phrase_ids", -1), ("entity_ids", -1), ("senses", 0)):
            if name in examples[0]:
                batch[name] = pad([e[name] for e in examples], fill)
        return batch

    def __call__(self, examples: list[dict]) -> dict:
        if self.masking != "knowledge":
            return super().__call__(examples)
        if "phrase_ids" not in examples[0]:
            raise PtmError("masking: knowledge needs sentence blocks with phrase and entity spans, but the data "
                           "module built other examples; remove data.init_args.examples")
        batch = self.pad_batch(examples)
        ids = batch["input_ids"]
        maskable = batch["attention_mask"].bool() & ~torch.isin(ids, self._special)
        rngs = self.row_rngs(batch)
        random_ids = self._random_ids.tolist()
        levels = LEVELS if self.knowledge_levels == "staged" else ("mixed",)
        views = {level: (ids.clone(), torch.full_like(ids, IGNORE_INDEX)) for level in levels}
        for row in range(ids.shape[0]):
            positions = maskable[row].nonzero().squeeze(1)
            content = ids[row, positions].tolist()
            if not content:
                continue
            starts = self.word_start[content].tolist()
            phrase, entity = batch["phrase_ids"][row, positions].tolist(), batch["entity_ids"][row, positions].tolist()
            for level in levels:
                corrupted, lab = knowledge_mask(
                    content, starts, phrase, entity, rngs[row], level=level, mask_token_id=self.mask_token_id,
                    vocab_size=self.vocab_size, rate=self.mlm_probability, mask_ratio=self.mask_ratio,
                    random_ratio=self.random_ratio, random_ids=random_ids)
                views[level][0][row, positions] = torch.tensor(corrupted, dtype=ids.dtype)
                views[level][1][row, positions] = torch.tensor(lab, dtype=ids.dtype)
        batch["input_ids"], batch["labels"] = views[levels[0]]
        if len(levels) > 1:
            batch["knowledge_views"] = {level: {"input_ids": v[0], "labels": v[1]} for level, v in views.items()}
        return batch
