"""Whole-word masking and SpanBERT spans: golden formats and statistics."""
import random

import pytest

from ptm_app.data import IGNORE_INDEX
from ptm_app.data.corruption.spans import (
    geometric_spans,
    sbo_targets,
    span_mask,
    whole_word_mask,
    whole_word_spans,
    word_starts_from_tokens,
)

MASK, V = 4, 1000
WORDS = "I am happy to join with you today".split()
IDS = list(range(10, 18))  # I=10 am=11 happy=12 to=13 join=14 with=15 you=16 today=17
PIECES = ["i", "am", "hap", "##py", "to", "jo", "##in", "with", "you", "to", "##day"]
PIECE_IDS = list(range(20, 31))


def random_word_starts(rng: random.Random, n: int, p_start: float = 0.7) -> list[bool]:
    return [i == 0 or rng.random() < p_start for i in range(n)]


def truncated_geometric_mean(p: float = 0.2, max_len: int = 10) -> float:
    weights = [p * (1 - p) ** (k - 1) for k in range(1, max_len + 1)]
    return sum(k * w for k, w in enumerate(weights, 1)) / sum(weights)


def test_word_spans_from_wordpieces():
    starts = word_starts_from_tokens(PIECES)
    assert starts == [True, True, True, False, True, True, False, True, True, True, False]
    assert whole_word_spans(starts) == [(0, 1), (1, 2), (2, 4), (4, 5), (5, 7), (7, 8), (8, 9), (9, 11)]
    assert word_starts_from_tokens(["##py", "to"]) == [True, True]  # a window may start inside a word
    assert whole_word_spans([]) == []


def test_whole_word_mask_golden():
    # I am [MASK] [MASK] to join with you today: both pieces of "hap ##py" masked, nothing else
    corrupted, labels = whole_word_mask(
        PIECE_IDS, word_starts_from_tokens(PIECES), random.Random(10),
        mask_token_id=MASK, vocab_size=50, rate=2 / 11, mask_ratio=1.0, random_ratio=0.0,
    )
    assert corrupted == [20, 21, MASK, MASK, 24, 25, 26, 27, 28, 29, 30]
    assert labels == [IGNORE_INDEX] * 2 + [22, 23] + [IGNORE_INDEX] * 7


def test_whole_word_mask_never_splits_a_word_and_follows_bert_ratios():
    rng = random.Random(0)
    selected = total = masked = kept = 0
    for _ in range(2000):
        ids = [rng.randrange(10, V) for _ in range(128)]
        starts = random_word_starts(rng, 128)
        corrupted, labels = whole_word_mask(ids, starts, rng, mask_token_id=MASK, vocab_size=V, random_ids=range(10, V))
        for start, end in whole_word_spans(starts):
            picked = {labels[i] != IGNORE_INDEX for i in range(start, end)}
            assert len(picked) == 1  # all sub-tokens of a word or none
        for i, label in enumerate(labels):
            if label == IGNORE_INDEX:
                assert corrupted[i] == ids[i]
            else:
                assert label == ids[i] and corrupted[i] >= 4
                selected += 1
                masked += corrupted[i] == MASK
                kept += corrupted[i] == ids[i]
        total += len(ids)
    assert abs(selected / total - 0.15) < 0.01
    assert abs(masked / selected - 0.8) < 0.01 and abs(kept / selected - 0.1) < 0.01


def test_span_mask_and_sbo_golden():
    corrupted, labels = span_mask(
        IDS, [(2, 5)], random.Random(0), mask_token_id=MASK, vocab_size=V, mask_ratio=1.0, random_ratio=0.0
    )
    assert corrupted == [10, 11, MASK, MASK, MASK, 15, 16, 17]  # I am [MASK] [MASK] [MASK] with you today
    assert [y for y in labels if y != IGNORE_INDEX] == [12, 13, 14]  # happy to join
    # boundaries x_{s-1} = "am" (1) and x_{e+1} = "with" (5); relative positions 0, 1, 2
    assert sbo_targets([(2, 5)], len(IDS)) == ([1, 1, 1], [5, 5, 5], [0, 1, 2], [2, 3, 4])
    # clipped at the sequence edges; entries follow the masked positions in ascending order
    assert sbo_targets([(6, 8), (0, 2)], 8) == ([0, 0, 5, 5], [2, 2, 7, 7], [0, 1, 0, 1], [0, 1, 6, 7])
    # in a row "[CLS] a b [SEP] c d [SEP]" the maskable tokens sit at 1, 2, 4, 5: the boundaries are row tokens
    # ([CLS] left of a span at the start; a span over the [SEP] reaches around it)
    assert sbo_targets([(0, 1)], 7, positions=[1, 2, 4, 5]) == ([0], [2], [0], [1])
    assert sbo_targets([(1, 3)], 7, positions=[1, 2, 4, 5]) == ([1, 1], [5, 5], [0, 1], [2, 4])


