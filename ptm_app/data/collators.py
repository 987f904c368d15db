"""Collators, every batch layout in one place: pad a list of examples and apply the objective's corruption, drawn
per batch (pre-training), or lay out a task's labels (tagging, QA windows, multiple choice, TLM pairs, multitask,
PET cloze inputs and in-context prompts).

Each batch's random draws come from a generator seeded by the run seed and the batch's sample
keys ``(epoch, index)``: dynamic masking (RoBERTa, Liu et al. 2019 §4.1) that is still exactly
reproducible when a run resumes.  Static masking seeds each example from its own key instead
(``MLMCollator.static``).  Collators draw on the CPU, so a seed gives the same corruption on every machine.
"""
from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Literal, Optional, Protocol, Sequence

import numpy as np
import torch

from ptm_app.data import IGNORE_INDEX
from ptm_app.data.corruption import draw_generator, draw_rng, mlm_mask, static_key
from ptm_app.data.prompts import Fields, PromptEncoder
from ptm_app.errors import PtmError


class ExamplePool(Protocol):
    """The demonstrations an in-context prompt draws from (``data.prompt_data.PromptDataset``)."""

    labels: Sequence[int]

    def __len__(self) -> int: ...

    def fields(self, i: int) -> Fields: ...

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
    10 words, ``mask_ratio``/``random_ratio`` per span, each span inside one segment: never across a
    [SEP]; also emits span-boundary targets for SBO).
    ``static``: BERT's static masking (RoBERTa §4.1): each example's mask is drawn once, from the example's own
    key and over its own tokens, so it is the same whatever batch the example lands in and in every epoch;
    ``static_copies`` = k gives each example one of k fixed masks (epoch ``e`` uses copy ``e % k``, as BERT's
    ``dupe_factor``).  Otherwise masks are dynamic (RoBERTa §4.1): drawn anew for every batch from its keys.
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
    static_copies: int = 1

    def __post_init__(self) -> None:
        normal = torch.ones(self.vocab_size, dtype=torch.bool)
        normal[list(self.special_ids)] = False
        self._random_ids = normal.nonzero().squeeze(1)
        self._special = torch.tensor(sorted(self.special_ids), dtype=torch.long)
        if self.masking != "token" and self.word_start is None:
            raise ValueError(f"masking={self.masking!r} needs word_start (from the tokenizer's vocabulary)")

    def _static_keys(self, batch: dict) -> list[list]:
        """Per row, the keys its static draw is seeded with (the example's own, ``static_key``)."""
        return [[static_key(key, self.static_copies)] for key in batch["keys"]]

    def row_rngs(self, batch: dict) -> list[random.Random]:
        """The ``random.Random`` each row draws from: static, the row's own; dynamic, one per batch (shared)."""
        if self.static:
            return [draw_rng(self.seed, keys) for keys in self._static_keys(batch)]
        return [draw_rng(self.seed, batch["keys"])] * len(batch["keys"])

    def __call__(self, examples: list[dict]) -> dict:
        batch = self.pad_batch(examples)
        ids = batch["input_ids"]
        maskable = batch["attention_mask"].bool() & ~torch.isin(ids, self._special)
        if self.masking != "token":
            return self._word_level(batch, maskable)
        mask = partial(mlm_mask, mask_token_id=self.mask_token_id, vocab_size=self.vocab_size,
                       mlm_probability=self.mlm_probability, mask_ratio=self.mask_ratio,
                       random_ratio=self.random_ratio, random_ids=self._random_ids)
        if not self.static:
            batch["input_ids"], batch["labels"] = mask(ids, maskable, generator=draw_generator(self.seed, batch["keys"]))
            return batch
        out, labels = ids.clone(), torch.full_like(ids, IGNORE_INDEX)
        for row, keys in enumerate(self._static_keys(batch)):  # each example over its own (unpadded) tokens
            n = int(batch["attention_mask"][row].sum())
            out[row, :n], labels[row, :n] = mask(ids[row, :n], maskable[row, :n],
                                                 generator=draw_generator(self.seed, keys))
        batch["input_ids"], batch["labels"] = out, labels
        return batch

    def _word_level(self, batch: dict, maskable: torch.Tensor) -> dict:
        from ptm_app.data.corruption import spans as sp

        rngs = self.row_rngs(batch)
        random_ids = self._random_ids.tolist()
        ratios = dict(mask_ratio=self.mask_ratio, random_ratio=self.random_ratio, random_ids=random_ids)
        out_ids, labels = batch["input_ids"].clone(), torch.full_like(batch["input_ids"], IGNORE_INDEX)
        sbo: dict[str, list[int]] = {"rows": [], "left": [], "right": [], "offset": [], "pos": []}
        for row in range(out_ids.shape[0]):
            positions = maskable[row].nonzero().squeeze(1)
            content = out_ids[row, positions].tolist()
            if not content:
                continue
            starts = self.word_start[content].tolist()
            segments = segment_bounds(positions.tolist())
            for first, _ in segments:  # a segment begins a word, whatever its first piece
                starts[first] = True
            rng = rngs[row]
            if self.masking == "whole_word":
                corrupted, lab = sp.whole_word_mask(
                    content, starts, rng, mask_token_id=self.mask_token_id, vocab_size=self.vocab_size,
                    rate=self.mlm_probability, **ratios)
            else:  # SpanBERT draws spans within a segment (§3.1): each run between special tokens on its own
                spans = [(first + a, first + b) for first, last in segments
                         for a, b in sp.geometric_spans(last - first, rng, rate=self.mlm_probability, p=self.span_p,
                                                        max_len=self.max_span_length, word_starts=starts[first:last])]
                corrupted, lab = sp.span_mask(content, spans, rng, mask_token_id=self.mask_token_id,
                                              vocab_size=self.vocab_size, **ratios)
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


