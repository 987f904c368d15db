"""UniLM (Dong et al. 2019 §2.2–2.3): one shared Transformer encoder trained with MLM under three
self-attention masks, mixed across batches: bidirectional, left-to-right, and seq2seq (the source
segment sees itself; the target sees the source and its own left context)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from ptm_app.backbones.attention import bidirectional_mask, causal_mask, encoder_attention_kwargs, seq2seq_mask
from ptm_app.data.collators import MLMCollator
from ptm_app.data.corruption import draw_rng
from ptm_app.errors import PtmError
from ptm_app.objectives.mlm import MaskedLMModule
from ptm_app.objectives.targets import MaskedLM
from ptm_app.training.optim import OptimConfig

MODES = ("bidirectional", "left_to_right", "seq2seq")


@dataclass
class UniLMCollator(MLMCollator):
    """MLM batch plus the batch's attention-mask mode, drawn per batch, and a [B, L, L] mask."""

    mode_weights: dict = field(default_factory=lambda: {m: 1.0 for m in MODES})

    def __call__(self, examples: list[dict]) -> dict:
        batch = super().__call__(examples)
        rng = draw_rng(self.seed + 1, batch["keys"])
        names = [m for m in MODES if self.mode_weights.get(m, 0) > 0]
        mode = rng.choices(names, weights=[self.mode_weights[m] for m in names])[0]
        mask = batch["attention_mask"]
        if mode == "bidirectional":
            full = bidirectional_mask(mask)
        elif mode == "left_to_right":
            full = causal_mask(mask)
        else:  # split each sequence into a source and a target segment at a random point
            lengths = mask.sum(1).tolist()
            cut = torch.tensor([rng.randint(1, max(1, n - 1)) for n in lengths])
            source = torch.arange(mask.shape[1])[None, :] < cut[:, None]
            full = seq2seq_mask(mask, source & mask.bool())
            batch["token_type_ids"] = (~source).long() * mask
        batch["attention_3d"], batch["mode"] = full, MODES.index(mode)
        return batch


class UnifiedLMModule(MaskedLMModule):
    """UniLM pre-training: MLM where each batch uses one of the three attention-mask modes.

    Args:
        mode_weights: how often each mode is drawn (``bidirectional``, ``left_to_right``, ``seq2seq``).
        sparse_prediction: vocabulary logits only at the masked positions (default; see ``MaskedLMModule``).
        Other arguments: see ``MaskedLMModule``.
    """

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(), gradient_checkpointing: bool = False,
                 mlm_probability: float = 0.15, mask_ratio: float = 0.8, random_ratio: float = 0.1,
                 mode_weights: Optional[dict[str, float]] = None, sparse_prediction: bool = True):
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing,
                         targets=[MaskedLM(mlm_probability, mask_ratio, random_ratio,
                                           sparse_prediction=sparse_prediction)])

    def make_collator(self, tokenizer, seed: int = 0) -> UniLMCollator:
        base = super().make_collator(tokenizer, seed)
        weights = self.hparams.mode_weights or {m: 1.0 for m in MODES}
        return UniLMCollator(**{f: getattr(base, f) for f in base.__dataclass_fields__}, mode_weights=weights)

    def model_inputs(self, batch: dict) -> dict:
        if "document_ids" in batch:
            raise PtmError("UniLM draws its own attention masks per batch; "
                           "set data.init_args.document_attention: false")
        inputs = super().model_inputs(batch)
        if "attention_3d" in batch:
            inputs.update(encoder_attention_kwargs(self.backbone, batch["attention_3d"]))
        return inputs
