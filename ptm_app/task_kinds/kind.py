"""The ``TaskKind`` record: what one kind of task bundles (see ``task_kinds.registry``, which holds the entries)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn

from ptm_app.backbones.model_classes import MODEL_CLASSES, ModelClass
from ptm_app.data.collators import PadCollator
from ptm_app.task_kinds.forms import InputForm
from ptm_app.task_kinds.parts import HeadShape, Metrics, Scores, SoftTargets


@dataclass(frozen=True)
class Prediction:
    """What ``predict --text/--input`` and ``serve`` take (``form``) and the rows they give:
    ``rows(loaded, examples, settings, kind) -> one row per example`` (``task_kinds.rows``)."""

    form: InputForm
    rows: Callable[[Any, list, Any, Any], list[dict]]


@dataclass(frozen=True)
class TaskKind:
    """One kind of task (see ``task_kinds.registry``).  ``labels`` below is the task's label set (None for regression
    and QA)."""

    name: str
    model_class: str  # a backbones.model_classes.MODEL_CLASSES key
    intended_use: Optional[str]  # the model card's "It is for ..." (None: the model class's)
    pipeline_tag: Optional[str]  # the Hub pipeline that serves it (None: the model class's, if any)
    data_module: type
    head: Optional[HeadShape]  # None: the module builds its own output (generation)
    loss: Optional[Callable[[Any, dict], torch.Tensor]]  # (outputs, batch) -> loss
    metrics: Optional[Metrics]
    prediction: Prediction
    collator: type = PadCollator
    scores: Optional[Scores] = None  # what predict_step returns for a batch's outputs
    problem_type: Optional[str] = None  # transformers' config.problem_type marking this kind on a shared class
    initial_bias: Optional[Callable[[Any], Optional[torch.Tensor]]] = None  # (data facts) -> a new head's output bias
    soft_targets: Optional[SoftTargets] = None  # the rows a teacher's outputs teach (None: no distillation)

    @property
    def model(self) -> ModelClass:
        return MODEL_CLASSES[self.model_class]

    @property
    def auto_class(self) -> str:
        return self.model.auto_class

    @property
    def peft_task_type(self) -> Optional[str]:
        return self.model.peft_task_type

    @property
    def main_metric(self) -> str:
        return self.metrics.main

    @property
    def reads(self) -> str:
        return self.head.reads

    def width(self, labels: Optional[list[str]]) -> int:
        return self.head.width(labels)

    def outputs(self, head_out: torch.Tensor, batch: dict) -> Any:
        """The head's raw output as this kind's outputs: scores [B, C], values [B], tag scores [B, T, C],
        (start, end) logits, or choice scores [B, choices]."""
        return self.head.outputs(head_out, batch)

    def build_metrics(self, labels: Optional[list[str]], positive: Optional[int] = None) -> nn.Module:
        return self.metrics.build(labels, positive)

    def update(self, metric: nn.Module, out: Any, batch: dict, settings: dict) -> None:
        self.metrics.update(metric, out, batch, settings)

    def compute(self, metric: nn.Module, records: Callable[[], Any], tuned: Optional[nn.Module] = None):
        """The epoch's values; ``records()`` gives the split's examples, ``tuned`` the validation metric (settings
        tuned on validation, used on test)."""
        return self.metrics.compute(metric, records, tuned)