def segment_bounds(positions: Sequence[int]) -> list[tuple[int, int]]:
    """``(first, end)`` index ranges of ``positions`` (a row's maskable positions, ascending) that are consecutive
    in the row: the segments between special tokens ([CLS] A [SEP] B [SEP] gives A and B)."""
    cuts = [i for i in range(1, len(positions)) if positions[i] != positions[i - 1] + 1]
    return list(zip([0, *cuts], [*cuts, len(positions)])) if positions else []


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
class MixCollator(TLMCollator):
    """XLM's mix of objectives (Lample & Conneau 2019 §3): each example holds a monolingual block (``mono``, for
    CLM and MLM) and an aligned pair (``para``, for TLM); both parts are collated as TLM examples (masked, with
    language and position ids), the pair's masks drawn from other keys (``[key, "para"]``) than the block's.
    Examples without parts (plain TLM pairs) are collated as ``TLMCollator`` does."""

    def __call__(self, examples: list[dict]) -> dict:
        if "mono" not in examples[0]:
            return super().__call__(examples)
        return {"mono": super().__call__([{**e["mono"], "key": e["key"]} for e in examples]),
                "para": super().__call__([{**e["para"], "key": [e["key"], "para"]} for e in examples]),
                "keys": [e["key"] for e in examples]}


@dataclass
class TaggedCollator:
    """Collates with the task's own collator and records the task's name in the batch."""

    inner: Callable
    task: str

    def __call__(self, examples: list[dict]) -> dict:
        return {**self.inner(examples), "task": self.task}


def _text_key(fields: Fields) -> tuple:
    return tuple(fields["text"]), tuple(fields.get("text_pair") or ())


@dataclass
class ClozeCollator(PadCollator):
    """PET inputs (§3): each example's pattern with one mask token, at most ``max_length`` tokens, padded;
    ``mask_positions`` holds each row's mask index."""

    encoder: Optional[PromptEncoder] = None
    max_length: int = 512

    def __call__(self, examples: list[dict]) -> dict:
        built = [self.encoder.cloze(e["fields"], self.max_length) for e in examples]
        batch = self.pad_batch([{"input_ids": torch.tensor(ids), "key": e["key"], "label": e["label"]}
                                for (ids, _), e in zip(built, examples)])
        batch["mask_positions"] = torch.tensor([at for _, at in built])
        return batch


