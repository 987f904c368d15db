"""BART's five noising functions (Lewis et al. 2020 §2.2; Qiu et al. 2020 §3.1.4, DAE), composable.

Each takes token ids and an explicit ``random.Random`` and returns new lists; the decoder target
of a denoising auto-encoder is always the clean text.  ``word_shuffle`` is Liu et al.'s word-order
"sentence shuffling", kept distinct from document-level ``sentence_permutation`` (trap T8).
"""
from __future__ import annotations

import math
import random
from typing import Any, Callable, Collection, Optional, Sequence

from ptm_app.data.corruption.spans import Span, equilibrium_offset, whole_word_spans


def _count(rate: float, n: int) -> int:
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be in [0, 1], got {rate}")
    return min(n, math.ceil(rate * n - 1e-9))  # tolerance: 0.3 * 10 is 3.0000000000000004


def token_masking(ids: Sequence[int], rng: random.Random, *, rate: float, mask_token_id: int) -> list[int]:
    """Token masking (BART §2.2): ``ceil(rate * n)`` uniformly chosen tokens become ``[MASK]``."""
    out = list(ids)
    for i in rng.sample(range(len(ids)), _count(rate, len(ids))):
        out[i] = mask_token_id
    return out


def token_deletion(ids: Sequence[int], rng: random.Random, *, rate: float) -> list[int]:
    """Token deletion (BART §2.2): ``ceil(rate * n)`` uniformly chosen tokens are removed."""
    dropped = set(rng.sample(range(len(ids)), _count(rate, len(ids))))
    return [t for i, t in enumerate(ids) if i not in dropped]


def poisson(rng: random.Random, lam: float) -> int:
    """A Poisson(lam) draw by Knuth's multiplication method (fine for BART's small lambda)."""
    limit, k, product = math.exp(-lam), 0, rng.random()
    while product > limit:
        k += 1
        product *= rng.random()
    return k


def _poisson_tail(lam: float) -> Callable[[int], float]:
    """``d -> P(X > d)`` for X ~ Poisson(lam)."""

    def tail(d: int) -> float:
        term = cdf = math.exp(-lam)
        for k in range(1, d + 1):
            term *= lam / k
            cdf += term
        return max(0.0, 1.0 - cdf)

    return tail


def infilling_spans(
    n_tokens: int, rng: random.Random, *, rate: float = 0.3, poisson_lambda: float = 3.0
) -> list[Span]:
    """Spans for text infilling (BART §2.2), sorted, ``start == end`` meaning an inserted mask.

    Lengths ~ Poisson(lambda), drawn while the running total (started at an
    ``equilibrium_offset``) is below ``rate * n_tokens``, so the expected masked fraction is
    ``rate`` and the mean span length is lambda.  Spans are placed uniformly at random with at
    least one clean token between two spans (so every mask stands for exactly one span).
    """
    if poisson_lambda <= 0 or not 0.0 <= rate <= 1.0:
        raise ValueError("need poisson_lambda > 0 and 0 <= rate <= 1")
    budget = rate * n_tokens
    position = equilibrium_offset(rng, _poisson_tail(poisson_lambda), poisson_lambda)
    lengths: list[int] = []
    while position < budget:
        room = n_tokens - sum(lengths) - len(lengths)  # keep one separator per earlier span
        if room < 0:
            break
        lengths.append(min(poisson(rng, poisson_lambda), room))
        position += lengths[-1]
    rng.shuffle(lengths)
    k = len(lengths)
    extra = n_tokens - sum(lengths) - max(k - 1, 0)  # clean tokens beyond the separators
    cuts = sorted(rng.sample(range(extra + k), k))  # stars and bars: k + 1 gaps of >= 0 extras
    gaps = [b - a - 1 for a, b in zip([-1] + cuts, cuts + [extra + k])]
    spans, start = [], 0
    for i, length in enumerate(lengths):
        start += gaps[i] + (i > 0)
        spans.append((start, start + length))
        start += length
    return spans


def replace_spans(ids: Sequence[int], spans: Sequence[Span], *, mask_token_id: int) -> list[int]:
    """Replace each span by ONE mask token; an empty span ``(i, i)`` inserts a mask before ``ids[i]``."""
    out, position = [], 0
    for start, end in sorted(spans):
        if not position <= start <= end <= len(ids):
            raise ValueError(f"spans must not overlap and must lie inside the sequence: {(start, end)}")
        out += list(ids[position:start]) + [mask_token_id]
        position = end
    return out + list(ids[position:])


