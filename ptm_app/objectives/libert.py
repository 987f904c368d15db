"""LIBERT (Lauscher et al. 2020, "Specializing unsupervised pretraining models for word-level semantic
similarity", §3): BERT's MLM plus *lexical relation classification* (LRC).

LRC takes a word pair from WordNet's synonymy and hyponymy-hypernymy constraints, or a negative pair, as
``[CLS] w1 [SEP] w2 [SEP]`` and classifies the [CLS] representation (a tanh pooler and a softmax classifier,
like BERT's NSP head) as related or not.  The two objectives share the encoder and are trained on alternating
batches (the paper) or summed in every step (``MLMPairsDataModule.combine``).
"""
from __future__ import annotations

from typing import Literal, Optional

import torch
from torch import nn
from torchmetrics import MeanMetric

from ptm_app.data.collators import PadCollator
from ptm_app.errors import PtmError
from ptm_app.objectives.heads import SentenceRelationHead
from ptm_app.objectives.mlm import MaskedLMModule
from ptm_app.training.module import weighted_mean_update
from ptm_app.training.optim import OptimConfig


class LexicalRelationMLMModule(MaskedLMModule):
    """MLM + LIBERT's lexical relation classification, on ``MLMPairsDataModule`` data.

    Args:
        backbone / backbone_config / optim / gradient_checkpointing / mlm_probability / mask_ratio /
            random_ratio / masking / sparse_prediction: as ``MaskedLMModule``.
        loss_weights: weights of ``mlm`` and ``lexrel`` (LRC) in a summed step.
    """

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(), gradient_checkpointing: bool = False,
                 mlm_probability: float = 0.15, mask_ratio: float = 0.8, random_ratio: float = 0.1,
                 masking: Literal["token", "whole_word"] = "token",
                 loss_weights: Optional[dict[str, float]] = None, sparse_prediction: bool = True):
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing, mlm_probability, mask_ratio,
                         random_ratio, masking=masking, sparse_prediction=sparse_prediction)
        self.weights = {"mlm": 1.0, "lexrel": 1.0, **(loss_weights or {})}
        self.lexrel_head: Optional[nn.Module] = None
        self.val_lexrel = nn.ModuleDict({"lexrel": MeanMetric(), "lexrel_acc": MeanMetric()})
        self.test_lexrel = nn.ModuleDict({"lexrel": MeanMetric(), "lexrel_acc": MeanMetric()})

    def configure_model(self) -> None:
        super().configure_model()
        if self.lexrel_head is None:
            labels = self.data_facts.labels() if self.data_facts is not None else None
            if labels is not None and len(labels) != 2:
                raise PtmError(f"LIBERT's lexical relation classification is binary; the pair data has labels "
                               f"{labels}; use wordnet_lexrel (related / unrelated)")
            self.lexrel_head = SentenceRelationHead(self.backbone.config.hidden_size)

    def task_collator(self, kind: str, tokenizer) -> PadCollator:
        """Word pairs are plain padded sequence pairs with a label."""
        return PadCollator(tokenizer.pad_token_id)

    def _lexrel(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.backbone.base_model(**self.model_inputs(batch))[0]
        logits = self.lexrel_head(hidden).float()
        loss = nn.functional.cross_entropy(logits, batch["labels"])
        return loss, (logits.argmax(-1) == batch["labels"]).float().mean()

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        parts, total = {}, 0.0
        mlm = batch["mlm"] if "mlm" in batch else batch if batch.get("task") == "mlm" else None
        pairs = batch["pairs"] if "pairs" in batch else batch if batch.get("task") == "pairs" else None
        n = 0
        if mlm is not None:
            parts["mlm"] = self._losses(mlm)["mlm"]
            total = total + self.weights["mlm"] * parts["mlm"]
            n = self.count_targets(mlm["labels"])
        if pairs is not None:
            parts["lexrel"], parts["lexrel_acc"] = self._lexrel(pairs)
            total = total + self.weights["lexrel"] * parts["lexrel"]
            n = n or len(pairs["labels"])
        for name, value in parts.items():
            self.log(f"train/{name}", value, batch_size=max(n, 1))
        self.log("train/loss", total, prog_bar=True, batch_size=max(n, 1))
        return total

    def _eval(self, batch: dict, loss_metric: MeanMetric, parts: nn.ModuleDict) -> None:
        if batch.get("task") == "pairs":
            loss, acc = self._lexrel(batch)
            weighted_mean_update(parts["lexrel"], loss, len(batch["labels"]))
            weighted_mean_update(parts["lexrel_acc"], acc, len(batch["labels"]))
        else:
            weighted_mean_update(loss_metric, self._losses(batch)["mlm"], self.count_targets(batch["labels"]))

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval(batch, self.val_loss, self.val_lexrel)

    def test_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval(batch, self.test_loss, self.test_lexrel)

    def _log_parts(self, stage: str, parts: nn.ModuleDict) -> None:
        for name, metric in parts.items():
            if metric.update_called:
                self.log(f"{stage}/{name}", metric.compute(), add_dataloader_idx=False)
                metric.reset()

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        self._log_parts("val", self.val_lexrel)

    def on_test_epoch_end(self) -> None:
        super().on_test_epoch_end()
        self._log_parts("test", self.test_lexrel)
