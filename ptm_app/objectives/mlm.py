"""Masked language modelling (BERT: Devlin et al. 2019 §3.1; dynamic masking: RoBERTa §4.1)."""
from __future__ import annotations

from typing import Optional

from ptm_app.data.collators import MLMCollator
from ptm_app.objectives.lm_base import LanguageModelModule
from ptm_app.training.optim import OptimConfig


class MaskedLMModule(LanguageModelModule):
    """MLM pre-training: 15 % of non-special tokens selected; 80 % [MASK], 10 % random, 10 % kept.

    Masks are drawn by the collator each time a batch is built (dynamic masking).

    Args:
        backbone: prepared name / local dir / hub id of a pretrained model (continued pre-training).
        backbone_config: transformers config dict with ``model_type`` (from scratch), or overrides.
        optim: optimiser and schedule.
        mlm_probability / mask_ratio / random_ratio: the masking recipe.
    """

    head = "masked_lm"

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(), gradient_checkpointing: bool = False,
                 mlm_probability: float = 0.15, mask_ratio: float = 0.8, random_ratio: float = 0.1):
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)

    def make_collator(self, tokenizer, seed: int = 0) -> MLMCollator:
        if tokenizer.mask_token_id is None:
            from ptm_app.errors import PtmError

            raise PtmError("MaskedLMModule needs a tokenizer with a [MASK] token; use a BERT-style (wordpiece) tokenizer")
        vocab = min(len(tokenizer), self.backbone.config.vocab_size) if self.backbone is not None else len(tokenizer)
        return MLMCollator(
            pad_token_id=tokenizer.pad_token_id, mask_token_id=tokenizer.mask_token_id,
            special_ids=tuple(i for i in tokenizer.all_special_ids if i < vocab), vocab_size=vocab, seed=seed,
            mlm_probability=self.hparams.mlm_probability, mask_ratio=self.hparams.mask_ratio,
            random_ratio=self.hparams.random_ratio,
        )