def word_to_token_spans(word_spans: Sequence[Span], words: Sequence[Span], n_tokens: int) -> list[Span]:
    """Spans over words → spans over their tokens (an empty word span ``(w, w)`` → the empty span at word w's first
    token, or at the end)."""
    start = lambda w: words[w][0] if w < len(words) else n_tokens  # noqa: E731
    return [(start(a), words[b - 1][1] if b > a else start(a)) for a, b in word_spans]


def text_infilling(
    ids: Sequence[int], rng: random.Random, *, rate: float = 0.3, poisson_lambda: float = 3.0, mask_token_id: int,
    continuation_ids: Optional[Collection[int]] = None,
) -> list[int]:
    """Text infilling (BART §2.2): Poisson(3) spans, each replaced by a single ``[MASK]``.

    With ``continuation_ids`` (the ids of word-internal pieces, WordPiece's ``##``) the spans and the rate count
    whole words, as mBART does (Liu et al. 2020 §2.2: "mask 35% of the words in each instance by random sampling
    a span length according to a Poisson distribution (λ = 3.5)")."""
    if continuation_ids is None:
        spans = infilling_spans(len(ids), rng, rate=rate, poisson_lambda=poisson_lambda)
    else:
        words = whole_word_spans([t not in continuation_ids for t in ids]) if ids else []
        spans = word_to_token_spans(infilling_spans(len(words), rng, rate=rate, poisson_lambda=poisson_lambda),
                                    words, len(ids))
    return replace_spans(ids, spans, mask_token_id=mask_token_id)


def split_sentences(ids: Sequence[int], full_stop_ids: set[int]) -> list[list[int]]:
    """Split after every full-stop id; trailing tokens without a full stop form the last sentence."""
    sentences, current = [], []
    for token in ids:
        current.append(token)
        if token in full_stop_ids:
            sentences.append(current)
            current = []
    return sentences + [current] if current else sentences


def sentence_permutation(sentences: Sequence[Sequence[int]], rng: random.Random) -> list[list[int]]:
    """Sentence permutation (BART §2.2): the document's sentences in a random order."""
    out = [list(sentence) for sentence in sentences]
    rng.shuffle(out)
    return out


def document_rotation(ids: Sequence[int], rng: random.Random) -> tuple[list[int], int]:
    """Document rotation (BART §2.2): rotate to start at a uniformly chosen token.

    Returns ``(rotated, offset)`` with ``rotated == ids[offset:] + ids[:offset]``.
    """
    offset = rng.randrange(len(ids)) if ids else 0
    return list(ids[offset:]) + list(ids[:offset]), offset


def word_shuffle(ids: Sequence[int], rng: random.Random, *, word_starts: Sequence[bool] | None = None) -> list[int]:
    """Liu et al. 2020 (Table 2) "sentence shuffling": shuffle the word order of a sentence.

    With ``word_starts`` the sub-tokens of a word move together.
    """
    if word_starts is not None and len(word_starts) != len(ids):
        raise ValueError(f"word_starts has {len(word_starts)} entries for {len(ids)} ids")
    words = whole_word_spans(word_starts) if word_starts is not None else [(i, i + 1) for i in range(len(ids))]
    rng.shuffle(words)
    return [ids[i] for start, end in words for i in range(start, end)]


def _permute_sentences(ids: Sequence[int], rng: random.Random, *, full_stop_ids: Sequence[int]) -> list[int]:
    return [t for sentence in sentence_permutation(split_sentences(ids, set(full_stop_ids)), rng) for t in sentence]


NOISES: dict[str, Callable[..., list[int]]] = {
    "token_masking": token_masking,
    "token_deletion": token_deletion,
    "text_infilling": text_infilling,
    "sentence_permutation": _permute_sentences,
    "document_rotation": lambda ids, rng: document_rotation(ids, rng)[0],
    "word_shuffle": word_shuffle,
}


def compose(ids: Sequence[int], rng: random.Random, steps: Sequence[tuple[str, dict[str, Any]]]) -> list[int]:
    """Apply named noises in order, e.g. BART's best pair (Lewis et al. 2020 §5.1)::

        compose(ids, rng, [("sentence_permutation", {"full_stop_ids": [5]}),
                           ("text_infilling", {"rate": 0.3, "mask_token_id": 4})])

    Names are the keys of ``NOISES``; ``sentence_permutation`` takes ``full_stop_ids``.
    """
    out = list(ids)
    for name, kwargs in steps:
        if name not in NOISES:
            raise ValueError(f"unknown noise {name!r}; choose from {sorted(NOISES)}")
        out = NOISES[name](out, rng, **kwargs)
    return out
