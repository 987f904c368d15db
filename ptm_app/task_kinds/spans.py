"""Extractive QA spans (BERT, Devlin et al. 2019 §4.2): the start/end loss, each window's best span, and the
epoch's answers per example scored with SQuAD EM/F1 (Rajpurkar et al. 2016 §5)."""
from __future__ import annotations

import torch
from torch import nn
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from ptm_app.task_kinds.metrics import SquadMetric

SPLITS = {"val": "validation", "test": "test", "predict": "test"}


def best_span(start_logits: torch.Tensor, end_logits: torch.Tensor, offsets: torch.Tensor, n_best: int = 20,
              max_answer_length: int = 30) -> tuple[float, int, int]:
    """The best ``(score, start_char, end_char)`` of one window, or ``(-inf, -1, -1)`` if none is valid.

    Candidates: the ``n_best`` highest start and end logits among *context* tokens (``offsets >= 0``; the
    question, specials and padding never qualify); a pair is valid if ``end >= start`` and it spans at most
    ``max_answer_length`` tokens; its score is ``start_logit + end_logit`` (BERT §4.2).
    """
    context = offsets[:, 0] >= 0
    if not context.any():
        return float("-inf"), -1, -1
    k = min(n_best, int(context.sum()))
    starts = start_logits.float().masked_fill(~context, float("-inf")).topk(k).indices
    ends = end_logits.float().masked_fill(~context, float("-inf")).topk(k).indices
    length = ends[None, :] - starts[:, None]
    scores = start_logits.float()[starts][:, None] + end_logits.float()[ends][None, :]
    scores = scores.masked_fill((length < 0) | (length >= max_answer_length), float("-inf"))
    best = int(scores.argmax())
    score = float(scores.flatten()[best])
    if score == float("-inf"):
        return score, -1, -1
    i, j = divmod(best, k)
    return score, int(offsets[starts[i], 0]), int(offsets[ends[j], 1])


class BestSpans(Metric):
    """Collects each window's best span over an epoch (gathered across processes) and keeps, per example,
    the highest-scoring one."""

    full_state_update = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        for name in ("example", "score", "start", "end"):
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(self, example: torch.Tensor, score: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> None:
        for name, value in (("example", example), ("score", score), ("start", start), ("end", end)):
            getattr(self, name).append(value)

    def compute(self) -> dict[int, tuple[float, int, int]]:
        if not self.example:
            return {}
        best: dict[int, tuple[float, int, int]] = {}
        rows = zip(*(dim_zero_cat(getattr(self, n)).tolist() for n in ("example", "score", "start", "end")))
        for example, score, start, end in rows:
            if int(example) not in best or score > best[int(example)][0]:
                best[int(example)] = (score, int(start), int(end))
        return best


def epoch_answers(spans: BestSpans, records) -> dict[int, tuple[float, int, int, str]]:
    """Per example seen this epoch: ``(score, start_char, end_char, text)`` of its best span (``""`` if none);
    resets ``spans``."""
    best = spans.compute()
    spans.reset()
    contexts = records.fields["context"]
    return {e: (score, s, t, contexts[e][s:t] if s >= 0 else "") for e, (score, s, t) in sorted(best.items())}


def squad_scores(answers: dict[int, tuple[float, int, int, str]], records) -> dict[str, torch.Tensor]:
    """SQuAD EM / F1 of the answers against the records' gold answers."""
    squad = SquadMetric(sync_on_compute=False)  # the spans are already gathered from every process
    squad.update([a[3] for a in answers.values()], [records.fields["answers"][e] for e in answers])
    return squad.compute()


def span_loss(start_logits: torch.Tensor, end_logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """The mean of the start and end positions' cross-entropies (BERT §4.2)."""
    ce = nn.functional.cross_entropy
    return (ce(start_logits, batch["start_positions"]) + ce(end_logits, batch["end_positions"])) / 2
