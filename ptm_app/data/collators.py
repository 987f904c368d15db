"""Collators, every batch layout in one place: pad a list of examples and apply the objective's corruption, drawn
per batch (pre-training), or lay out a task's labels (tagging, QA windows, multiple choice, TLM pairs, multitask).

Each batch's random draws come from a generator seeded by the run seed and the batch's sample
keys ``(epoch, index)``: dynamic masking (RoBERTa, Liu et al. 2019 §4.1) that is still exactly
reproducible when a run resumes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Optional

import torch

from ptm_app.constants import IGNORE_INDEX
from ptm_app.data.corruption import draw_generator, draw_rng, mlm_mask

SCALAR_FIELDS = {"label": "labels", "sentence_label": "sentence_labels"}


def pad(seqs: list[torch.Tensor], value: int) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=value)


@dataclass
class PadCollator:
    """Pads ``input_ids`` (and ``token_type_ids``), builds ``attention_mask``, keeps ``keys``."""

    pad_token_id: int

    def pad_batch(self, examples: list[dict]) -> dict:
        ids = [e["input_ids"] for e in examples]
        batch = {
            "input_ids": pad(ids, self.pad_token_id),
            "attention_mask": pad([torch.ones_like(i) for i in ids], 0),
            "keys": [e["key"] for e in examples],
        }
        if "token_type_ids" in examples[0]:
            batch["token_type_ids"] = pad([e["token_type_ids"] for e in examples], 0)
        if "document_ids" in examples[0]:  # packed documents: the model keeps their attention apart
            batch["document_ids"] = pad([e["document_ids"] for e in examples], -1)
        for name, batch_name in SCALAR_FIELDS.items():
            if name in examples[0]:
                batch[batch_name] = torch.tensor([e[name] for e in examples])
        return batch

    def __call__(self, examples: list[dict]) -> dict:
        return self.pad_batch(examples)


@dataclass
class MLMCollator(PadCollator):
    """Masked-LM inputs/labels; special tokens and padding are never selected.

    ``masking``: ``token`` (BERT §3.1: 15 %, 80/10/10 per token), ``whole_word`` (BERT-wwm: every
    sub-token of a chosen word), or ``span`` (SpanBERT §3.1: geometric span lengths, p=0.2, at most
    10 words, 80/10/10 per span; also emits span-boundary targets for SBO).
    ``static``: draw each sample's mask once and reuse it every epoch (BERT's static masking) instead
    of anew every epoch (RoBERTa §4.1 dynamic masking).
    """

    mask_token_id: int = 0
    special_ids: tuple[int, ...] = ()
    vocab_size: int = 0
    seed: int = 0
    mlm_probability: float = 0.15
    mask_ratio: float = 0.8
    random_ratio: float = 0.1
    masking: Literal["token", "whole_word", "span"] = "token"
    static: bool = False
    word_start: Optional[torch.Tensor] = None  # bool per vocab id: does this token begin a word?
    span_p: float = 0.2
    max_span_length: int = 10

    def __post_init__(self) -> None:
        normal = torch.ones(self.vocab_size, dtype=torch.bool)
        normal[list(self.special_ids)] = False
        self._random_ids = normal.nonzero().squeeze(1)
        self._special = torch.tensor(sorted(self.special_ids), dtype=torch.long)
        if self.masking != "token" and self.word_start is None:
            raise ValueError(f"masking={self.masking!r} needs word_start (from the tokenizer's vocabulary)")

    def _keys(self, batch: dict) -> list:
        keys = batch["keys"]
        return [k[1] if isinstance(k, tuple) else k for k in keys] if self.static else keys

    def __call__(self, examples: list[dict]) -> dict:
        batch = self.pad_batch(examples)
        ids = batch["input_ids"]
        maskable = batch["attention_mask"].bool() & ~torch.isin(ids, self._special)
        if self.masking == "token":
            batch["input_ids"], batch["labels"] = mlm_mask(
                ids, maskable, mask_token_id=self.mask_token_id, vocab_size=self.vocab_size,
                generator=draw_generator(self.seed, self._keys(batch)), mlm_probability=self.mlm_probability,
                mask_ratio=self.mask_ratio, random_ratio=self.random_ratio, random_ids=self._random_ids,
            )
            return batch
        return self._word_level(batch, maskable)

    def _word_level(self, batch: dict, maskable: torch.Tensor) -> dict:
        from ptm_app.data.corruption import spans as sp

        rng = draw_rng(self.seed, self._keys(batch))
        random_ids = self._random_ids.tolist()
        out_ids, labels = batch["input_ids"].clone(), torch.full_like(batch["input_ids"], IGNORE_INDEX)
        sbo: dict[str, list[int]] = {"rows": [], "left": [], "right": [], "offset": [], "pos": []}
        for row in range(out_ids.shape[0]):
            positions = maskable[row].nonzero().squeeze(1)
            content = out_ids[row, positions].tolist()
            if not content:
                continue
            starts = self.word_start[content].tolist()
            if self.masking == "whole_word":
                corrupted, lab = sp.whole_word_mask(
                    content, starts, rng, mask_token_id=self.mask_token_id, vocab_size=self.vocab_size,
                    rate=self.mlm_probability, mask_ratio=self.mask_ratio, random_ratio=self.random_ratio,
                    random_ids=random_ids)
            else:
                spans = sp.geometric_spans(len(content), rng, rate=self.mlm_probability, p=self.span_p,
                                           max_len=self.max_span_length, word_starts=starts)
                corrupted, lab = sp.span_mask(content, spans, rng, mask_token_id=self.mask_token_id,
                                              vocab_size=self.vocab_size, random_ids=random_ids)
                left, right, offset, pos = sp.sbo_targets(spans, out_ids.shape[1], positions.tolist())
                for name, values in (("rows", [row] * len(pos)), ("left", left), ("right", right),
                                     ("offset", offset), ("pos", pos)):
                    sbo[name].extend(values)
            out_ids[row, positions] = torch.tensor(corrupted, dtype=out_ids.dtype)
            labels[row, positions] = torch.tensor(lab, dtype=labels.dtype)
        batch["input_ids"], batch["labels"] = out_ids, labels
        if self.masking == "span":
            batch["sbo"] = {k: torch.tensor(v, dtype=torch.long) for k, v in sbo.items()}
        return batch


def word_start_table(tokenizer, vocab_size: int) -> torch.Tensor:
    """Per vocabulary id: True if the token begins a word (WordPiece: no ``##``; byte BPE: ``Ġ``)."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(vocab_size)))
    byte_level = any(t.startswith("Ġ") for t in tokens if t)
    if byte_level:
        return torch.tensor([bool(t) and t.startswith("Ġ") for t in tokens])
    return torch.tensor([not (t or "").startswith("##") for t in tokens])


@dataclass
class CLMCollator(PadCollator):
    """Causal LM: labels are the inputs (the model shifts them); padding is ignored.

    With packed ``document_ids`` the first token of each document after the first is not a target: its
    prediction would come from the previous document (as ``DataCollatorWithFlattening`` in transformers)."""

    def __call__(self, examples: list[dict]) -> dict:
        batch = self.pad_batch(examples)
        batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, IGNORE_INDEX)
        if "document_ids" in batch:
            docs = batch["document_ids"]
            batch["labels"][:, 1:].masked_fill_(docs[:, 1:] != docs[:, :-1], IGNORE_INDEX)
        return batch


