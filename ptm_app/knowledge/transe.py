"""TransE scores and KEPLER's knowledge-embedding loss (Wang et al. 2021, TACL §2.2; Bordes et al. 2013).

An entity is the encoder's [CLS] vector of its description, a relation a learned vector r; a triple (h, r, t) is
plausible when ``d(h, t) = ||h + r - t||_p`` is small.  KEPLER's loss with negative sampling (eq. 3):

    L = -log σ(γ - d(h, t)) - Σ_i (1/n) log σ(d(h'_i, t'_i) - γ)

over n negatives (h'_i, r, t'_i), each the positive with its head or its tail replaced by a random entity.
"""
from __future__ import annotations

import torch
from torch.nn import functional as F


def transe_distance(head: torch.Tensor, relation: torch.Tensor, tail: torch.Tensor, p: int = 1) -> torch.Tensor:
    """``||h + r - t||_p`` over the last dimension (broadcasting: one positive against n negatives)."""
    return torch.linalg.vector_norm(head + relation - tail, ord=p, dim=-1)


def ke_loss(positive: torch.Tensor, negative: torch.Tensor, gamma: float) -> torch.Tensor:
    """KEPLER's loss, batch mean: ``positive`` distances [B], ``negative`` distances [B, n]."""
    return (-F.logsigmoid(gamma - positive) - F.logsigmoid(negative - gamma).mean(-1)).mean()
