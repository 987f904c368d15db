"""Replaced token detection (ELECTRA, Clark et al. 2020 §2; Qiu et al. 2020 §3.1.5).

Label convention (trap T5): 1 = replaced, 0 = original, as HF ``ElectraForPreTraining`` expects.
The survey's ``y_t = 1(x̂_t = x_t)`` is the opposite (1 = original).  A generator sample equal
to the original token counts as original (ELECTRA §2).  Padding gets ``IGNORE_INDEX``.
"""
from __future__ import annotations

from typing import Optional

import torch

from ptm_app.data import IGNORE_INDEX


def rtd_labels(original: torch.Tensor, corrupted: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Discriminator labels: 1 where ``corrupted != original``, 0 elsewhere, ``IGNORE_INDEX`` at padding."""
    labels = (corrupted != original).long()
    return labels.masked_fill(attention_mask == 0, IGNORE_INDEX)


@torch.no_grad()
def sample_replacements(
    logits: torch.Tensor, masked: Optional[torch.Tensor], generator: Optional[torch.Generator],
    temperature: float = 1.0
) -> torch.Tensor:
    """Sample the generator's softmax at the masked positions (ELECTRA §2), without gradient.

    ``logits`` is ``(..., vocab)`` and ``masked`` a bool tensor of the leading shape (None: every row
    of ``(n, vocab)`` logits already taken at the masked positions); returns the sampled ids in
    ``masked``'s row-major order, so ``corrupted[masked] = sample_replacements(...)``.
    ``generator`` must live on ``logits``' device (``draw_generator(..., device=logits.device)``).
    """
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    rows = logits if masked is None else logits[masked]
    probs = torch.softmax(rows.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
