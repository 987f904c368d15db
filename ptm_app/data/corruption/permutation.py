"""XLNet permutation-LM inputs (Yang et al. 2019 §2.2–2.3).

A factorisation order ``z`` is sampled and only the last tokens of ``z`` are predicted (partial
prediction, Yang et al. eq. 5): ``max E_z log p(x_{z>c} | x_{z<=c})``.  As in XLNet's data pipeline
(and HF ``DataCollatorForPermutationLanguageModeling``), the targets are spans: span length
~ U[1, max_span_length], one span per context block of ``span_length / plm_probability`` tokens.

The order puts every non-target ("context": the conditioning set ``x_{z<=c}``, special tokens included)
before every target, and the targets in a uniformly random order.  Context tokens are mutually
visible (XLNet's ``_local_perm`` gives them all the smallest index; their internal order is irrelevant
because they are never predicted) and never see a target.  A target sees the context and the targets
earlier in ``z``, never itself.  Inputs and positions are untouched: XLNet's relative positions
follow the natural order, the permutation lives only in ``perm_mask``.

Output for ``XLNetLMHeadModel(input_ids=..., attention_mask=..., perm_mask=..., target_mapping=..., labels=...)``:
``perm_mask`` [B, L, L] (1 = query ``i`` may NOT attend to ``j``; padding keys are also 1),
``target_mapping`` [B, K, L] one-hot rows selecting the targets in natural order and ``labels`` [B, K]
(``IGNORE_INDEX`` for unused rows), with K = the largest number of targets in the batch (at least 1).
transformers 5.23 ``XLNetLMHeadModel.forward`` returns logits [B, K, V] and flattens them against
``labels``, so labels must be [B, num_predict], not [B, L].  The query stream (``target_mapping``) uses
``perm_mask`` as-is, so ``perm_mask[i, i] = 1`` is what keeps a target from seeing its own token; the
content stream drops the diagonal itself.

Unlike HF's collator, no even sequence length is required: HF permutes two halves with the same
permutation to mimic XLNet's ``reuse_len`` layout for memory reuse across segments.  Here the whole
sequence is permuted, which is leak-free when no memory is carried between batches
(``use_mems_train=False``, the transformers default).  Targets keep their original ids in
``input_ids`` (no ``<mask>`` substitution): the two-stream attention alone prevents leakage.
"""
from __future__ import annotations

import torch

from ptm_app.data import IGNORE_INDEX


def _span_targets(
    batch: int, length: int, generator: torch.Generator, plm_probability: float, max_span_length: int
) -> torch.Tensor:
    """Bool [B, L]: one span of U[1, max_span_length] tokens per context block of span/plm_probability."""
    positions = torch.arange(length)
    selected = torch.zeros(batch, length, dtype=torch.bool)
    cursor = torch.zeros(batch, dtype=torch.long)
    while bool((cursor < length).any()):
        span = torch.randint(1, max_span_length + 1, (batch,), generator=generator)
        context = torch.maximum(span, (span.double() / plm_probability).long())
        offset = (torch.rand(batch, generator=generator, dtype=torch.float64) * (context - span + 1)).long()
        start = cursor + offset
        selected |= (positions >= start[:, None]) & (positions < (start + span)[:, None])
        cursor = cursor + context
    return selected


def plm_inputs(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    generator: torch.Generator,
    *,
    plm_probability: float = 1 / 6,
    max_span_length: int = 5,
    special_mask: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Return ``perm_mask`` [B, L, L], ``target_mapping`` [B, K, L] (float) and ``labels`` [B, K] (long).

    ``attention_mask`` is 1 at real tokens (None = no padding); ``special_mask`` is True at special
    tokens (``<sep>``, ``<cls>``), which are never targets but stay visible as context.
    """
    if not 0.0 < plm_probability <= 1.0 or max_span_length < 1:
        raise ValueError("need 0 < plm_probability <= 1 and max_span_length >= 1")
    batch, length = input_ids.shape
    device = input_ids.device
    valid = torch.ones(batch, length, dtype=torch.bool) if attention_mask is None else attention_mask.bool().cpu()
    maskable = valid if special_mask is None else valid & ~special_mask.bool().cpu()
    targets = _span_targets(batch, length, generator, plm_probability, max_span_length) & maskable

    # Factorisation order: context first (rank -1, mutually visible), then the targets in a random order.
    order = torch.rand(batch, length, generator=generator).argsort(dim=1).argsort(dim=1)
    rank = torch.where(targets, order, torch.full_like(order, -1))
    hidden_target = targets[:, None, :] & (rank[:, :, None] <= rank[:, None, :])
    perm_mask = hidden_target | ~valid[:, None, :]

    counts = targets.sum(dim=1)
    num_predict = max(1, int(counts.max()))
    slots = torch.sort((~targets).int(), dim=1, stable=True).indices[:, :num_predict]  # target positions first
    used = torch.arange(num_predict)[None, :] < counts[:, None]
    target_mapping = torch.zeros(batch, num_predict, length)
    target_mapping.scatter_(2, slots[:, :, None], used[:, :, None].float())
    labels = torch.where(used, input_ids.cpu().gather(1, slots), torch.full_like(slots, IGNORE_INDEX))
    return {
        "perm_mask": perm_mask.float().to(device),
        "target_mapping": target_mapping.to(device),
        "labels": labels.to(device),
    }
