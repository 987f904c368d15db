"""Small target heads that sit on a backbone's hidden states (UER-style targets, DESIGN principle 2).

Each head returns logits; the objective module owns the loss and its weight.
"""
from __future__ import annotations

import torch
from torch import nn


class SentenceRelationHead(nn.Module):
    """NSP (BERT, Devlin et al. 2019 §3.1 task 2) / SOP (ALBERT, Lan et al. 2020 §4.1):
    a tanh pooler on the [CLS] state, then a 2-way classifier."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.pooler = nn.Linear(hidden_size, hidden_size)
        self.classifier = nn.Linear(hidden_size, 2)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.tanh(self.pooler(hidden[:, 0])))


class SpanBoundaryHead(nn.Module):
    """SpanBERT's span boundary objective (Joshi et al. 2020 §3.2):
    ``y_i = f(x_{s-1}, x_{e+1}, p_{i-s+1})``, a 2-layer GeLU + LayerNorm FFN; the output
    projection is the (tied) MLM decoder matrix passed in at call time."""

    def __init__(self, hidden_size: int, max_span_length: int = 10):
        super().__init__()
        self.positions = nn.Embedding(max_span_length, hidden_size)
        self.ffn = nn.Sequential(
            nn.Linear(3 * hidden_size, hidden_size), nn.GELU(), nn.LayerNorm(hidden_size),
            nn.Linear(hidden_size, hidden_size), nn.GELU(), nn.LayerNorm(hidden_size),
        )

    def forward(self, hidden: torch.Tensor, rows: torch.Tensor, left: torch.Tensor, right: torch.Tensor,
                offset: torch.Tensor, decoder: torch.Tensor) -> torch.Tensor:
        pos = self.positions(offset.clamp(max=self.positions.num_embeddings - 1))
        h = self.ffn(torch.cat([hidden[rows, left], hidden[rows, right], pos], dim=-1))
        return h @ decoder.t()
