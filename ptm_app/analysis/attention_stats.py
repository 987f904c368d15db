"""What attention heads look at (Clark et al. 2019, "What Does BERT Look At?", §3), as pure functions on one
sentence's attention maps ``[H, T, T]`` (row i: query token i's distribution over the keys):

- entropy of a head: the mean over queries of -sum_j a_ij log a_ij (§3.3; broad heads high, focused heads low);
- attention to special tokens: the mean over queries of the weight on [CLS], on [SEP], and on punctuation
  (§3.1, Figure 2);
- mean attended distance: the mean over queries of sum_j a_ij |i - j| (how far a head looks);
- word relations (§4): token attention made word-level (attention *to* a word = the sum over its tokens, *from* a
  word = the mean over its tokens, special tokens left out, §4.1); a head's prediction for a word is the word it
  attends to most, scored against a target word: the previous / next word, and, from Brown's universal POS tags,
  the noun a determiner, an adposition or an adjective goes with (the first NOUN after it: Clark et al.'s ``det``,
  ``pobj`` and ``amod`` relations approximated without a parser).  The baseline is the best fixed offset (§4.2).

``sentence_sums`` returns sums over the queries (and their count) so that sentences of different lengths
average token-weighted, as Clark et al. average over tokens.
"""
from __future__ import annotations

import string
import unicodedata

import torch

MEASURES = ("entropy", "to_cls", "to_sep", "to_punct", "distance")
RELATIONS = ("prev_word", "next_word", "det_noun", "adp_noun", "adj_noun")
NOUN_OF = {"det_noun": "DET", "adp_noun": "ADP", "adj_noun": "ADJ"}
OFFSETS = tuple(k for k in range(-5, 6) if k)


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


def word_attention(attention: torch.Tensor, words: list[int], n_words: int) -> torch.Tensor:
    """Word-level maps [H, W, W] from token maps [H, T, T] and each token's word (-1: left out): to a word = sum over
    its tokens, from a word = mean over its tokens (Clark et al. §4.1)."""
    owner = torch.tensor(words)
    member = torch.zeros(len(words), n_words, dtype=torch.float64)
    kept = owner >= 0
    member[kept.nonzero().squeeze(-1), owner[kept]] = 1.0
    to_words = attention.double() @ member  # [H, T, W]
    counts = member.sum(0).clamp(min=1)
    return (member.T @ to_words) / counts[None, :, None]


def relation_targets(tags: list[str]) -> dict[str, list[int]]:
    """Per relation, each word's target word index or -1 (no target): ``prev_word``, ``next_word``, and for DET /
    ADP / ADJ words the first NOUN after them (``det_noun``, ``adp_noun``, ``adj_noun``)."""
    n = len(tags)
    targets = {"prev_word": [i - 1 for i in range(n)], "next_word": [i + 1 if i + 1 < n else -1 for i in range(n)]}
    for name, pos in NOUN_OF.items():
        targets[name] = [next((j for j in range(i + 1, n) if tags[j] == "NOUN"), -1) if tag == pos else -1
                         for i, tag in enumerate(tags)]
    return targets


def relation_sums(word_maps: torch.Tensor, tags: list[str]) -> dict[str, torch.Tensor]:
    """Per relation: ``{name}`` [H] how many words' most-attended word is their target, ``{name}_count`` the words
    that have one, ``{name}_offset`` [len(OFFSETS)] how many targets sit at each fixed offset (the baseline)."""
    heads, n, _ = word_maps.shape
    predicted = word_maps.argmax(-1)  # [H, W]
    sums = {}
    for name, target in relation_targets(tags[:n]).items():
        pairs = [(i, t) for i, t in enumerate(target) if 0 <= t < n]
        if pairs:
            words, wanted = torch.tensor([i for i, _ in pairs]), torch.tensor([t for _, t in pairs])
            sums[name] = (predicted[:, words] == wanted).sum(-1).double()
        else:
            sums[name] = torch.zeros(heads, dtype=torch.float64)
        sums[f"{name}_count"] = torch.tensor(float(len(pairs)), dtype=torch.float64)
        sums[f"{name}_offset"] = torch.tensor([float(sum(t - i == k for i, t in pairs)) for k in OFFSETS],
                                              dtype=torch.float64)
    return sums


def relation_shares(total: dict) -> dict[str, dict]:
    """From accumulated ``relation_sums``: per relation the share per head ([H], None without cases), the number of
    cases, and the best fixed offset with its share (Clark et al.'s baseline)."""
    out = {}
    for name in RELATIONS:
        count = float(total[f"{name}_count"])
        offsets = total[f"{name}_offset"]
        best = int(offsets.argmax())
        out[name] = {"heads": total[name] / count if count else None, "count": int(count),
                     "baseline_offset": OFFSETS[best], "baseline": float(offsets[best]) / count if count else None}
    return out
