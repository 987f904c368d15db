"""Metrics of modules whose ``forward(batch)`` returns one score per label (accuracy, macro-F1, MCC, and the
positive class's F1 for two-label tasks) or one real value per example (MSE, Pearson and Spearman
correlation); the ``sequence`` and ``regression`` task types (``task_kinds.registry``) build them.

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
