"""Evaluation shared by every module whose ``forward(batch)`` returns one score per label:
cross-entropy loss, accuracy and macro-F1 per stage, and label probabilities for ``predict``."""
from __future__ import annotations

import torch
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score


class LabelScoresMixin:
    """Mix into a LightningModule; call ``build_label_metrics(n)`` once the label count is known."""

    metrics: dict

    def build_label_metrics(self, num_labels: int) -> None:
        if self.metrics:
            return
        make = lambda: MetricCollection({"acc": MulticlassAccuracy(num_labels, average="micro"),  # noqa: E731
                                         "f1_macro": MulticlassF1Score(num_labels, average="macro")})
        self.val_metrics, self.test_metrics = make(), make()
        self.metrics = {"val": self.val_metrics, "test": self.test_metrics}

    def _eval_step(self, stage: str, batch: dict) -> None:
        scores = self(batch).float()
        loss = torch.nn.functional.cross_entropy(scores, batch["labels"])
        self.log(f"{stage}/loss", loss, batch_size=len(batch["labels"]))
        self.metrics[stage].update(scores.argmax(-1), batch["labels"])

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
