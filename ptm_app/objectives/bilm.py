"""Bidirectional LSTM language model (ELMo, Peters et al. 2018 §3.1): forward and backward LMs over
a shared input embedding and a shared softmax, loss = the mean of the two directions' NLL."""
from __future__ import annotations

from typing import Optional

import torch

from ptm_app.data.collators import CLMCollator
from ptm_app.objectives.lm_base import LanguageModelModule
from ptm_app.training.optim import OptimConfig


class BiLMModule(LanguageModelModule):
    """ELMo pre-training on ``model_type: ptm_bilstm_lm``; logs each direction's loss too.

    Every layer's states (``hidden_states``) are exposed for feature extraction with a scalar mix.
    """

    model_class = "bilm"

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(lr=1e-3, weight_decay=0.0), gradient_checkpointing: bool = False):
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)

    def make_collator(self, tokenizer, seed: int = 0) -> CLMCollator:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        return CLMCollator(pad_token_id=pad)

    def model_inputs(self, batch: dict) -> dict:
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        out = self.backbone(**self.model_inputs(batch), labels=batch["labels"])
        n = max(self.count_targets(batch["labels"]), 1)
        self.log("train/loss", out.loss, prog_bar=True, batch_size=n)
        self.log("train/forward_loss", out.forward_loss, batch_size=n)
        self.log("train/backward_loss", out.backward_loss, batch_size=n)
        return out.loss
