"""Sequence-to-sequence denoising pre-training on an encoder–decoder (``AutoModelForSeq2SeqLM``).

``noise`` picks the corruption:
- ``t5_span``: T5 span corruption (Raffel et al. 2020 §3.1.4): each span → one sentinel; the target
  lists the sentinels and their spans.
- ``mass``: MASS (Song et al. 2019 §2.2): one contiguous fragment masked with one [MASK] per token;
  the decoder generates exactly the fragment, at the fragment's original positions (decoder step k, which
  predicts the fragment's k-th token, reads that token's position ``start + k``; MASS's reference code gives the
  shifted input token its own position, one less, which would be -1 here for a fragment at the start of a row
  with no [CLS]); needs a decoder with learned absolute positions (BART).
- ``bart``: BART (Lewis et al. 2020 §2.2): any composition of token masking, token deletion, text
  infilling (Poisson λ=3 spans, one mask each), sentence permutation and document rotation; the
  decoder reconstructs the clean text (teacher forcing).
- ``mbart``: mBART (Liu et al. 2020 §2.2): BART's noise with mBART's settings (sentence permutation, then
  35 % of the *words* masked in Poisson(3.5) spans) over language-tagged monolingual text
  (``data.language_corpora``): the encoder reads ``noised [EOS] <lang>``, the decoder starts from ``<lang>`` and
  reconstructs ``clean [EOS] <lang>`` (Liu et al. Fig. 1).  ``bart`` over language-tagged text uses the same layout.

Qiu et al. 2020 file these under §3.1.2 (Seq2Seq MLM: MASS, T5) and §3.1.4 (DAE: BART).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator, Literal, Optional

import torch
from torch import nn

from ptm_app.data.collators import pad
from ptm_app.data import IGNORE_INDEX
from ptm_app.data.corruption import draw_rng
from ptm_app.errors import PtmError
from ptm_app.objectives.lm_base import LanguageModelModule
from ptm_app.training.optim import OptimConfig

BART_DEFAULT = [{"name": "sentence_permutation"}, {"name": "text_infilling", "rate": 0.3}]  # BART's best pair
MBART_DEFAULT = [{"name": "sentence_permutation"},  # Liu et al. 2020 §2.2: 35 % of words, Poisson(3.5) spans
                 {"name": "text_infilling", "rate": 0.35, "poisson_lambda": 3.5, "whole_words": True}]


@dataclass
class Seq2SeqCollator:
    """Strip special tokens, corrupt the content, build encoder inputs and decoder targets (+ EOS).

    MASS rows also get ``decoder_input_ids`` ([MASK] then the fragment, teacher forcing) and
    ``decoder_position_ids``: the fragment's positions in the encoder input, ``start + k``.

    Examples with a ``language_token_id`` (mBART, Liu et al. 2020 Fig. 1) get ``noised [EOS] <lang>`` as encoder
    input, ``clean [EOS] <lang>`` as labels and ``<lang> clean [EOS]`` as ``decoder_input_ids``."""

    pad_token_id: int
    eos_token_id: int
    mask_token_id: Optional[int]
    special_ids: tuple[int, ...]
    noise: str
    seed: int = 0
    noise_density: float = 0.15
    mean_span_length: float = 3.0
    mass_fraction: float = 0.5
    bart_noises: list[dict] = field(default_factory=lambda: list(BART_DEFAULT))
    sentinel_ids: tuple[int, ...] = ()
    full_stop_ids: tuple[int, ...] = ()
    continuation_ids: frozenset = frozenset()  # word-internal pieces (``##``): for whole-word text infilling

    def _corrupt(self, ids: list[int], rng) -> tuple[list[int], list[int], Optional[list[int]], int]:
        """``(encoder input, target, MASS decoder input or None, MASS fragment start)``."""
        from ptm_app.data.corruption import denoising, seq2seq

        if self.noise == "t5_span":
            inputs, targets = seq2seq.t5_span_corruption(ids, rng, noise_density=self.noise_density,
                                                         mean_span_length=self.mean_span_length,
                                                         sentinel_ids=list(self.sentinel_ids))
            return inputs, targets, None, 0
        if self.noise == "mass":
            encoder, decoder_in, target, start = seq2seq.mass_fragment(ids, rng, fraction=self.mass_fraction,
                                                                       mask_token_id=self.mask_token_id)
            return encoder, target, decoder_in, start
        steps = [(n["name"], {k: v for k, v in n.items() if k not in ("name", "whole_words")}
                  | self._step_ids(n["name"], bool(n.get("whole_words")))) for n in self.bart_noises]
        return denoising.compose(ids, rng, steps), list(ids), None, 0

    def _step_ids(self, name: str, whole_words: bool = False) -> dict:
        if name == "text_infilling" and whole_words:
            return {"mask_token_id": self.mask_token_id, "continuation_ids": self.continuation_ids}
        if name in ("token_masking", "text_infilling"):
            return {"mask_token_id": self.mask_token_id}
        if name == "sentence_permutation":
            return {"full_stop_ids": set(self.full_stop_ids)}
        return {}

    def __call__(self, examples: list[dict]) -> dict:
        keys = [e["key"] for e in examples]
        rng = draw_rng(self.seed, keys)
        special = set(self.special_ids)
        enc, tgt, dec, dec_positions = [], [], [], []
        for e in examples:
            content = [t for t in e["input_ids"].tolist() if t not in special]
            inputs, targets, decoder_in, start = self._corrupt(content, rng)
            language = e.get("language_token_id")
            if language is not None:  # mBART: noised [EOS] <lang> -> <lang> clean [EOS] -> clean [EOS] <lang>
                if self.noise not in ("bart", "mbart"):
                    raise PtmError(f"noise={self.noise} does not take language-tagged examples; use noise: mbart "
                                   f"(or bart) with data class MultilingualDenoisingDataModule")
                enc.append(torch.tensor(inputs + [self.eos_token_id, language]))
                tgt.append(torch.tensor(targets + [self.eos_token_id, language]))
                dec.append(torch.tensor([language] + targets + [self.eos_token_id]))
                continue
            if self.noise == "mbart":
                raise PtmError("noise: mbart needs language-tagged text (a language token per example); use data "
                               "class MultilingualDenoisingDataModule with one corpus per language")
            enc.append(torch.tensor(inputs + [self.eos_token_id]))
            tgt.append(torch.tensor(targets + [self.eos_token_id]))
            if decoder_in is not None:  # MASS: teacher forcing over the fragment, then EOS
                dec.append(torch.tensor(decoder_in + targets[-1:]))
                dec_positions.append(start + torch.arange(len(targets) + 1))  # the fragment's own positions
        batch = {
            "input_ids": pad(enc, self.pad_token_id),
            "attention_mask": pad([torch.ones_like(t) for t in enc], 0),
            "labels": pad(tgt, IGNORE_INDEX),
            "keys": keys,
        }
        if dec:
            batch["decoder_input_ids"] = pad(dec, self.pad_token_id)
        if dec_positions:
            batch["decoder_position_ids"] = pad(dec_positions, 0)
        return batch


@contextlib.contextmanager
def decoder_positions(model, positions: torch.Tensor) -> Iterator[None]:
    """Inside the block, ``model``'s decoder reads its learned absolute position embeddings at ``positions``
    ``[B, T]`` instead of ``0 .. T-1`` (MASS §2.2: the decoder sees the fragment at its original positions).
    transformers' BART-family decoders take no position ids, so a forward hook on their position table
    (``decoder.embed_positions``, with BART's offset of 2) replaces its output."""
    table = getattr(model.get_decoder(), "embed_positions", None)
    if not isinstance(table, nn.Embedding):
        raise PtmError("noise: mass gives the decoder the fragment's original positions (Song et al. 2019 §2.2), "
                       "which needs a decoder with learned absolute positions: use backbone_config.model_type: bart")
    index = positions + getattr(table, "offset", 0)
    handle = table.register_forward_hook(lambda module, args, output: nn.Embedding.forward(module, index))
    try:
        yield
    finally:
        handle.remove()


class Seq2SeqDenoisingModule(LanguageModelModule):
    """T5 / MASS / BART / mBART pre-training (one module, the corruption is a setting).

    Args:
        backbone / backbone_config: an encoder–decoder (``model_type: t5 | bart | ...``).
        noise: ``t5_span`` | ``mass`` | ``bart`` | ``mbart`` (BART's noise with mBART's defaults, over
            language-tagged text).
        noise_density / mean_span_length: T5 span corruption (0.15, 3).
        mass_fraction: length of the MASS fragment as a fraction of the sequence (0.5).
        bart_noises: ordered list of ``{name: ..., <params>}`` among token_masking, token_deletion,
            text_infilling, sentence_permutation, document_rotation, word_shuffle; ``text_infilling`` takes
            ``whole_words: true`` (spans and rate count words, as mBART's).  Default: BART's best pair for
            ``bart``, mBART's (``MBART_DEFAULT``) for ``mbart``.
    """

    model_class = "seq2seq_lm"

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(lr=5e-4), gradient_checkpointing: bool = False,
                 noise: Literal["t5_span", "mass", "bart", "mbart"] = "bart", noise_density: float = 0.15,
                 mean_span_length: float = 3.0, mass_fraction: float = 0.5, bart_noises: Optional[list[dict]] = None):
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)

    def config_updates(self) -> dict:
        updates = super().config_updates()
        if self.tokenizer is not None and not self.hparams.backbone:
            updates.update(seq2seq_token_ids(self.tokenizer, self.hparams.backbone_config.get("model_type")))
        return updates

    def model_inputs(self, batch: dict) -> dict:
        inputs = super().model_inputs(batch)
        if "decoder_input_ids" in batch:
            inputs["decoder_input_ids"] = batch["decoder_input_ids"]
        return inputs

    def _loss(self, batch: dict) -> tuple[torch.Tensor, int]:
        if "decoder_position_ids" not in batch:
            return super()._loss(batch)
        with decoder_positions(self.backbone, batch["decoder_position_ids"]):  # MASS
            return super()._loss(batch)

    def make_collator(self, tokenizer, seed: int = 0) -> Seq2SeqCollator:
        hp = self.hparams
        eos = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
        sentinels = sentinel_ids(tokenizer) if hp.noise == "t5_span" else ()
        if hp.noise == "t5_span" and not sentinels:
            raise PtmError("t5_span needs sentinel tokens: train the tokenizer with sentinels: 100 "
                           "(or use one with <extra_id_N> / [unusedN] tokens)")
        if hp.noise != "t5_span" and tokenizer.mask_token_id is None:
            raise PtmError(f"noise={hp.noise} needs a tokenizer with a mask token; use train: wordpiece")
        full_stops = tuple(i for i in (tokenizer.convert_tokens_to_ids(t) for t in (".", "Ġ.")) if i is not None
                           and i != tokenizer.unk_token_id)
        noises = hp.bart_noises or list(MBART_DEFAULT if hp.noise == "mbart" else BART_DEFAULT)
        misplaced = [n.get("name") for n in noises if "whole_words" in n and n.get("name") != "text_infilling"]
        if misplaced:
            raise PtmError(f"bart_noises: whole_words is a text_infilling setting, not {misplaced[0]}'s; remove it there")
        continuation = frozenset()
        if any(n.get("whole_words") for n in noises):
            from ptm_app.data.collators import word_start_table

            starts = word_start_table(tokenizer, len(tokenizer))
            continuation = frozenset(torch.nonzero(~starts).flatten().tolist())
        return Seq2SeqCollator(
            pad_token_id=tokenizer.pad_token_id, eos_token_id=eos, mask_token_id=tokenizer.mask_token_id,
            special_ids=tuple(tokenizer.all_special_ids), noise=hp.noise, seed=seed, noise_density=hp.noise_density,
            mean_span_length=hp.mean_span_length, mass_fraction=hp.mass_fraction,
            bart_noises=noises, sentinel_ids=tuple(sentinels), full_stop_ids=full_stops,
            continuation_ids=continuation,
        )


def seq2seq_token_ids(tokenizer, model_type: Optional[str]) -> dict[str, Optional[int]]:
    """The special ids of an encoder–decoder built on ``tokenizer``: EOS is [SEP] (else EOS), the decoder starts
    from the pad token for T5 (Raffel et al. 2020) and from [CLS] (else BOS) otherwise."""
    eos = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    bos = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    return {"eos_token_id": eos, "bos_token_id": bos,
            "decoder_start_token_id": tokenizer.pad_token_id if model_type == "t5" else bos}


def sentinel_ids(tokenizer, limit: int = 100) -> list[int]:
    """T5-style sentinels: ``<extra_id_N>``, ``[XN]`` (ptm_app-trained) or BERT's ``[unusedN]`` tokens."""
    vocab = tokenizer.get_vocab()
    for pattern in ("<extra_id_{}>", "[X{}]", "[unused{}]"):
        ids = [vocab[pattern.format(i)] for i in range(limit) if pattern.format(i) in vocab]
        if len(ids) >= 10:
            return ids
    return []
