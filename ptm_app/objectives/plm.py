"""Permutation language modelling (XLNet, Yang et al. 2019 §2.2–2.3) through transformers' XLNet.

A factorisation order is sampled per sequence; only the last tokens of the order are predicted
(partial prediction, ≈ ``plm_probability`` of the tokens, in spans of up to ``max_span_length``).
``perm_mask`` hides from each token what comes after it in that order; natural positions and
inputs are unchanged (two-stream attention prevents a target from seeing itself).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ptm_app.data.collators import PadCollator
from ptm_app.data.corruption import draw_generator
from ptm_app.data.corruption.permutation import plm_inputs
from ptm_app.objectives.lm_base import LanguageModelModule
from ptm_app.training.optim import OptimConfig


@dataclass
class PLMCollator(PadCollator):
    special_ids: tuple[int, ...] = ()
    seed: int = 0
    plm_probability: float = 1 / 6
    max_span_length: int = 5

    def __call__(self, examples: list[dict]) -> dict:
        batch = self.pad_batch(examples)
        special = torch.isin(batch["input_ids"], torch.tensor(self.special_ids, dtype=torch.long))
        batch.update(plm_inputs(batch["input_ids"], batch["attention_mask"], draw_generator(self.seed, batch["keys"]),
                                plm_probability=self.plm_probability, max_span_length=self.max_span_length,
                                special_mask=special))
        return batch


class PermutationLMModule(LanguageModelModule):
    """XLNet pre-training (``model_type: xlnet``; transformers' ``XLNetLMHeadModel``).

    Args:
        plm_probability: fraction of tokens predicted (partial prediction, 1/6 in XLNet/HF).
        max_span_length: longest span of consecutive targets.
    """

    model_class = "causal_lm"  # AutoModelForCausalLM maps xlnet → XLNetLMHeadModel

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(lr=5e-4), gradient_checkpointing: bool = False,
                 plm_probability: float = 1 / 6, max_span_length: int = 5):
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)

    def build_model(self):
        """transformers' XLNet builds its relative positional encoding in float32 whatever the weights' dtype:
        under an engine that casts the weights (DeepSpeed bf16, no autocast) the encoding follows them."""
        model = super().build_model()
        transformer = model.transformer
        encode = transformer.relative_positional_encoding

        def relative_positional_encoding(*args, **kwargs):
            return encode(*args, **kwargs).to(transformer.word_embedding.weight.dtype)

        transformer.relative_positional_encoding = relative_positional_encoding
        return model

    def make_collator(self, tokenizer, seed: int = 0) -> PLMCollator:
        return PLMCollator(pad_token_id=tokenizer.pad_token_id, special_ids=tuple(tokenizer.all_special_ids),
                           seed=seed, plm_probability=self.hparams.plm_probability,
                           max_span_length=self.hparams.max_span_length)

    def model_inputs(self, batch: dict) -> dict:
        """With ``perm_mask`` and ``target_mapping``; one segment's ``token_type_ids`` when the data has none, so
        XLNet's relative segment encodings (§2.5: ``seg_embed``, ``r_s_bias``) take part as they do in XLNet's
        pre-training (and DDP finds no parameter without a gradient)."""
        inputs = super().model_inputs(batch)
        inputs.update(perm_mask=batch["perm_mask"], target_mapping=batch["target_mapping"])
        if inputs.get("token_type_ids") is None:
            inputs["token_type_ids"] = torch.zeros_like(batch["input_ids"])
        return inputs