@dataclass
class TokenLabelCollator(PadCollator):
    """Pads ``labels`` with -100 and ``word_index`` with -1 besides the inputs."""

    def __call__(self, examples: list[dict]) -> dict:
        batch = self.pad_batch(examples)
        batch["labels"] = pad([e["labels"] for e in examples], IGNORE_INDEX)
        batch["word_index"] = pad([e["word_index"] for e in examples], -1)
        return batch


@dataclass
class QACollator(PadCollator):
    """Pads the windows; ``offsets`` are padded with -1 (outside the context)."""

    def __call__(self, examples: list[dict]) -> dict:
        batch = self.pad_batch(examples)
        for name in ("start_position", "end_position", "example"):
            batch[f"{name}s"] = torch.tensor([e[name] for e in examples], dtype=torch.long)
        batch["offsets"] = pad([e["offsets"] for e in examples], -1)
        return batch


class ChoiceCollator:
    """Questions → ``input_ids`` / ``attention_mask`` (/ ``token_type_ids``) ``[B·N, L]`` and ``labels [B]``."""

    def __init__(self, pad_token_id: int):
        self.pad_token_id = pad_token_id

    def __call__(self, examples: list[dict]) -> dict:
        rows = [ids for e in examples for ids in e["choices"]]
        batch = {"input_ids": pad(rows, self.pad_token_id),
                 "attention_mask": pad([torch.ones_like(r) for r in rows], 0),
                 "labels": torch.tensor([e["label"] for e in examples], dtype=torch.long),
                 "keys": [e["key"] for e in examples]}
        if "choice_types" in examples[0]:
            batch["token_type_ids"] = pad([t for e in examples for t in e["choice_types"]], 0)
        return batch


@dataclass
class TLMCollator(MLMCollator):
    """``MLMCollator`` (15 %, 80/10/10 over both sentences, never special tokens or padding) that also
    pads the language ids and the reset position ids."""

    def pad_batch(self, examples: list[dict]) -> dict:
        batch = super().pad_batch(examples)
        for name in ("langs", "position_ids"):
            batch[name] = pad([e[name] for e in examples], 0)
        return batch


@dataclass
class TaggedCollator:
    """Collates with the task's own collator and records the task's name in the batch."""

    inner: Callable
    task: str

    def __call__(self, examples: list[dict]) -> dict:
        return {**self.inner(examples), "task": self.task}
