"""The ``multilabel`` task kind: each text carries a set of labels, any number of them (none included).

- Head: one logit per label on the pooled sequence (transformers' ``problem_type="multi_label_classification"``).
- Loss: binary relevance (Zhang & Zhou 2014, "A Review on Multi-Label Learning Algorithms", §3.1.1): one sigmoid and
  binary cross-entropy per label, averaged over labels and examples.
- Thresholds: per label, the probability cut that maximises that label's F1 on the validation split (SCut, Yang 2001,
  "A Study of Thresholding Strategies for Text Categorization", §2.3).  The cut is one of the label's validation
  probabilities: the label is predicted at ``p >= cut``.  A label with no positive example in validation keeps 0.5.
  The cuts are a buffer of the validation metric, so they travel in the checkpoint and the export
  (``module_weights.safetensors``); ``test`` and ``predict`` use them.
- Initialisation: a new head's output biases start at each label's training log-odds, ``log(π / (1 - π))`` (the
  prior initialisation of Lin et al. 2017, "Focal loss for dense object detection", §4.1): with rare labels (1.8 of
  75 per text in OpenMoji) a zero bias starts every probability at 0.5, and at fine-tuning rates Adam moves a bias
  about ``lr`` a step, so thousands of steps go to learning the priors before the text matters.
- Metrics: micro-F1 (true/false positives and negatives pooled over every label) and macro-F1 (the mean of the
  per-label F1s), at the tuned cuts; ``f1_micro`` is the main one.
- Predictions: the chosen label set and every label's probability; ``predict --text`` and ``serve`` take a text.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import nn
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from ptm_app.data.multilabel_data import MultiLabelDataModule
from ptm_app.task_kinds.rows import label_rows
from ptm_app.task_kinds.forms import TEXT
from ptm_app.task_kinds.kind import Prediction, TaskKind
from ptm_app.task_kinds.parts import Metrics, Pooled, Scores


class SigmoidBCE:
    """Binary cross-entropy of each label's sigmoid, averaged (binary relevance)."""

    def __call__(self, out: torch.Tensor, batch: dict) -> torch.Tensor:
        return nn.functional.binary_cross_entropy_with_logits(out.float(), batch["labels"].float())


def tune_thresholds(probs: torch.Tensor, targets: torch.Tensor, default: float = 0.5) -> torch.Tensor:
    """Per label (column), the cut among its probabilities that maximises its F1 when ``p >= cut`` is predicted
    (SCut); ``default`` for a label without positives.  Ties in F1 go to the higher cut (fewer labels predicted)."""
    probs, targets = probs.float(), targets.float()
    cuts = torch.full((probs.shape[1],), default)
    for c in range(probs.shape[1]):
        positives = targets[:, c].sum()
        if positives == 0:
            continue
        order = torch.argsort(probs[:, c], descending=True, stable=True)
        p, tp = probs[order, c], torch.cumsum(targets[order, c], 0)
        last = torch.ones_like(p, dtype=torch.bool)  # predict every example down to the last of a tie group
        last[:-1] = p[:-1] != p[1:]
        f1 = 2 * tp / (torch.arange(1, len(p) + 1) + positives)  # 2TP / (2TP + FP + FN) = 2TP / (predicted + P)
        f1 = f1.masked_fill(~last, -1.0)
        cuts[c] = p[int(torch.argmax(f1))]  # argmax takes the first best: the highest cut
    return cuts


def f1_scores(probs: torch.Tensor, targets: torch.Tensor, cuts: torch.Tensor) -> dict[str, torch.Tensor]:
    """Micro- and macro-F1 of ``probs >= cuts`` against 0/1 ``targets`` [N, labels] (a label that is neither
    predicted nor present counts F1 = 0 in the macro mean, as scikit-learn's ``zero_division=0``)."""
    pred, gold = probs >= cuts.to(probs.device), targets.bool()
    tp, fp, fn = ((pred & gold).sum(0).float(), (pred & ~gold).sum(0).float(), (~pred & gold).sum(0).float())
    micro = 2 * tp.sum() / (2 * tp.sum() + fp.sum() + fn.sum()).clamp(min=1)
    macro = (2 * tp / (2 * tp + fp + fn).clamp(min=1)).mean()
    return {"f1_micro": micro, "f1_macro": macro}


