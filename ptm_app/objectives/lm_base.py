"""Shared loop for language-model objectives: token-weighted loss and perplexity."""
from __future__ import annotations

import math

import torch
from torchmetrics import MeanMetric

from ptm_app.data import IGNORE_INDEX
from ptm_app.training.module import PtmModule, weighted_mean_update


class LanguageModelModule(PtmModule):
    """Logs ``train/loss`` per step and ``val/loss``, ``val/ppl`` (token-weighted) per validation."""

    monitor = ("val/loss", "min")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()

    def _loss(self, batch: dict) -> tuple[torch.Tensor, int]:
        out = self.backbone(**self.model_inputs(batch), labels=batch["labels"])
        return out.loss, self.count_targets(batch["labels"])

    def count_targets(self, labels: torch.Tensor) -> int:
        return int((labels != IGNORE_INDEX).sum())

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss, n = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=max(n, 1))
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        loss, n = self._loss(batch)
        weighted_mean_update(self.val_loss, loss, n)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        loss, n = self._loss(batch)
        weighted_mean_update(self.test_loss, loss, n)

    def _log_epoch(self, stage: str, metric: MeanMetric) -> None:
        value = metric.compute()
        self.log(f"{stage}/loss", value, prog_bar=True, sync_dist=False)
        self.log(f"{stage}/ppl", torch.exp(value.clamp(max=50)) if math.isfinite(value) else value)
        metric.reset()

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val", self.val_loss)

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test", self.test_loss)
