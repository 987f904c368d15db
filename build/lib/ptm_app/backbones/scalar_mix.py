"""ELMo's scalar mix (Peters et al. 2018 §3.2, eq. 1): ``γ Σ_j s_j h_j`` with softmax-normalised s_j.

ELMo sums the L+1 layers including layer 0 (the token embedding; Liu et al. 2020 eq. 2); Qiu et al.
2020 eq. 6 sums only layers 1..L (survey trap T7), hence ``include_layer0``.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn


class ScalarMix(nn.Module):
    """Task-specific weighted sum of a backbone's layer states.

    Args:
        num_layers: how many layer states ``forward`` receives (``len(hidden_states)`` = L+1, layer 0 first).
        include_layer0: mix layer 0 (the embeddings) too; otherwise it is dropped and L weights remain.
        do_layer_norm: normalise each layer's states (over its unmasked positions) before weighting (§3.2).
    """

    def __init__(self, num_layers: int, include_layer0: bool = True, do_layer_norm: bool = False):
        super().__init__()
        if num_layers < (1 if include_layer0 else 2):
            raise ValueError(f"ScalarMix needs at least one layer to mix (num_layers={num_layers})")
        self.num_layers, self.include_layer0, self.do_layer_norm = num_layers, include_layer0, do_layer_norm
        self.weights = nn.Parameter(torch.zeros(num_layers if include_layer0 else num_layers - 1))  # s_j = softmax
        self.gamma = nn.Parameter(torch.ones(()))

    def layer_weights(self) -> torch.Tensor:
        """The normalised s_j (they sum to 1)."""
        return torch.softmax(self.weights, dim=0)

    def forward(self, layers: Sequence[torch.Tensor], mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``layers``: ``num_layers`` tensors [B, T, D]; ``mask`` [B, T] (1 = real token) for the layer norm."""
        if len(layers) != self.num_layers:
            raise ValueError(f"ScalarMix built for {self.num_layers} layers got {len(layers)}")
        if not self.include_layer0:
            layers = layers[1:]
        if self.do_layer_norm:
            keep = torch.ones(layers[0].shape[:2], device=layers[0].device) if mask is None else mask.float()
            layers = [_masked_layer_norm(h, keep) for h in layers]
        s = self.layer_weights()
        return self.gamma * sum(w * h for w, h in zip(s, layers))


def _masked_layer_norm(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(h − mean) / std with the statistics over all unmasked positions and features of the batch."""
    m = mask.unsqueeze(-1).to(h.dtype)
    n = (m.sum() * h.size(-1)).clamp(min=1)
    mean = (h * m).sum() / n
    var = (((h - mean) * m) ** 2).sum() / n
    return (h - mean) / torch.sqrt(var + 1e-12)