class LabelSetScores(Metric):
    """Every label's probability and gold value over an epoch (gathered across processes), and the per-label cuts
    (``thresholds``, a persistent buffer: saved with the module)."""

    full_state_update = False
    tuned_on_validation = True  # training.callbacks.LastCheckpoint saves again after validation

    def __init__(self, num_labels: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("probs", default=[], dist_reduce_fx="cat")
        self.add_state("targets", default=[], dist_reduce_fx="cat")
        self.register_buffer("thresholds", torch.full((num_labels,), 0.5), persistent=True)

    def update(self, probs: torch.Tensor, targets: torch.Tensor) -> None:
        self.probs.append(probs.float())
        self.targets.append(targets.float())

    def compute(self) -> tuple[torch.Tensor, torch.Tensor]:
        return dim_zero_cat(self.probs), dim_zero_cat(self.targets)


class LabelSetMetrics(Metrics):
    """Micro/macro-F1 at per-label cuts tuned on validation (see the module docstring)."""

    main = "f1_micro"

    def build(self, labels: Optional[list[str]], positive: Optional[int] = None) -> nn.Module:
        return LabelSetScores(len(labels or []))

    def update(self, metric: LabelSetScores, out: torch.Tensor, batch: dict, settings: dict) -> None:
        metric.update(torch.sigmoid(out.float()), batch["labels"])

    def compute(self, metric: LabelSetScores, records: Callable[[], Any],
                tuned: Optional[nn.Module] = None) -> dict[str, torch.Tensor]:
        probs, targets = metric.compute()
        metric.reset()
        if tuned is None or tuned is metric:  # the validation split: tune the cuts here
            metric.thresholds.copy_(tune_thresholds(probs.cpu(), targets.cpu()).to(metric.thresholds.device))
            cuts = metric.thresholds
        else:
            cuts = tuned.thresholds
        return f1_scores(probs, targets, cuts)


def thresholds_of(module: Optional[nn.Module], num_labels: int) -> torch.Tensor:
    """The run's tuned cuts (its validation metric's buffer), or 0.5 for a model without them."""
    metrics = getattr(module, "stage_metrics", None)
    if metrics is not None and "val" in metrics and hasattr(metrics["val"], "thresholds"):
        return metrics["val"].thresholds.detach().float().cpu()
    return torch.full((num_labels,), 0.5)


def prior_log_odds(facts) -> Optional[torch.Tensor]:
    """``log(π / (1 - π))`` per label from the data's training shares π (kept within [1e-4, 1 - 1e-4]: finite for a
    label no training text or every training text carries)."""
    priors = facts.label_priors()
    if not priors:
        return None
    pi = torch.tensor(priors, dtype=torch.float64).clamp(1e-4, 1 - 1e-4)
    return torch.log(pi / (1 - pi)).float()


class ChosenLabels(Scores):
    """Every label's probability and the chosen set (``p >= the label's cut``)."""

    def __call__(self, out: torch.Tensor, module: Optional[nn.Module] = None) -> dict:
        probs = torch.sigmoid(out.float()).cpu()
        return {"probs": probs, "chosen": probs >= thresholds_of(module, probs.shape[-1])}


KIND = TaskKind("multilabel", "sequence_classification",
                "labelling a text with the set of its labels, any number of them (main.py predict)",
                "text-classification", MultiLabelDataModule, Pooled(), SigmoidBCE(), LabelSetMetrics(),
                Prediction(TEXT, label_rows), scores=ChosenLabels(), problem_type="multi_label_classification",
                initial_bias=prior_log_odds)
