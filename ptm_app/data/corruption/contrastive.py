"""InfoWord / Deep InfoMax for text (Kong et al. 2020; Qiu et al. 2020 §3.1.5 and fn. 2).

The model scores a masked context ``x̂_{i:j}`` against the true n-gram ``x_{i:j}`` and negative
n-grams; n ~ N(5, 1) rounded and clipped to [1, 10].  The survey prints the DIM loss without
``exp`` (trap T4); ``info_nce`` is the correct InfoNCE / log-softmax form.
"""
from __future__ import annotations

import random
from typing import Sequence

import torch

from ptm_app.data.corruption.spans import Span


def ngram_span(
    n_tokens: int, rng: random.Random, *, mean: float = 5.0, std: float = 1.0, low: int = 1, high: int = 10
) -> Span:
    """A uniformly placed n-gram ``(start, end)`` with n = round(N(mean, std)) clipped to
    ``[low, high]`` and to the sequence length."""
    if n_tokens < 1 or not 1 <= low <= high:
        raise ValueError("need n_tokens >= 1 and 1 <= low <= high")
    n = min(max(round(rng.gauss(mean, std)), low), high, n_tokens)
    start = rng.randrange(n_tokens - n + 1)
    return start, start + n


def mask_ngram(ids: Sequence[int], start: int, end: int, *, mask_token_id: int) -> list[int]:
    """The masked context ``x̂_{i:j}``: one ``[MASK]`` per token of ``ids[start:end]``."""
    if not 0 <= start <= end <= len(ids):
        raise ValueError(f"n-gram {(start, end)} outside a sequence of {len(ids)} tokens")
    return list(ids[:start]) + [mask_token_id] * (end - start) + list(ids[end:])


def info_nce(scores: torch.Tensor) -> torch.Tensor:
    """Mean InfoNCE loss ``-(s_ii - logsumexp_j s_ij)`` for a ``(batch, candidates)`` score matrix.

    Row i scores context i against every candidate; the positive is candidate i (the diagonal),
    the other columns (in-batch and any extra negatives appended after column ``batch``) are
    negatives.  Equal to ``F.cross_entropy(scores, arange(batch))``.
    """
    if scores.dim() != 2 or scores.size(1) < scores.size(0):
        raise ValueError(f"scores must be (batch, candidates >= batch), got {tuple(scores.shape)}")
    positives = scores.diagonal()
    return (torch.logsumexp(scores, dim=1) - positives).mean()
