"""Masked language modelling and its variants, with optional extra targets summed into one loss.

BERT (Devlin et al. 2019 §3.1): 15 %, 80/10/10, + NSP.  RoBERTa (Liu et al. 2019 §4): dynamic
masking, no NSP.  ALBERT (Lan et al. 2020 §4.1): + SOP.  SpanBERT (Joshi et al. 2020 §3): span
masking + span boundary objective.  BERT-wwm: whole-word masking.  These are configs of one module.
"""
from __future__ import annotations

from typing import Literal, Optional

import torch
from torch import nn
from torchmetrics import MeanMetric

from ptm_app.constants import IGNORE_INDEX
from ptm_app.data.collators import MLMCollator, word_start_table
from ptm_app.errors import PtmError
from ptm_app.objectives.heads import SentenceRelationHead, SpanBoundaryHead, masked_lm_forward
from ptm_app.objectives.lm_base import LanguageModelModule
from ptm_app.training.module import weighted_mean_update
from ptm_app.training.optim import OptimConfig


class MaskedLMModule(LanguageModelModule):
    """MLM pre-training on any ``AutoModelForMaskedLM`` backbone, plus optional targets.

    Args:
        backbone / backbone_config / optim / gradient_checkpointing: see ``PtmModule``.
        mlm_probability / mask_ratio / random_ratio: the masking recipe (0.15 / 0.8 / 0.1).
        masking: ``token``, ``whole_word`` or ``span`` (SpanBERT geometric spans, ``span_p``, ``max_span_length``).
        static_masking: one mask per sample for the whole run instead of a fresh one every epoch.
        sentence_objective: ``nsp`` (random next segment from another document) or ``sop`` (swapped order);
            the data module then builds sentence-pair examples from document boundaries.
        span_boundary_objective: add SpanBERT's SBO target (needs ``masking: span``).
        loss_weights: weights of ``mlm``, ``sentence`` and ``sbo`` in the summed loss.
        sparse_prediction: compute vocabulary logits only at the masked positions (the default; same loss,
            see ``heads.masked_lm_forward``); ``false`` projects every position, as ``*ForMaskedLM`` does.
    """

    head = "masked_lm"

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(), gradient_checkpointing: bool = False,
                 mlm_probability: float = 0.15, mask_ratio: float = 0.8, random_ratio: float = 0.1,
                 masking: Literal["token", "whole_word", "span"] = "token", static_masking: bool = False,
                 span_p: float = 0.2, max_span_length: int = 10,
                 sentence_objective: Optional[Literal["nsp", "sop"]] = None, span_boundary_objective: bool = False,
                 loss_weights: Optional[dict[str, float]] = None, sparse_prediction: bool = True):
        if span_boundary_objective and masking != "span":
            raise PtmError("span_boundary_objective needs masking: span (SpanBERT §3.2)")
        self.heads = None
        # kept as attributes, not only hparams: a subclass's CLI hparams hold just its own arguments
        self.masking_cfg = dict(mlm_probability=mlm_probability, mask_ratio=mask_ratio, random_ratio=random_ratio,
                                masking=masking, static=static_masking, span_p=span_p, max_span_length=max_span_length)
        self.sentence_objective, self.span_boundary_objective = sentence_objective, span_boundary_objective
        self.sparse_prediction = sparse_prediction
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)
        self.weights = {"mlm": 1.0, "sentence": 1.0, "sbo": 1.0, **(loss_weights or {})}
        self.val_parts = nn.ModuleDict({"sentence": MeanMetric(), "sentence_acc": MeanMetric(), "sbo": MeanMetric()})

    @property
    def example_format(self) -> str:
        """What the data module must build: token blocks, or NSP/SOP sentence pairs."""
        return self.sentence_objective or "blocks"

    def configure_model(self) -> None:
        super().configure_model()
        if self.heads is None:
            hidden = self.backbone.config.hidden_size
            heads = {}
            if self.sentence_objective:
                heads["sentence"] = SentenceRelationHead(hidden)
            if self.span_boundary_objective:
                heads["sbo"] = SpanBoundaryHead(hidden, self.masking_cfg["max_span_length"])
            self.heads = nn.ModuleDict(heads)

    def make_collator(self, tokenizer, seed: int = 0) -> MLMCollator:
        if tokenizer.mask_token_id is None:
            raise PtmError("MaskedLMModule needs a tokenizer with a [MASK] token; use a BERT-style (wordpiece) tokenizer")
        vocab = min(len(tokenizer), self.backbone.config.vocab_size) if self.backbone is not None else len(tokenizer)
        cfg = self.masking_cfg
        return MLMCollator(
            pad_token_id=tokenizer.pad_token_id, mask_token_id=tokenizer.mask_token_id,
            special_ids=tuple(i for i in tokenizer.all_special_ids if i < vocab), vocab_size=vocab, seed=seed,
            word_start=word_start_table(tokenizer, vocab) if cfg["masking"] != "token" else None, **cfg,
        )

    def _losses(self, batch: dict) -> dict[str, torch.Tensor]:
        out = masked_lm_forward(self.backbone, self.model_inputs(batch), batch["labels"],
                                sparse=self.sparse_prediction, hidden=bool(self.heads))
        losses = {"mlm": out.loss}
        if "sentence" in self.heads:
            logits = self.heads["sentence"](out.hidden).float()
            losses["sentence"] = nn.functional.cross_entropy(logits, batch["sentence_labels"])
            losses["sentence_acc"] = (logits.argmax(-1) == batch["sentence_labels"]).float().mean()
        if "sbo" in self.heads:
            sbo = batch["sbo"]
            target = batch["labels"][sbo["rows"], sbo["pos"]]
            decoder = self.backbone.get_output_embeddings().weight
            logits = self.heads["sbo"](out.hidden, sbo["rows"], sbo["left"], sbo["right"], sbo["offset"],
                                       decoder).float()
            losses["sbo"] = nn.functional.cross_entropy(logits, target, ignore_index=IGNORE_INDEX)
        return losses

    def _total(self, losses: dict[str, torch.Tensor]) -> torch.Tensor:
        return sum(self.weights[k] * v for k, v in losses.items() if k in self.weights)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        losses = self._losses(batch)
        n = self.count_targets(batch["labels"])
        return self.log_train_losses(self._total(losses), losses if len(losses) > 1 else {}, n)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        losses = self._losses(batch)
        weighted_mean_update(self.val_loss, losses["mlm"], self.count_targets(batch["labels"]))
        for name, value in losses.items():
            if name in self.val_parts:
                weighted_mean_update(self.val_parts[name], value, len(batch["input_ids"]))

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()  # val/loss = the MLM loss, val/ppl
        for name, metric in self.val_parts.items():
            if metric.update_called:
                self.log(f"val/{name}", metric.compute())
                metric.reset()

    def test_step(self, batch: dict, batch_idx: int) -> None:
        weighted_mean_update(self.test_loss, self._losses(batch)["mlm"], self.count_targets(batch["labels"]))
