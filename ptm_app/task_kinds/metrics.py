"""Task metrics: entity-level F1 for BIO tagging and SQuAD exact match / F1.

Entity F1 follows CoNLL-2000's ``conlleval`` as reimplemented by seqeval (its default, non-strict mode):
an entity is a maximal chunk of one type, a prediction counts only if its span *and* type match a gold
entity exactly, and precision/recall/F1 are micro-averaged over all entities.
SQuAD EM/F1 follow the official v1.1 evaluation script (Rajpurkar et al. 2016 §5): answers are
normalised (lowercase, no punctuation, no articles a/an/the, single spaces), then EM = equal strings and
F1 = token-overlap F1, each the maximum over the gold answers.  Scores are fractions in [0, 1] (the
official script reports ×100).
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

import torch
from torch import nn
from torchmetrics import Metric
from torchmetrics.classification import MulticlassAccuracy

from ptm_app.data import IGNORE_INDEX
from ptm_app.data.sources.squad import squad_normalize

Span = tuple[str, int, int]  # (type, first word, last word), inclusive


# -- token classification ----------------------------------------------------------------------------
def token_accuracy(num_labels: int) -> MulticlassAccuracy:
    """Accuracy over labelled positions only (``-100``: special tokens, padding, non-first sub-tokens)."""
    return MulticlassAccuracy(num_labels, average="micro", ignore_index=IGNORE_INDEX)


def is_bio(labels: Sequence[str]) -> bool:
    """True for a BIO / IOB2 tag set: every tag is ``O``, ``B-TYPE`` or ``I-TYPE``, and some are not ``O``."""
    return any(t != "O" for t in labels) and all(t == "O" or t[:2] in ("B-", "I-") for t in labels)


def _split(tag: str) -> tuple[str, str]:
    return ("O", "") if tag == "O" else (tag[0], tag[2:])


def entity_spans(tags: Sequence[str]) -> set[Span]:
    """The entities of one BIO-tagged sequence as ``(type, start, end)`` word spans (end inclusive).

    seqeval's default (conlleval) rules: ``B-X`` always starts an entity; ``I-X`` continues the entity
    before it only if that one has type X, otherwise (after ``O``, or after another type) ``I-X`` starts a
    new entity, so IOB1 input and ill-formed IOB2 are both read the forgiving way.
    """
    spans: set[Span] = set()
    start, kind = -1, ""
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, typ = _split(tag)
        continues = prefix == "I" and start >= 0 and typ == kind
        if start >= 0 and not continues:
            spans.add((kind, start, i - 1))
            start, kind = -1, ""
        if prefix in ("B", "I") and not continues:
            start, kind = i, typ
    return spans


def entity_counts(pred_tags: Sequence[Sequence[str]], gold_tags: Sequence[Sequence[str]]) -> tuple[int, int, int]:
    """``(true positives, predicted entities, gold entities)`` over aligned sequences."""
    tp = n_pred = n_gold = 0
    for pred, gold in zip(pred_tags, gold_tags, strict=True):
        p, g = entity_spans(pred), entity_spans(gold)
        tp, n_pred, n_gold = tp + len(p & g), n_pred + len(p), n_gold + len(g)
    return tp, n_pred, n_gold


def prf(tp: float, n_pred: float, n_gold: float) -> tuple[float, float, float]:
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def entity_f1(pred_tags: Sequence[Sequence[str]], gold_tags: Sequence[Sequence[str]]) -> dict[str, float]:
    """Exact-match entity-level micro precision / recall / F1 (seqeval default mode)."""
    precision, recall, f1 = prf(*entity_counts(pred_tags, gold_tags))
    return {"precision": precision, "recall": recall, "f1": f1}


class EntityF1(Metric):
    """:func:`entity_f1` accumulated over batches (and summed across processes)."""

    full_state_update = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        for name in ("tp", "n_pred", "n_gold"):
            self.add_state(name, default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, pred_tags: Sequence[Sequence[str]], gold_tags: Sequence[Sequence[str]]) -> None:
        tp, n_pred, n_gold = entity_counts(pred_tags, gold_tags)
        self.tp += tp
        self.n_pred += n_pred
        self.n_gold += n_gold

    def compute(self) -> dict[str, torch.Tensor]:
        p, r, f = prf(int(self.tp), int(self.n_pred), int(self.n_gold))
        return {"entity_precision": torch.tensor(p), "entity_recall": torch.tensor(r), "entity_f1": torch.tensor(f)}


# -- extractive QA -----------------------------------------------------------------------------------
def squad_em(pred: str, golds: Sequence[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer; no gold answers (an unanswerable
    question, SQuAD 2.0) count as the one gold answer ``""``, as the v2.0 script."""
    return float(any(squad_normalize(pred) == squad_normalize(g) for g in (golds or [""])))


