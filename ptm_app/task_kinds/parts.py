"""The parts a task kind's entry (``task_kinds.registry``) is made of, as small classes:

- head shapes: what the task head reads (the pooled sequence, every token, one pooled row per answer choice), its
  width, and how its raw output becomes the kind's outputs;
- losses: ``loss(outputs, batch) -> tensor``;
- metrics: built per stage, updated from one batch, computed over an epoch, with the main one averaged into
  multitask ``val/macro``;
- scores: what ``predict_step`` returns for a batch's outputs (``training.callbacks.score_rows`` writes the rows);
- soft targets: the score rows a teacher's outputs teach a student's (knowledge distillation,
  ``compression.teacher_loss``).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from ptm_app.data import IGNORE_INDEX
from ptm_app.task_kinds.label_scores import label_metrics, regression_metrics
from ptm_app.task_kinds.spans import (BestSpans, best_span, epoch_answers, span_loss, squad_scores,
                                     tune_null_threshold, with_null)
from ptm_app.task_kinds.tagging import compute_tagging_metrics, tagging_loss, tagging_metrics, update_tagging_metrics


# -- head shapes -------------------------------------------------------------------------------------
class HeadShape:
    """A head on the pooled sequence with one output per label."""

    reads = "pooled"

    def width(self, labels: Optional[list[str]]) -> int:
        return len(labels or [])

    def outputs(self, head_out: torch.Tensor, batch: dict) -> Any:
        return head_out


class Pooled(HeadShape):
    """Label scores [B, C] from the pooled sequence."""


class Value(HeadShape):
    """One real value [B] per example."""

    def width(self, labels: Optional[list[str]]) -> int:
        return 1

    def outputs(self, head_out: torch.Tensor, batch: dict) -> torch.Tensor:
        return head_out.squeeze(-1)


class Tokens(HeadShape):
    """Tag scores [B, T, C] at every token."""

    reads = "tokens"


class Spans(HeadShape):
    """(start, end) logits [B, T] at every token (BERT §4.2)."""

    reads = "tokens"

    def width(self, labels: Optional[list[str]]) -> int:
        return 2

    def outputs(self, head_out: torch.Tensor, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        return head_out[..., 0], head_out[..., 1]


class Choices(HeadShape):
    """One score per (question, choice) pair, as choice scores [B, choices] (BERT §4.4)."""

    reads = "choices"

    def width(self, labels: Optional[list[str]]) -> int:
        return 1

    def outputs(self, head_out: torch.Tensor, batch: dict) -> torch.Tensor:
        return head_out.view(batch["labels"].shape[0], -1)


# -- losses ------------------------------------------------------------------------------------------
class CrossEntropy:
    """Cross-entropy of the soft-max over label scores, or over a question's choice scores (BERT §4.1, §4.4)."""

    def __call__(self, out: torch.Tensor, batch: dict) -> torch.Tensor:
        return nn.functional.cross_entropy(out.float(), batch["labels"])


class MeanSquaredError:
    """Mean-squared error of real values (STS-B; BERT §4.1)."""

    def __call__(self, out: torch.Tensor, batch: dict) -> torch.Tensor:
        return nn.functional.mse_loss(out.float(), batch["labels"].float())


class TagCrossEntropy:
    """Cross-entropy over the labelled (first sub-token) positions (``task_kinds.tagging``)."""

    def __call__(self, out: torch.Tensor, batch: dict) -> torch.Tensor:
        return tagging_loss(out, batch["labels"])


class SpanCrossEntropy:
    """The mean of the start and end positions' cross-entropies (BERT §4.2)."""

    def __call__(self, out: tuple[torch.Tensor, torch.Tensor], batch: dict) -> torch.Tensor:
        return span_loss(*out, batch)


# -- soft targets (knowledge distillation) -----------------------------------------------------------
class SoftTargets:
    """Where a kind's outputs are distributions a teacher can teach (Hinton et al. 2015 §2: the student matches
    ``softmax(z_T/T)``): ``rows(outputs, batch)`` gives score rows [N, C], each soft-maxed over its last dimension,
    the student's and the teacher's lining up one to one; the soft-target loss is the mean over the list of its
    per-row mean.  ``by_label``: the last dimension is the task's label set (the teacher's logits are put in the
    student's label order)."""

    by_label = True

    def rows(self, out: torch.Tensor, batch: dict) -> list[torch.Tensor]:
        return [out]


class PerExample(SoftTargets):
    """One distribution per example: over the labels [B, C] (sequence), or over a question's choices (choice)."""

    def __init__(self, by_label: bool = True):
        self.by_label = by_label


class PerLabelledToken(SoftTargets):
    """One distribution over the tags per labelled token: the positions whose gold label is not ``IGNORE_INDEX``
    (each word's first sub-token, BERT §4.3), never padding, special tokens or later sub-tokens: [N_labelled, C]."""

    def rows(self, out: torch.Tensor, batch: dict) -> list[torch.Tensor]:
        return [out[batch["labels"] != IGNORE_INDEX]]


NO_POSITION = -1.0e4  # a score whose softmax weight is exactly 0 in float32 at any temperature up to 100


