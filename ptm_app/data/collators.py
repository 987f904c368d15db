"""Collators: pad a list of examples and apply the objective's corruption, drawn per batch.

Each batch's random draws come from a generator seeded by the run seed and the batch's sample
keys ``(epoch, index)``: dynamic masking (RoBERTa, Liu et al. 2019 §4.1) that is still exactly
reproducible when a run resumes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ptm_app.data.corruption import IGNORE_INDEX, draw_generator, mlm_mask


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
        if "label" in examples[0]:
            batch["labels"] = torch.tensor([e["label"] for e in examples])
        return batch

    def __call__(self, examples: list[dict]) -> dict:
        return self.pad_batch(examples)


@dataclass
class MLMCollator(PadCollator):
    """BERT masked-LM inputs/labels (15 %, 80/10/10); special tokens and padding are never selected."""

    mask_token_id: int = 0
    special_ids: tuple[int, ...] = ()
    vocab_size: int = 0
    seed: int = 0
    mlm_probability: float = 0.15
    mask_ratio: float = 0.8
    random_ratio: float = 0.1

    def __post_init__(self) -> None:
        normal = torch.ones(self.vocab_size, dtype=torch.bool)
        normal[list(self.special_ids)] = False
        self._random_ids = normal.nonzero().squeeze(1)
        self._special = torch.tensor(sorted(self.special_ids), dtype=torch.long)

    def __call__(self, examples: list[dict]) -> dict:
        batch = self.pad_batch(examples)
        ids = batch["input_ids"]
        maskable = batch["attention_mask"].bool() & ~torch.isin(ids, self._special)
        batch["input_ids"], batch["labels"] = mlm_mask(
            ids, maskable, mask_token_id=self.mask_token_id, vocab_size=self.vocab_size,
            generator=draw_generator(self.seed, batch["keys"]), mlm_probability=self.mlm_probability,
            mask_ratio=self.mask_ratio, random_ratio=self.random_ratio, random_ids=self._random_ids,
        )
        return batch


@dataclass
class CLMCollator(PadCollator):
    """Causal LM: labels are the inputs (the model shifts them); padding is ignored."""

    def __call__(self, examples: list[dict]) -> dict:
        batch = self.pad_batch(examples)
        batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, IGNORE_INDEX)
        return batch
