"""Full fine-tuning for sequence classification, single sentences or pairs
(BERT: Devlin et al. 2019 §4.1: the final [CLS] state feeds a new output layer)."""
from __future__ import annotations

from typing import Optional

import torch
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from ptm_app.data.collators import PadCollator
from ptm_app.training.module import PtmModule
from ptm_app.training.optim import OptimConfig


class SequenceClassificationModule(PtmModule):
    """Fine-tune every weight of the backbone plus a fresh classification head.

    Logs ``val/acc``, ``val/f1_macro`` (and ``test/*``); ``predict`` yields labels and probabilities.

    Args:
        backbone: prepared name / local dir / exported run / hub id of the pretrained encoder.
        backbone_config: config overrides (e.g. ``classifier_dropout``), or a from-scratch config.
        labels: the label names in order; by default taken from the data module.
        optim: optimiser and schedule.
    """

    head = "sequence_classification"
    monitor = ("val/acc", "max")

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 labels: Optional[list[str]] = None, optim: OptimConfig = OptimConfig(lr=3e-5),
                 gradient_checkpointing: bool = False):
        self.metrics: dict = {}
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)

    def can_build(self) -> bool:
        return super().can_build() and self.hparams.labels is not None

    def config_updates(self) -> dict:
        datamodule = self._datamodule()
        if self.hparams.labels is None and datamodule is not None:
            self.hparams.labels = datamodule.label_set()
        labels = list(self.hparams.labels or [])
        if not labels:
            from ptm_app.errors import PtmError

            raise PtmError("SequenceClassificationModule needs labels: set model.init_args.labels or use a TaskDataModule")
        return {**super().config_updates(), "num_labels": len(labels),
                "id2label": dict(enumerate(labels)), "label2id": {n: i for i, n in enumerate(labels)}}

    def configure_model(self) -> None:
        super().configure_model()
        if not self.metrics:
            n = len(self.hparams.labels)
            make = lambda: MetricCollection({"acc": MulticlassAccuracy(n, average="micro"),  # noqa: E731
                                             "f1_macro": MulticlassF1Score(n, average="macro")})
            self.val_metrics, self.test_metrics = make(), make()
            self.metrics = {"val": self.val_metrics, "test": self.test_metrics}

    def make_collator(self, tokenizer, seed: int = 0) -> PadCollator:
        return PadCollator(pad_token_id=tokenizer.pad_token_id)

    def forward(self, batch: dict) -> torch.Tensor:
        return self.backbone(**self.model_inputs(batch)).logits

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = torch.nn.functional.cross_entropy(self(batch).float(), batch["labels"])
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch["labels"]))
        return loss

    def _eval_step(self, stage: str, batch: dict) -> None:
        logits = self(batch).float()
        loss = torch.nn.functional.cross_entropy(logits, batch["labels"])
        self.log(f"{stage}/loss", loss, batch_size=len(batch["labels"]))
        self.metrics[stage].update(logits.argmax(-1), batch["labels"])

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
        probs = torch.softmax(self(batch).float(), dim=-1)
        return {"keys": batch["keys"], "probs": probs.cpu()}
