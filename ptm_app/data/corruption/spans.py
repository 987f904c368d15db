"""Word- and span-level masking on token-id lists.

* Whole-word masking (Google BERT's 2019 "Whole Word Masking" models; Cui et al. 2019): every
  sub-token of a selected word is selected, so no word is ever partially masked.
* SpanBERT (Joshi et al. 2020): contiguous spans with geometric lengths (§3.1), the 80/10/10
  decision taken once per span (§3.1), and Span Boundary Objective targets (§3.2).

Spans are ``(start, end)`` token positions, end exclusive.  Labels hold the original id at
selected positions and ``IGNORE_INDEX`` elsewhere.
"""
from __future__ import annotations

import math
import random
from typing import Callable, Optional, Sequence

from ptm_app.data import IGNORE_INDEX

Span = tuple[int, int]


def word_starts_from_tokens(tokens: Sequence[str]) -> list[bool]:
    """WordPiece convention: a sub-token starts a word unless it begins with ``##``.

    Position 0 always starts a word (a window may begin inside one).
    """
    return [i == 0 or not token.startswith("##") for i, token in enumerate(tokens)]


def whole_word_spans(word_starts: Sequence[bool]) -> list[Span]:
    """Token spans of the words described by a "this sub-token starts a word" mask."""
    starts = [i for i, is_start in enumerate(word_starts) if is_start or i == 0]
    return list(zip(starts, starts[1:] + [len(word_starts)]))


def _check_ratios(mask_ratio: float, random_ratio: float) -> None:
    if mask_ratio < 0 or random_ratio < 0 or mask_ratio + random_ratio > 1.0 + 1e-9:
        raise ValueError("need mask_ratio, random_ratio >= 0 and mask_ratio + random_ratio <= 1")


def _replacement(rng: random.Random, vocab_size: int, random_ids: Sequence[int] | None) -> int:
    return rng.choice(random_ids) if random_ids is not None else rng.randrange(vocab_size)


def whole_word_mask(
    ids: Sequence[int],
    word_starts: Sequence[bool],
    rng: random.Random,
    *,
    mask_token_id: int,
    vocab_size: int,
    rate: float = 0.15,
    mask_ratio: float = 0.8,
    random_ratio: float = 0.1,
    random_ids: Sequence[int] | None = None,
) -> tuple[list[int], list[int]]:
    """Whole-word masking (BERT-wwm; Cui et al. 2019), as Google's ``create_pretraining_data``.

    Words are visited in random order and selected while they fit in the budget of
    ``max(1, round(rate * len(ids)))`` tokens (a word that would overflow it is skipped), then each
    selected token gets BERT's 80 % ``[MASK]`` / 10 % random / 10 % unchanged (Devlin et al. 2019
    §3.1).  ``random_ids`` optionally restricts random replacements (default: ``range(vocab_size)``).
    """
    if len(word_starts) != len(ids):
        raise ValueError(f"word_starts has {len(word_starts)} entries for {len(ids)} ids")
    return unit_mask(ids, whole_word_spans(word_starts), rng, mask_token_id=mask_token_id, vocab_size=vocab_size,
                     rate=rate, mask_ratio=mask_ratio, random_ratio=random_ratio, random_ids=random_ids)


def unit_mask(ids: Sequence[int], units: Sequence[Span], rng: random.Random, *, mask_token_id: int,
              vocab_size: int, rate: float = 0.15, mask_ratio: float = 0.8, random_ratio: float = 0.1,
              random_ids: Sequence[int] | None = None) -> tuple[list[int], list[int]]:
    """Whole-unit masking: ``units`` (token spans: words, or ERNIE's phrases and entities) are visited in random
    order and selected while they fit in ``max(1, round(rate * len(ids)))`` tokens, then each selected token gets
    80 % ``[MASK]`` / 10 % random / 10 % unchanged; returns ``(corrupted, labels)``."""
    _check_ratios(mask_ratio, random_ratio)
    order = list(units)
    rng.shuffle(order)
    budget = max(1, round(rate * len(ids))) if rate > 0 and ids else 0
    selected: list[int] = []
    for start, end in order:
        if len(selected) + end - start <= budget:
            selected.extend(range(start, end))
    corrupted, labels = list(ids), [IGNORE_INDEX] * len(ids)
    for i in sorted(selected):
        labels[i] = ids[i]
        action = rng.random()
        if action < mask_ratio:
            corrupted[i] = mask_token_id
        elif action < mask_ratio + random_ratio:
            corrupted[i] = _replacement(rng, vocab_size, random_ids)
    return corrupted, labels


def _span_length(rng: random.Random, p: float, max_len: int) -> int:
    """Geometric(p) on {1, 2, ...} restricted to ``<= max_len`` and renormalised (inverse CDF).

    This is SpanBERT's distribution (the paper's "clipped at 10" with mean 3.8 for p = 0.2).
    """
    if p >= 1.0:
        return 1
    q = 1.0 - p
    u = rng.random() * (1.0 - q**max_len)
    return min(max_len, 1 + int(math.log1p(-u) / math.log(q)))


def _geometric_tail(p: float, max_len: int) -> Callable[[int], float]:
    """``d -> P(length > d)`` for ``_span_length``."""
    if p >= 1.0:
        return lambda d: float(d < 1)
    q = 1.0 - p
    return lambda d: max(0.0, (q**d - q**max_len) / (1.0 - q**max_len))