def test_geometric_spans_golden_seed():
    assert geometric_spans(len(IDS), random.Random(47), rate=3 / 8) == [(2, 5)]


def test_geometric_spans_statistics():
    rng = random.Random(0)
    covered = n_spans = ones = 0
    for _ in range(2000):
        spans = geometric_spans(128, rng)
        previous_end = -1
        for start, end in spans:
            assert 0 <= start < end <= 128 and end - start <= 10
            assert start > previous_end  # sorted, disjoint, and at least one visible token between spans
            previous_end = end
        covered += sum(end - start for start, end in spans)
        n_spans += len(spans)
        ones += sum(end - start == 1 for start, end in spans)
    assert abs(covered / (2000 * 128) - 0.15) < 0.01
    assert abs(covered / n_spans - truncated_geometric_mean()) < 0.1  # 3.797 for p = 0.2, max 10
    assert abs(ones / n_spans - 0.2 / (1 - 0.8**10)) < 0.02  # P(len = 1) of the renormalised geometric


def test_geometric_spans_respect_word_boundaries():
    rng = random.Random(1)
    covered = n_spans = n_words = 0
    for _ in range(2000):
        starts = random_word_starts(rng, 128)
        spans = geometric_spans(128, rng, word_starts=starts)
        for start, end in spans:
            assert starts[start] and (end == 128 or starts[end])
            words = sum(starts[start:end])
            assert 1 <= words <= 10
            n_words += words
        covered += sum(end - start for start, end in spans)
        n_spans += len(spans)
    assert abs(covered / (2000 * 128) - 0.15) < 0.01
    assert abs(n_words / n_spans - truncated_geometric_mean()) < 0.1  # lengths are counted in words


def test_span_mask_decides_80_10_10_per_span():
    rng = random.Random(2)
    outcome = {"mask": 0, "random": 0, "kept": 0}
    for _ in range(1000):
        ids = [rng.randrange(10, V) for _ in range(128)]
        spans = geometric_spans(128, rng)
        corrupted, labels = span_mask(ids, spans, rng, mask_token_id=MASK, vocab_size=V, random_ids=range(10, V))
        assert {i for i, y in enumerate(labels) if y != IGNORE_INDEX} == {i for s, e in spans for i in range(s, e)}
        for start, end in spans:
            span = corrupted[start:end]
            if all(t == MASK for t in span):
                outcome["mask"] += 1
            elif span == ids[start:end]:
                outcome["kept"] += 1
            else:
                assert MASK not in span  # never a mix of [MASK] and other tokens inside one span
                outcome["random"] += 1
    n = sum(outcome.values())
    assert abs(outcome["mask"] / n - 0.8) < 0.02
    assert abs(outcome["random"] / n - 0.1) < 0.015 and abs(outcome["kept"] / n - 0.1) < 0.015


def test_seeded_pure_and_deterministic():
    ids = list(range(10, 138))
    frozen = list(ids)
    a = geometric_spans(128, random.Random(5))
    assert a == geometric_spans(128, random.Random(5)) and a != geometric_spans(128, random.Random(6))
    starts = [True] * 128
    wwm = whole_word_mask(ids, starts, random.Random(5), mask_token_id=MASK, vocab_size=V)
    assert wwm == whole_word_mask(ids, starts, random.Random(5), mask_token_id=MASK, vocab_size=V)
    assert wwm != whole_word_mask(ids, starts, random.Random(6), mask_token_id=MASK, vocab_size=V)
    span_mask(ids, a, random.Random(5), mask_token_id=MASK, vocab_size=V)
    assert ids == frozen


def test_bad_arguments_raise():
    with pytest.raises(ValueError):
        whole_word_mask(IDS, [True] * 3, random.Random(0), mask_token_id=MASK, vocab_size=V)
    with pytest.raises(ValueError):
        geometric_spans(8, random.Random(0), p=0.0)
    with pytest.raises(ValueError):
        span_mask(IDS, [(6, 9)], random.Random(0), mask_token_id=MASK, vocab_size=V)