@dataclass
class InContextCollator(PadCollator):
    """k-shot prompts (GPT-3, Brown et al. 2020 §2), one row per (example, candidate label).

    An example's k demonstrations are distinct training examples drawn by a generator seeded with ``seed`` and
    the example's own tokens (the same in every run and batch), never one with the example's text.  A row is
    [special prefix] instruction, demonstrations (template with their gold label), the query up to the slot, and
    a candidate label's tokens; rows are left-padded, so every row ends with its label.  Demonstrations are
    dropped from the front while a row would exceed ``max_length`` (the model's positions; GPT-3 also uses as
    many as fit); ``shots`` counts those used.

    When every label is one token (``one_row``, the default then), an example needs one row, not one per label:
    the labels' scores are read off the next-token distribution at the slot (same scores, C times fewer rows).
    With ``content_free`` ids, each example gets a second query after the same demonstrations, the content-free
    input of contextual calibration (Zhao et al. 2021 §5, "N/A").
    """

    encoder: Optional[PromptEncoder] = None
    pool: Optional[ExamplePool] = None
    answers: list[list[int]] = field(default_factory=list)  # each label's verbalised tokens
    k_shot: int = 0
    seed: int = 0
    instruction: list[int] = field(default_factory=list)
    max_length: Optional[int] = None
    content_free: Optional[list[int]] = None  # calibration's content-free text, for every field of the query
    one_row: Optional[bool] = None  # None: when every label is a single token

    def __post_init__(self) -> None:
        if self.one_row is None:
            self.one_row = all(len(a) == 1 for a in self.answers)
        self._by_text: dict[tuple, list[int]] = {}
        for i in range(len(self.pool)):
            self._by_text.setdefault(_text_key(self.pool.fields(i)), []).append(i)

    def demonstrations(self, fields: Fields) -> list[int]:
        """Pool indices of the k demonstrations for an example with these fields."""
        key = _text_key(fields)
        exclude = set(self._by_text.get(key, ()))
        available = len(self.pool) - len(exclude)
        if available < self.k_shot:
            raise PtmError(f"k_shot={self.k_shot} but only {available} training examples differ from the evaluated "
                           f"one; lower model.init_args.k_shot or raise data.init_args.limit_train")
        tokens = np.asarray([*key[0], -1, *key[1]], dtype=np.int64).tobytes()
        rng = np.random.default_rng([self.seed, zlib.crc32(tokens)])
        drawn = rng.choice(len(self.pool), size=min(len(self.pool), self.k_shot + len(exclude)), replace=False)
        return [int(i) for i in drawn if int(i) not in exclude][: self.k_shot]

    def prompts(self, fields: Fields) -> tuple[list[list[int]], int]:
        """The contexts before the candidate label (the query's; then, with ``content_free``, the content-free
        query's after the same demonstrations) and the number of demonstrations in them."""
        demos = [self.encoder.encode(self.pool.fields(d), self.answers[self.pool.labels[d]])[0]
                 for d in self.demonstrations(fields)]
        queries = [self.encoder.encode(fields, [], until_slot=True)[0]]
        if self.content_free is not None:
            blank = {name: (self.content_free if ids is not None else None) for name, ids in fields.items()}
            queries.append(self.encoder.encode(blank, [], until_slot=True)[0])
        head, longest = self.encoder.prefix + self.instruction, max(map(len, self.answers))
        limit, query = self.max_length or float("inf"), max(map(len, queries))
        while demos and len(head) + sum(map(len, demos)) + query + longest > limit:
            demos.pop(0)
        contexts = [head + [t for demo in demos for t in demo] + q for q in queries]
        if not contexts[0] or len(head) + sum(map(len, demos)) + query + longest > limit:
            raise PtmError(f"an in-context query takes {len(contexts[0])} + {longest} tokens, which does not fit the "
                           f"model's {self.max_length} positions (or is empty); lower data.init_args.max_length")
        return contexts, len(demos)

    def prompt(self, fields: Fields) -> tuple[list[int], int]:
        """The query's context before the candidate label and the number of demonstrations in it."""
        contexts, shots = self.prompts(fields)
        return contexts[0], shots

    def __call__(self, examples: list[dict]) -> dict:
        rows, shots = [], []
        for e in examples:
            contexts, n = self.prompts(e["fields"])
            for context in contexts:
                rows += [torch.tensor(context)] if self.one_row else [torch.tensor(context + a) for a in self.answers]
            shots.append(n)
        ids = pad([r.flip(0) for r in rows], self.pad_token_id).flip(1)  # left padding
        mask = pad([torch.ones_like(r) for r in rows], 0).flip(1)
        batch = {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
                 "labels": torch.tensor([e["label"] for e in examples]), "keys": [e["key"] for e in examples],
                 "shots": torch.tensor(shots, dtype=torch.float32)}
        if self.one_row:
            batch["answer_ids"] = torch.tensor([a[0] for a in self.answers])
        else:
            batch["answer_lengths"] = torch.tensor([len(a) for a in self.answers] * (len(rows) // len(self.answers)))
        return batch