def equilibrium_offset(rng: random.Random, tail: Callable[[int], float], mean: float) -> float:
    """Random phase of a stationary renewal process with integer lengths (P(D = d) = P(L > d) / E[L]).

    Budgeted span samplers start their running total at this offset and add a span while the total
    is below the budget: whether a span is added is decided before its length is drawn, so span
    lengths keep their distribution (Wald) and the expected coverage equals the budget exactly.
    """
    u, d = rng.random() * mean, 0
    while u >= tail(d) > 0.0:
        u -= tail(d)
        d += 1
    return d + rng.random()


def _place(free: list[Span], size: int, n_words: int, rng: random.Random) -> Span | None:
    """A uniformly drawn start for ``size`` free words, or a shorter span when none fits.

    Spans keep at least one unmasked word between them so SBO boundaries are visible tokens.
    """
    for length in range(size, 0, -1):
        ranges = []
        for a, b in free:
            first = a + (a > 0)
            last = b - (b < n_words) - length
            if last >= first:
                ranges.append((first, last - first + 1))
        k = rng.randrange(sum(count for _, count in ranges)) if ranges else -1
        for first, count in ranges:
            if k < count:
                return first + k, first + k + length
            k -= count
    return None


def geometric_spans(
    n_tokens: int,
    rng: random.Random,
    *,
    rate: float = 0.15,
    p: float = 0.2,
    max_len: int = 10,
    word_starts: Sequence[bool] | None = None,
) -> list[Span]:
    """SpanBERT span selection (Joshi et al. 2020 §3.1), returned sorted by start.

    Span lengths are counted in words (whole words when ``word_starts`` is given, else tokens) and
    drawn from Geometric(p) truncated to ``max_len``; each span starts at a word start at a
    uniformly drawn free position, spans never overlap nor touch.  Spans are added while the
    running total (started at an ``equilibrium_offset``) is below ``rate * n_tokens``: the
    masked fraction equals ``rate`` in expectation, span lengths keep their distribution, and the
    budget is never exceeded by a whole span.
    """
    if not 0.0 < p <= 1.0 or max_len < 1:
        raise ValueError("need 0 < p <= 1 and max_len >= 1")
    if word_starts is not None and len(word_starts) != n_tokens:
        raise ValueError(f"word_starts has {len(word_starts)} entries for {n_tokens} tokens")
    words = whole_word_spans(word_starts) if word_starts is not None else [(i, i + 1) for i in range(n_tokens)]
    budget = rate * n_tokens
    tail = _geometric_tail(p, max_len)
    tokens_per_word = n_tokens / max(len(words), 1)  # the offset is drawn in words
    position = equilibrium_offset(rng, tail, sum(map(tail, range(max_len)))) * tokens_per_word
    free, spans = [(0, len(words))], []
    while position < budget:
        placed = _place(free, _span_length(rng, p, max_len), len(words), rng)
        if placed is None:
            break
        first, last = placed
        run = next(r for r in free if r[0] <= first < r[1])
        free.remove(run)
        free.extend(r for r in ((run[0], first), (last, run[1])) if r[1] > r[0])
        spans.append((words[first][0], words[last - 1][1]))
        position += spans[-1][1] - spans[-1][0]
    return sorted(spans)


def span_mask(
    ids: Sequence[int],
    spans: Sequence[Span],
    rng: random.Random,
    *,
    mask_token_id: int,
    vocab_size: int,
    mask_ratio: float = 0.8,
    random_ratio: float = 0.1,
    random_ids: Sequence[int] | None = None,
) -> tuple[list[int], list[int]]:
    """Apply SpanBERT's 80/10/10 once per span (Joshi et al. 2020 §3.1): a whole span becomes
    ``[MASK]``, random tokens (drawn per token), or stays unchanged."""
    _check_ratios(mask_ratio, random_ratio)
    corrupted, labels = list(ids), [IGNORE_INDEX] * len(ids)
    for start, end in spans:
        if not 0 <= start <= end <= len(ids):
            raise ValueError(f"span {(start, end)} outside a sequence of {len(ids)} tokens")
        action = rng.random()
        for i in range(start, end):
            labels[i] = ids[i]
            if action < mask_ratio:
                corrupted[i] = mask_token_id
            elif action < mask_ratio + random_ratio:
                corrupted[i] = _replacement(rng, vocab_size, random_ids)
    return corrupted, labels


def sbo_targets(spans: Sequence[Span], length: int,
                positions: Optional[Sequence[int]] = None) -> tuple[list[int], list[int], list[int], list[int]]:
    """Span Boundary Objective inputs (Joshi et al. 2020 §3.2), one entry per masked position:
    ``(left boundary, right boundary, 0-based offset within the span, position)``.

    ``spans`` index the maskable tokens; ``positions`` maps them to their places in the row (special tokens and
    padding skipped; default: the identity), whose ``length`` the boundaries are clipped to.  The boundaries are
    the row tokens just outside the span (a prepended [CLS] is the left boundary of a span at the start).
    Entries follow the spans in ascending order, i.e. the order of ``[i for i, y in enumerate(labels) if y != -100]``.
    """
    at = list(range(length)) if positions is None else [int(p) for p in positions]
    left, right, relative, where = [], [], [], []
    for start, end in sorted(spans):
        first, last = at[start], at[end - 1]
        for i in range(start, end):
            left.append(max(first - 1, 0))
            right.append(min(last + 1, length - 1))
            relative.append(i - start)
            where.append(at[i])
    return left, right, relative, where
