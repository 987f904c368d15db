"""How contextual a layer's word representations are (Ethayarajh 2019, "How Contextual are Contextualized Word
Representations?", §3.2–3.3 and §4), as pure functions on one layer's vectors.

- self-similarity of a word: the mean cosine between its representations in different occurrences (eq. 1);
- intra-sentence similarity: the mean cosine between each word of a sentence and the sentence's mean vector
  (eq. 2);
- maximum explainable variance (MEV) of a word: the share of the variance of its occurrence matrix that its first
  principal component explains, sigma_1^2 / sum_i sigma_i^2 (eq. 3, the singular values of the uncentred matrix);
- anisotropy: the mean cosine between representations of randomly drawn words (§3.4); the baselines for the
  anisotropy-adjusted measures are this mean cosine (for self- and intra-sentence similarity) and the MEV of
  random sets of representations (for MEV).
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F


def mean_pairwise_cosine(vectors: torch.Tensor) -> float:
    """Mean cosine over the distinct pairs of the rows of ``vectors`` [n >= 2, D]."""
    unit = F.normalize(vectors.double(), dim=-1)
    n = unit.size(0)
    total = (unit.sum(0) @ unit.sum(0)) - (unit * unit).sum()
    return float(total / (n * (n - 1)))


def self_similarity(occurrences: Sequence[torch.Tensor]) -> float:
    """Mean over words of the mean pairwise cosine of each word's occurrences [n_w >= 2, D]."""
    return float(sum(mean_pairwise_cosine(o) for o in occurrences) / len(occurrences))


def intra_sentence_similarity(sentences: Sequence[torch.Tensor]) -> float:
    """Mean over sentences [n_s, D] of the mean cosine between each word and the sentence's mean vector."""
    values = [F.cosine_similarity(s.double(), s.double().mean(0, keepdim=True), dim=-1).mean() for s in sentences]
    return float(sum(values) / len(values))


def explainable_variance(occurrences: torch.Tensor) -> float:
    """sigma_1^2 / sum_i sigma_i^2 of the occurrence matrix [n, D]."""
    singular = torch.linalg.svdvals(occurrences.double())
    energy = singular ** 2
    return float(energy[0] / energy.sum().clamp(min=1e-300))


def max_explainable_variance(occurrences: Sequence[torch.Tensor]) -> float:
    """Mean over words of their MEV."""
    return float(sum(explainable_variance(o) for o in occurrences) / len(occurrences))


def random_pairs(count: int, pairs: int, generator: torch.Generator, groups: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``pairs`` index pairs (i, j), i != j, drawn uniformly from ``count`` rows; with ``groups`` (a sentence id
    per row) the two rows come from different sentences (random words in different contexts)."""
    first = torch.randint(0, count, (pairs * 3,), generator=generator)
    second = torch.randint(0, count, (pairs * 3,), generator=generator)
    keep = first != second
    if groups is not None:
        keep &= groups[first] != groups[second]
    first, second = first[keep][:pairs], second[keep][:pairs]
    return first, second


def anisotropy(vectors: torch.Tensor, first: torch.Tensor, second: torch.Tensor) -> float:
    """Mean cosine between the rows ``first`` and ``second`` of ``vectors`` (random word pairs)."""
    if len(first) == 0:
        return float("nan")
    return float(F.cosine_similarity(vectors[first].double(), vectors[second].double(), dim=-1).mean())


def random_sets_mev(vectors: torch.Tensor, sizes: Sequence[int], generator: torch.Generator) -> float:
    """The MEV baseline: the mean MEV of random sets of rows, one set of each size in ``sizes``."""
    values = [explainable_variance(vectors[torch.randperm(len(vectors), generator=generator)[:n]]) for n in sizes]
    return float(sum(values) / len(values))
