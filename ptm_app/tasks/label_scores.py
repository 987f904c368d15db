"""Evaluation shared by every module whose ``forward(batch)`` returns one score per label (cross-entropy,
accuracy, macro-F1, MCC, and the positive class's F1 for two-label tasks) or one real value per example
(MSE, Pearson and Spearman correlation), per stage, plus the ``predict`` outputs.

Metric choice follows GLUE (Wang et al. 2019 §3): accuracy for single-sentence tasks, Matthews correlation
for CoLA-style unbalanced binary tasks, accuracy and the positive class's F1 for pair tasks (MRPC, QQP),
Pearson and Spearman correlation for regression (STS-B).
"""
from __future__ import annotations

from typing import Optional

import torch
from torchmetrics import MetricCollection
from torchmetrics.classification import (BinaryF1Score, MulticlassAccuracy, MulticlassF1Score,
                                         MulticlassMatthewsCorrCoef)
from torchmetrics.regression import MeanSquaredError, PearsonCorrCoef, SpearmanCorrCoef


class PositiveClassF1(BinaryF1Score):
    """F1 of one class of a multiclass prediction (the positive class of a binary task)."""

    def __init__(self, positive: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.positive = positive

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        super().update((preds == self.positive).long(), (target == self.positive).long())


def label_metrics(num_labels: int, positive: Optional[int] = None) -> MetricCollection:
    """``acc``, ``f1_macro``, ``mcc`` and, for two labels, ``f1`` of the positive class (index 1 by default)."""
    metrics = {"acc": MulticlassAccuracy(num_labels, average="micro"),
               "f1_macro": MulticlassF1Score(num_labels, average="macro"),
               "mcc": MulticlassMatthewsCorrCoef(num_labels)}
    if num_labels == 2:
        metrics["f1"] = PositiveClassF1(1 if positive is None else positive)
    return MetricCollection(metrics)


def regression_metrics() -> MetricCollection:
    return MetricCollection({"pearson": PearsonCorrCoef(), "spearman": SpearmanCorrCoef(), "mse": MeanSquaredError()})


def positive_index(labels: list[str], positive_label: Optional[str]) -> Optional[int]:
    """The index of ``positive_label`` in ``labels`` (None: the second label)."""
    if positive_label is None:
        return None
    if positive_label not in labels:
        from ptm_app.errors import PtmError

        raise PtmError(f"positive_label '{positive_label}' is not one of the labels {labels}; fix model.init_args.positive_label")
    return labels.index(positive_label)


class LabelScoresMixin:
    """Mix into a LightningModule; call ``build_label_metrics(n)`` once the label count is known."""

    metrics: dict

    def build_label_metrics(self, num_labels: int, positive: Optional[int] = None) -> None:
        if self.metrics:
            return
        self.val_metrics, self.test_metrics = label_metrics(num_labels, positive), label_metrics(num_labels, positive)
        self.metrics = {"val": self.val_metrics, "test": self.test_metrics}

    def task_loss(self, scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(scores.float(), labels)

    def task_predictions(self, scores: torch.Tensor) -> torch.Tensor:
        return scores.argmax(-1)

    def _eval_step(self, stage: str, batch: dict) -> None:
        scores = self(batch).float()
        self.log(f"{stage}/loss", self.task_loss(scores, batch["labels"]), batch_size=len(batch["labels"]))
        self.metrics[stage].update(self.task_predictions(scores), batch["labels"])

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step("val", batch)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step("test", batch)

    def _log_metrics(self, stage: str) -> None:
        values = self.metrics[stage].compute()
        self.log_dict({f"{stage}/{k}": v for k, v in values.items()}, prog_bar=(stage == "val"))
        self.metrics[stage].reset()

    def on_validation_epoch_end(self) -> None:
        self._log_metrics("val")

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test")

    def predict_step(self, batch: dict, batch_idx: int) -> dict:
        return {"keys": batch["keys"], "probs": torch.softmax(self(batch).float(), dim=-1).cpu()}


class RegressionScoresMixin(LabelScoresMixin):
    """One real-valued score per example: MSE loss, Pearson / Spearman / MSE metrics, values for ``predict``."""

    def build_label_metrics(self, num_labels: int = 1, positive: Optional[int] = None) -> None:
        if self.metrics:
            return
        self.val_metrics, self.test_metrics = regression_metrics(), regression_metrics()
        self.metrics = {"val": self.val_metrics, "test": self.test_metrics}

    def task_loss(self, scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(scores.float().squeeze(-1), labels.float())

    def task_predictions(self, scores: torch.Tensor) -> torch.Tensor:
        return scores.float().squeeze(-1)

    def predict_step(self, batch: dict, batch_idx: int) -> dict:
        return {"keys": batch["keys"], "values": self(batch).float().squeeze(-1).cpu()}