def _f1(pred: str, gold: str) -> float:
    p, g = squad_normalize(pred).split(), squad_normalize(gold).split()
    same = sum((Counter(p) & Counter(g)).values())
    if same == 0:  # the v1.1 script: no shared token is 0, even empty vs a gold that normalises to empty ('.')
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def squad_f1(pred: str, golds: Sequence[str]) -> float:
    """Bag-of-tokens F1 between the normalised prediction and the best-matching gold answer; for an unanswerable
    question (no gold answers) 1.0 for an empty prediction and 0.0 otherwise (the v2.0 script)."""
    if not golds:
        return float(not squad_normalize(pred))
    return max(_f1(pred, g) for g in golds)


class SquadMetric(Metric):
    """Mean SQuAD EM and F1 over the examples seen (summed across processes)."""

    full_state_update = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        for name in ("em", "f1", "n"):
            self.add_state(name, default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, preds: Sequence[str], golds: Sequence[Sequence[str]]) -> None:
        for pred, answers in zip(preds, golds, strict=True):
            self.em += squad_em(pred, answers)
            self.f1 += squad_f1(pred, answers)
            self.n += 1

    def compute(self) -> dict[str, torch.Tensor]:
        n = max(float(self.n), 1.0)
        return {"em": (self.em / n).float(), "f1": (self.f1 / n).float()}


# -- generation ----------------------------------------------------------------------------------------------
def sacrebleu_metric(name: str, lowercase: bool = False):
    """sacreBLEU's own metric object (Post 2018): ``bleu`` (corpus BLEU-4, Papineni et al. 2002 §2, ``13a``
    tokenization, sacreBLEU's default exponential smoothing) or ``chrf`` (chrF2, Popović 2015: character 6-grams,
    β = 2).  The one place ptm_app scores BLEU and chrF."""
    from sacrebleu.metrics import BLEU, CHRF

    if name == "bleu":
        return BLEU(tokenize="13a", lowercase=lowercase)
    if name == "chrf":
        return CHRF(lowercase=lowercase)
    raise ValueError(f"unknown sacreBLEU metric {name!r}: bleu or chrf")


class SacreScore(Metric):
    """A corpus-level sacreBLEU score accumulated across batches (and ranks) as sacreBLEU's sufficient statistics
    (n-gram matches and totals, lengths), summed, then scored by sacreBLEU: equal to ``corpus_score`` over all
    sentences at once.  A fraction in [0, 1] (sacreBLEU reports x100)."""

    full_state_update = False

    def __init__(self, name: str, lowercase: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.metric = sacrebleu_metric(name, lowercase)
        size = len(self.metric._extract_corpus_statistics(["a"], [["a"]])[0])
        self.add_state("stats", default=torch.zeros(size, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("n", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, preds: Sequence[str], references: Sequence[str]) -> None:
        if preds:
            rows = self.metric._extract_corpus_statistics(list(preds), [list(references)])
            self.stats += torch.tensor(rows, dtype=torch.float64).sum(0)
            self.n += len(preds)

    def compute(self) -> torch.Tensor:
        if not self.n:
            return torch.tensor(0.0)
        stats = [int(round(v)) for v in self.stats.tolist()]
        return torch.tensor(self.metric._compute_score_from_stats(stats).score / 100.0)


class GenerationScores(nn.Module):
    """ROUGE-L, corpus BLEU and chrF of generated texts against one reference each.

    ``rougeL``: the LCS F-measure of Lin 2004 §3 (ROUGE-L), per pair and averaged, on lowercased alphanumeric
    tokens as Google's ``rouge_score`` tokenizes them (no stemming: no nltk needed), via torchmetrics.  ``bleu``
    and ``chrf``: sacreBLEU's corpus BLEU and chrF (``SacreScore``); BLEU lowercased unless ``bleu_lowercase`` is
    false, chrF cased.  All are fractions in [0, 1].
    """

    def __init__(self, bleu_lowercase: bool = True):
        super().__init__()
        from torchmetrics.text import ROUGEScore

        self.rouge = ROUGEScore(rouge_keys="rougeL")
        self.bleu = SacreScore("bleu", lowercase=bleu_lowercase)
        self.chrf = SacreScore("chrf")

    def update(self, preds: Sequence[str], references: Sequence[str]) -> None:
        preds, references = list(preds), list(references)
        if len(preds) != len(references):
            raise ValueError(f"{len(preds)} generations for {len(references)} references")
        self.rouge.update(preds, references)
        self.bleu.update(preds, references)
        self.chrf.update(preds, references)

    def compute(self) -> dict[str, torch.Tensor]:
        return {"rougeL": self.rouge.compute()["rougeL_fmeasure"].float(), "bleu": self.bleu.compute().float(),
                "chrf": self.chrf.compute().float()}

    def reset(self) -> None:
        self.rouge.reset()
        self.bleu.reset()
        self.chrf.reset()
