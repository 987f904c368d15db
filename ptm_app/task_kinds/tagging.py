"""Token tagging (BERT, Devlin et al. 2019 §4.3): the loss over first sub-tokens, token accuracy, and
entity-level F1 for BIO tag sets."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ptm_app.data import IGNORE_INDEX
from ptm_app.task_kinds.metrics import EntityF1, is_bio, token_accuracy


def word_tags(labels: list[str], ids: torch.Tensor, where: torch.Tensor) -> list[list[str]]:
    """Tag names at the labelled (first sub-token) positions of each row, in word order."""
    return [[labels[i] for i in row[keep].tolist()] for row, keep in zip(ids, where)]


def tags_by_word(labels: list[str], preds: torch.Tensor, word_index: torch.Tensor, n_words: int) -> list[Optional[str]]:
    """One predicted tag per word, read at its first sub-token (``word_index >= 0``); ``None`` for words
    without one (cut by ``max_length``)."""
    tags: list[Optional[str]] = [None] * n_words
    for pos in (word_index >= 0).nonzero().squeeze(1).tolist():
        tags[int(word_index[pos])] = labels[int(preds[pos])]
    return tags


def tagging_metrics(labels: list[str]) -> nn.ModuleDict:
    """Token accuracy, plus entity-level P/R/F1 when the tags are BIO."""
    return nn.ModuleDict({"acc": token_accuracy(len(labels)), **({"entities": EntityF1()} if is_bio(labels) else {})})


def update_tagging_metrics(metrics: nn.ModuleDict, labels: list[str], preds: torch.Tensor, gold: torch.Tensor) -> None:
    metrics["acc"].update(preds, gold)
    if "entities" in metrics:
        labelled = gold != IGNORE_INDEX
        metrics["entities"].update(word_tags(labels, preds, labelled), word_tags(labels, gold, labelled))


def compute_tagging_metrics(metrics: nn.ModuleDict) -> dict[str, torch.Tensor]:
    values = {"acc": metrics["acc"].compute()}
    if "entities" in metrics:
        values.update(metrics["entities"].compute())
    for metric in metrics.values():
        metric.reset()
    return values


def tagging_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the labelled positions (first sub-tokens; the rest are ``IGNORE_INDEX``)."""
    return nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
