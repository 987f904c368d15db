"""What attention heads look at (Clark et al. 2019, "What Does BERT Look At?", §3), as pure functions on one
sentence's attention maps ``[H, T, T]`` (row i: query token i's distribution over the keys):

- entropy of a head: the mean over queries of -sum_j a_ij log a_ij (§3.3; broad heads high, focused heads low);
- attention to special tokens: the mean over queries of the weight on [CLS], on [SEP], and on punctuation
  (§3.1, Figure 2);
- mean attended distance: the mean over queries of sum_j a_ij |i - j| (how far a head looks).

``sentence_sums`` returns sums over the queries (and their count) so that sentences of different lengths
average token-weighted, as Clark et al. average over tokens.
"""
from __future__ import annotations

import string
import unicodedata

import torch

MEASURES = ("entropy", "to_cls", "to_sep", "to_punct", "distance")


def is_punctuation(token: str) -> bool:
    """A sub-token that is punctuation only, once word-piece / byte-level markers are stripped."""
    text = token.replace("##", "").replace("\u0120", "").replace("\u2581", "").strip()
    return bool(text) and all(c in string.punctuation or unicodedata.category(c).startswith("P") for c in text)


def sentence_sums(attention: torch.Tensor, targets: dict[str, torch.Tensor | None]) -> dict[str, torch.Tensor]:
    """Per-head sums over the T query tokens of one sentence's ``attention`` [H, T, T] (no padding).

    ``targets`` maps ``to_cls`` / ``to_sep`` / ``to_punct`` to a boolean key mask [T] (None when the tokenizer has
    no such token); returns ``{measure: [H]}`` sums and ``count`` (the number of queries)."""
    att = attention.double()
    heads, length, _ = att.shape
    entropy = -(att * torch.log(att.clamp(min=1e-30))).sum(-1)  # [H, T]
    positions = torch.arange(length, dtype=torch.float64)
    distance = (att * (positions[:, None] - positions[None, :]).abs()).sum(-1)
    sums = {"entropy": entropy.sum(-1), "distance": distance.sum(-1)}
    for name, mask in targets.items():
        sums[name] = att[:, :, mask].sum(-1).sum(-1) if mask is not None else None
    sums["count"] = torch.tensor(float(length), dtype=torch.float64)
    return sums


def add_sums(total: dict | None, sums: dict) -> dict:
    """Accumulate ``sentence_sums`` over sentences."""
    if total is None:
        return {k: (v.clone() if v is not None else None) for k, v in sums.items()}
    for k, v in sums.items():
        if v is not None:
            total[k] += v
    return total


def means(total: dict) -> dict[str, torch.Tensor | None]:
    """Token-weighted means per head from accumulated sums."""
    count = total["count"]
    return {k: (v / count if v is not None else None) for k, v in total.items() if k != "count"}
