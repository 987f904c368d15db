"""Task types: what one kind of labelled task needs, bundled in one registry entry (docs/design.md principle 10).

A ``TaskType`` holds its head's width and where it reads (the pooled sequence, every token, or one pooled row
per answer choice), its loss, its metrics (built, updated from one batch, computed over an epoch) and its main
metric, the collator its examples need, and how its predictions read.  ``MultitaskModule`` builds one head per
task from these entries; the single-task modules call the same losses and metrics.  A new kind of task is one
entry here plus its data module.

Kinds: ``sequence`` (classification, single sentences and pairs), ``regression``, ``token`` (tagging),
``qa`` (extractive spans) and ``choice`` (multiple choice: SWAG / RACE style, Devlin et al. 2019 §4.4; each
(question, choice) pair is encoded on its own and a single score per pair is soft-maxed over the choices).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional

import torch
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from ptm_app.data.collators import ChoiceCollator, PadCollator, QACollator, TokenLabelCollator
from ptm_app.errors import PtmError
from ptm_app.tasks.label_scores import label_metrics, regression_metrics
from ptm_app.tasks.spans import BestSpans, best_span, epoch_answers, span_loss, squad_scores
from ptm_app.tasks.tagging import compute_tagging_metrics, tagging_loss, tagging_metrics, update_tagging_metrics

Reads = Literal["pooled", "tokens", "choices"]


@dataclass(frozen=True)
class TaskType:
    """One kind of task.  ``labels`` is the task's label set (None for regression and QA)."""

    name: str
    main_metric: str  # averaged over tasks into multitask ``val/macro``
    reads: Reads  # the head reads the pooled sequence, every token, or one pooled row per answer choice
    width: Callable[[Optional[list[str]]], int]  # the head's outputs per position
    loss: Callable[[Any, dict], torch.Tensor]  # (outputs, batch) -> loss
    metrics: Callable[[Optional[list[str]]], nn.Module]
    update: Callable[[nn.Module, Any, dict, dict], None]  # (metric, outputs, batch, settings)
    compute: Callable[[nn.Module, Callable[[], Any]], dict[str, torch.Tensor]]  # (metric, the split's records)
    collator: type = PadCollator

    def outputs(self, head_out: torch.Tensor, batch: dict) -> Any:
        """The head's raw output as this kind's outputs: scores [B, C], values [B], tag scores [B, T, C],
        (start, end) logits, or choice scores [B, choices]."""
        if self.name == "regression":
            return head_out.squeeze(-1)
        if self.name == "qa":
            return head_out[..., 0], head_out[..., 1]
        if self.name == "choice":
            return head_out.view(batch["labels"].shape[0], -1)
        return head_out


def _computed(metric: nn.Module, records: Callable[[], Any]) -> dict[str, torch.Tensor]:
    values = metric.compute()
    metric.reset()
    return values


def _update_qa(metric: BestSpans, out, batch: dict, settings: dict) -> None:
    spans = [best_span(s, e, o, settings.get("n_best", 20), settings.get("max_answer_length", 30))
             for s, e, o in zip(*out, batch["offsets"])]
    score, start, end = (torch.tensor(v, device=out[0].device) for v in zip(*spans))
    metric.update(batch["examples"], score.float(), start, end)


def _compute_qa(metric: BestSpans, records: Callable[[], Any]) -> dict[str, torch.Tensor]:
    split = records()
    return squad_scores(epoch_answers(metric, split), split)


def choice_accuracy(num_choices: Optional[int] = None) -> nn.Module:
    """``acc``: the share of questions whose highest-scoring choice is the right one."""
    from torchmetrics import MetricCollection

    return MetricCollection({"acc": MulticlassAccuracy(num_choices or 2, average="micro")})


def choice_loss(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the soft-max over each question's choice scores (BERT §4.4, SWAG)."""
    return nn.functional.cross_entropy(scores.float(), labels)


TASK_TYPES: dict[str, TaskType] = {t.name: t for t in (
    TaskType("sequence", "acc", "pooled", lambda labels: len(labels or []),
             lambda out, batch: nn.functional.cross_entropy(out.float(), batch["labels"]),
             lambda labels: label_metrics(len(labels)),
             lambda metric, out, batch, settings: metric.update(out.argmax(-1), batch["labels"]), _computed),
    TaskType("regression", "pearson", "pooled", lambda labels: 1,
             lambda out, batch: nn.functional.mse_loss(out.float(), batch["labels"].float()),
             lambda labels: regression_metrics(),
             lambda metric, out, batch, settings: metric.update(out.float(), batch["labels"].float()), _computed),
    TaskType("token", "acc", "tokens", lambda labels: len(labels or []),
             lambda out, batch: tagging_loss(out, batch["labels"]), tagging_metrics,
             lambda metric, out, batch, settings: update_tagging_metrics(metric, settings["labels"], out.argmax(-1),
                                                                         batch["labels"]),
             lambda metric, records: compute_tagging_metrics(metric), TokenLabelCollator),
    TaskType("qa", "f1", "tokens", lambda labels: 2, lambda out, batch: span_loss(*out, batch),
             lambda labels: BestSpans(), _update_qa, _compute_qa, QACollator),
    TaskType("choice", "acc", "choices", lambda labels: 1, lambda out, batch: choice_loss(out, batch["labels"]),
             lambda labels: choice_accuracy(len(labels) if labels else None),
             lambda metric, out, batch, settings: metric.update(out.argmax(-1), batch["labels"]), _computed,
             ChoiceCollator),
)}


def task_type(kind: str, where: str = "task") -> TaskType:
    """The registry entry for ``kind``, or one line naming the kinds there are."""
    if kind not in TASK_TYPES:
        raise PtmError(f"{where}: kind '{kind}' is not one of {', '.join(TASK_TYPES)}")
    return TASK_TYPES[kind]