class StartAndEnd(SoftTargets):
    """Two distributions per window, over its token positions: the answer's start and its end (BERT §4.2's two
    softmaxes).  Padding positions are set to ``NO_POSITION`` in both the student's and the teacher's scores, so
    they take no probability and add nothing to the KL or the squared error."""

    by_label = False

    def rows(self, out: tuple[torch.Tensor, torch.Tensor], batch: dict) -> list[torch.Tensor]:
        padding = ~batch["attention_mask"].bool()
        return [scores.float().masked_fill(padding, NO_POSITION) for scores in out]


# -- metrics -----------------------------------------------------------------------------------------
class Metrics:
    """``build(labels, positive)`` one stage's metric (``positive``: the positive class of a two-label task); ``update(metric, outputs, batch, settings)``; ``compute(metric,
    records, tuned)`` the epoch's values (``records()``: the split's examples; ``tuned``: the validation stage's
    metric, for values tuned there).  ``main``: the value averaged over tasks into multitask ``val/macro``."""

    main = "acc"

    def build(self, labels: Optional[list[str]], positive: Optional[int] = None) -> nn.Module:
        raise NotImplementedError

    def update(self, metric: nn.Module, out: Any, batch: dict, settings: dict) -> None:
        metric.update(out.argmax(-1), batch["labels"])

    def compute(self, metric: nn.Module, records: Callable[[], Any], tuned: Optional[nn.Module] = None) -> dict:
        values = metric.compute()
        metric.reset()
        return values


class LabelMetrics(Metrics):
    """``acc``, ``f1_macro``, ``mcc`` and, for two labels, the positive class's ``f1`` (GLUE, Wang et al. 2019 §3)."""

    def build(self, labels: Optional[list[str]], positive: Optional[int] = None) -> nn.Module:
        return label_metrics(len(labels or []), positive)


class RegressionMetrics(Metrics):
    """Pearson and Spearman correlation and MSE (STS-B)."""

    main = "pearson"

    def build(self, labels: Optional[list[str]], positive: Optional[int] = None) -> nn.Module:
        return regression_metrics()

    def update(self, metric: nn.Module, out: torch.Tensor, batch: dict, settings: dict) -> None:
        metric.update(out.float(), batch["labels"].float())


class TaggingMetrics(Metrics):
    """Token accuracy, and entity-level P/R/F1 for BIO tag sets."""

    def build(self, labels: Optional[list[str]], positive: Optional[int] = None) -> nn.Module:
        return tagging_metrics(labels)

    def update(self, metric: nn.Module, out: torch.Tensor, batch: dict, settings: dict) -> None:
        update_tagging_metrics(metric, settings["labels"], out.argmax(-1), batch["labels"])

    def compute(self, metric: nn.Module, records: Callable[[], Any], tuned: Optional[nn.Module] = None) -> dict:
        return compute_tagging_metrics(metric)


class SpanMetrics(Metrics):
    """SQuAD EM / F1 of each example's best span over its windows (Rajpurkar et al. 2016 §5); with a null answer
    (``BestSpans(null_answer=True)``, BERT §4.3), "no answer" below the threshold τ tuned on validation, and the
    HasAns / NoAns split (``task_kinds.spans``)."""

    main = "f1"

    def build(self, labels: Optional[list[str]], positive: Optional[int] = None) -> nn.Module:
        return BestSpans()

    def update(self, metric: BestSpans, out, batch: dict, settings: dict) -> None:
        spans = [best_span(s, e, o, settings.get("n_best", 20), settings.get("max_answer_length", 30))
                 for s, e, o in zip(*out, batch["offsets"])]
        score, start, end = (torch.tensor(v, device=out[0].device) for v in zip(*spans))
        null = (out[0][:, 0] + out[1][:, 0]).float()  # s_null = S·C + E·C, [CLS] at token 0 of every window
        metric.update(batch["examples"], score.float(), start, end, null)

    def compute(self, metric: BestSpans, records: Callable[[], Any], tuned: Optional[nn.Module] = None) -> dict:
        split = records()
        answers = epoch_answers(metric, split)
        if not getattr(metric, "null_answer", False):
            return squad_scores(answers, split)
        if tuned is None or tuned is metric or not hasattr(tuned, "null_threshold"):  # validation: tune τ here
            golds = split.fields["answers"]
            if any(not golds[e] for e in answers):
                metric.null_threshold.fill_(tune_null_threshold(answers, golds))
            tuned = metric
        threshold = tuned.null_threshold
        return {**squad_scores(with_null(answers, float(threshold)), split), "null_threshold": threshold.float()}


class ChoiceMetrics(Metrics):
    """``acc``: the share of questions whose highest-scoring choice is the right one."""

    def build(self, labels: Optional[list[str]], positive: Optional[int] = None) -> nn.Module:
        return MetricCollection({"acc": MulticlassAccuracy(len(labels) if labels else 2, average="micro")})


# -- prediction scores -------------------------------------------------------------------------------
class Scores:
    """``scores(outputs, module) -> dict`` for ``predict_step`` (``module``: the run's, None for a plain export)."""

    def __call__(self, out: torch.Tensor, module: Optional[nn.Module] = None) -> dict:
        raise NotImplementedError


class Softmax(Scores):
    """Every label's (or choice's) probability."""

    def __call__(self, out: torch.Tensor, module: Optional[nn.Module] = None) -> dict:
        return {"probs": torch.softmax(out.float(), dim=-1).cpu()}


class Values(Scores):
    """The predicted real values."""

    def __call__(self, out: torch.Tensor, module: Optional[nn.Module] = None) -> dict:
        return {"values": out.float().cpu()}
