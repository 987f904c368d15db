"""Extractive QA spans (BERT, Devlin et al. 2019 §4.2): the start/end loss, each window's best span, and the
epoch's answers per example scored with SQuAD EM/F1 (Rajpurkar et al. 2016 §5).

Unanswerable questions (SQuAD 2.0, Rajpurkar et al. 2018; BERT §4.3): a question without an answer in its context
has its start and end at [CLS] (token 0) in every window, so ``s_null = S·C + E·C`` (the [CLS] start + end logits)
scores "no answer".  An example's ``s_null`` is the lowest over its windows (BERT's ``run_squad``) and its best span
``ŝ`` the highest; a span is answered when ``ŝ - s_null > τ``, with τ the threshold that maximises F1 on the
validation split (:func:`tune_null_threshold`), used as it is on test and in predictions.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
from torch import nn
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from ptm_app.task_kinds.metrics import squad_em, squad_f1

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
    """Collects each window's best span and null score over an epoch (gathered across processes) and keeps, per
    example, the highest-scoring span and the lowest null score.

    ``null_answer``: the model may answer "no answer"; ``null_threshold`` (τ, a persistent buffer: saved with the
    module, in checkpoints and exports) is then tuned on validation and used on test and in predictions."""

    full_state_update = False

    def __init__(self, null_answer: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        for name in ("example", "score", "start", "end", "null"):
            self.add_state(name, default=[], dist_reduce_fx="cat")
        self.null_answer = self.tuned_on_validation = null_answer  # LastCheckpoint saves again after validation
        if null_answer:
            self.register_buffer("null_threshold", torch.tensor(0.0), persistent=True)  # run_squad's default, 0

    def update(self, example: torch.Tensor, score: torch.Tensor, start: torch.Tensor, end: torch.Tensor,
               null: Optional[torch.Tensor] = None) -> None:
        null = torch.full_like(score, -math.inf) if null is None else null  # no null score: always a span
        for name, value in (("example", example), ("score", score), ("start", start), ("end", end), ("null", null)):
            getattr(self, name).append(value)

    def compute(self) -> dict[int, tuple[float, int, int, float]]:
        """Per example: ``(best span score, start char, end char, lowest null score)``."""
        if not self.example:
            return {}
        best: dict[int, tuple[float, int, int, float]] = {}
        columns = ("example", "score", "start", "end", "null")
        for example, score, start, end, null in zip(*(dim_zero_cat(getattr(self, n)).tolist() for n in columns)):
            e = int(example)
            low = min(null, best[e][3]) if e in best else null
            if e not in best or score > best[e][0]:
                best[e] = (score, int(start), int(end), low)
            else:
                best[e] = (*best[e][:3], low)
        return best


class Answer(NamedTuple):
    """One example's answer: its best span's score and characters (``-1``, ``-1``, ``""`` for none or "no answer")
    and ``null_diff = ŝ - s_null`` (``inf`` without a null score)."""

    score: float
    start: int
    end: int
    text: str
    null_diff: float = math.inf


def epoch_answers(spans: BestSpans, records, null_threshold: Optional[float] = None) -> dict[int, Answer]:
    """Per example seen this epoch, its best span as an :class:`Answer`; with ``null_threshold`` τ, "no answer"
    where ``ŝ - s_null <= τ``.  Resets ``spans``."""
    best = spans.compute()
    spans.reset()
    contexts = records.fields["context"]
    answers = {e: Answer(score, s, t, contexts[e][s:t] if s >= 0 else "", score - null)
               for e, (score, s, t, null) in sorted(best.items())}
    return answers if null_threshold is None else with_null(answers, null_threshold)


def answer_row(answer: Answer, null_answer: bool) -> dict:
    """A prediction row's answer fields: ``answer``, ``answer_start``, ``answer_end``, ``score`` (the best span's,
    None without one) and, for a model with a null answer, ``no_answer`` and ``null_diff`` (``ŝ - s_null``)."""
    row = {"answer": answer.text, "answer_start": answer.start, "answer_end": answer.end,
           "score": round(answer.score, 4) if math.isfinite(answer.score) else None}
    if null_answer:
        row.update(no_answer=answer.start < 0, null_diff=round(answer.null_diff, 4))
    return row


def with_null(answers: dict[int, Answer], threshold: float) -> dict[int, Answer]:
    """The answers with "no answer" (``-1, -1, ""``) wherever ``null_diff <= threshold``."""
    return {e: a if a.null_diff > threshold else a._replace(start=-1, end=-1, text="") for e, a in answers.items()}


def tune_null_threshold(answers: dict[int, Answer], golds: list[list[str]]) -> float:
    """The τ that maximises the summed F1 when the examples with ``null_diff > τ`` are answered with their span and
    the others with "no answer" (BERT §4.3: "the threshold τ is selected on the dev set to maximize F1").

    Candidates: every cut between two distinct ``null_diff`` values (at their midpoint), all "no answer" (the largest
    value) and none (``-inf``); among equal F1s the cut with the fewest answered examples wins, as the official
    SQuAD 2.0 script's ``find_best_thresh``."""
    if not answers:
        return 0.0
    rows = sorted(answers.items(), key=lambda item: -item[1].null_diff)
    diffs = [a.null_diff for _, a in rows]
    span_f1 = [squad_f1(a.text, golds[e]) for e, a in rows]
    null_f1 = [squad_f1("", golds[e]) for e, _ in rows]
    total = best = sum(null_f1)  # k = 0: no example answered
    best_k = 0
    for k in range(1, len(rows) + 1):  # the top k answered
        total += span_f1[k - 1] - null_f1[k - 1]
        if (k == len(rows) or diffs[k - 1] > diffs[k]) and total > best + 1e-12:
            best, best_k = total, k
    if best_k == 0:
        return diffs[0]
    if best_k == len(rows):
        return -math.inf
    return (diffs[best_k - 1] + diffs[best_k]) / 2


def squad_scores(answers: dict[int, Answer], records) -> dict[str, torch.Tensor]:
    """SQuAD EM / F1 of the answers against the records' gold answers (the spans are already gathered from every
    process); where the split has unanswerable questions, also SQuAD 2.0's split: ``has_ans_em`` / ``has_ans_f1``
    over the answerable ones and ``no_ans_acc`` (the script's NoAns_exact = NoAns_f1) over the others."""
    golds = records.fields["answers"]
    em = {e: squad_em(a.text, golds[e]) for e, a in answers.items()}
    f1 = {e: squad_f1(a.text, golds[e]) for e, a in answers.items()}
    mean = lambda values, keys: torch.tensor(sum(values[k] for k in keys) / max(len(keys), 1))  # noqa: E731
    out = {"em": mean(em, list(answers)), "f1": mean(f1, list(answers))}
    unanswerable = [e for e in answers if not golds[e]]
    if unanswerable:
        answerable = [e for e in answers if golds[e]]
        out.update(has_ans_em=mean(em, answerable), has_ans_f1=mean(f1, answerable),
                   no_ans_acc=mean(em, unanswerable))
    return out


def span_loss(start_logits: torch.Tensor, end_logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """The mean of the start and end positions' cross-entropies (BERT §4.2)."""
    ce = nn.functional.cross_entropy
    return (ce(start_logits, batch["start_positions"]) + ce(end_logits, batch["end_positions"])) / 2
