"""BART noising functions and Liu's word shuffle: golden formats and statistics."""
import math
import random

import pytest

from ptm_app.data.corruption.denoising import (
    compose,
    document_rotation,
    infilling_spans,
    poisson,
    replace_spans,
    sentence_permutation,
    split_sentences,
    text_infilling,
    token_deletion,
    token_masking,
    word_shuffle,
)

MASK, STOP = 4, 5
IDS = list(range(10, 18))  # I am happy to join with you today


def words(ids: list[int]) -> str:
    vocab = dict(zip(IDS, "I am happy to join with you today".split())) | {MASK: "[MASK]"}
    return " ".join(vocab[i] for i in ids)


def test_text_infilling_golden():
    assert words(replace_spans(IDS, [(2, 5)], mask_token_id=MASK)) == "I am [MASK] with you today"
    assert words(replace_spans(IDS, [(2, 2)], mask_token_id=MASK)) == "I am [MASK] happy to join with you today"
    seeded = text_infilling(IDS, random.Random(135), rate=3 / 8, mask_token_id=MASK)
    assert words(seeded) == "I am [MASK] with you today"  # T5/BART infilling: happy to join


def test_word_shuffle_golden():
    # Liu Table 2 "Sent Shuffling": today you am I join with happy to -> I am happy to join with you today
    assert words(word_shuffle(IDS, random.Random(26229))) == "today you am I join with happy to"
    # with word starts the pieces of a word move together: "hap ##py" stays "hap ##py"
    shuffled = word_shuffle([1, 2, 3, 4], random.Random(0), word_starts=[True, True, False, True])
    assert sorted(shuffled) == [1, 2, 3, 4] and shuffled[shuffled.index(2) + 1] == 3


def test_token_masking_and_deletion():
    ids = list(range(10, 110))
    rng = random.Random(0)
    masked = token_masking(ids, rng, rate=0.3, mask_token_id=MASK)
    assert masked.count(MASK) == 30 and all(m in (MASK, i) for m, i in zip(masked, ids))
    kept = token_deletion(ids, rng, rate=0.3)
    assert len(kept) == 70 and kept == sorted(kept) and set(kept) <= set(ids)  # an ordered subsequence
    assert len(token_deletion(list(range(10)), rng, rate=0.3)) == 7  # 0.3 * 10 deletes 3, not ceil(3.0000000000000004)


def test_poisson_sampler_moments():
    rng = random.Random(0)
    draws = [poisson(rng, 3.0) for _ in range(20000)]
    mean = sum(draws) / len(draws)
    variance = sum((d - mean) ** 2 for d in draws) / len(draws)
    assert abs(mean - 3.0) < 0.05 and abs(variance - 3.0) < 0.1
    assert abs(draws.count(0) / len(draws) - math.exp(-3.0)) < 0.01


def test_text_infilling_statistics():
    rng = random.Random(0)
    covered = n_spans = zeros = 0
    for _ in range(2000):
        ids = [rng.randrange(10, 1000) for _ in range(128)]
        state = rng.getstate()
        spans = infilling_spans(128, rng)
        rng.setstate(state)
        out = text_infilling(ids, rng, mask_token_id=MASK)
        assert out == replace_spans(ids, spans, mask_token_id=MASK)
        assert out.count(MASK) == len(spans)  # one mask per span, zero-length spans included
        assert len(out) == 128 - sum(e - s for s, e in spans) + len(spans)
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start > end  # a clean token between two masks
        covered += sum(e - s for s, e in spans)
        n_spans += len(spans)
        zeros += sum(s == e for s, e in spans)
    assert abs(covered / (2000 * 128) - 0.3) < 0.01  # BART masks 30 % of tokens
    assert abs(covered / n_spans - 3.0) < 0.1  # Poisson(3) span lengths
    assert abs(zeros / n_spans - math.exp(-3.0)) < 0.01  # length-0 spans insert a mask


def test_sentence_split_permute_and_rotate():
    doc = [10, 11, STOP, 12, STOP, 13, 14]
    sentences = split_sentences(doc, {STOP})
    assert sentences == [[10, 11, STOP], [12, STOP], [13, 14]]
    assert split_sentences([10, STOP], {STOP}) == [[10, STOP]] and split_sentences([], {STOP}) == []
    orders = {tuple(map(tuple, sentence_permutation(sentences, random.Random(s)))) for s in range(50)}
    assert len(orders) == 6 and all(sorted(o) == sorted(map(tuple, sentences)) for o in orders)
    offsets = set()
    for seed in range(200):
        rotated, offset = document_rotation(IDS, random.Random(seed))
        assert rotated == IDS[offset:] + IDS[:offset]
        offsets.add(offset)
    assert offsets == set(range(len(IDS)))  # every token can become the start
    assert document_rotation([], random.Random(0)) == ([], 0)


def test_compose_applies_noises_in_order():
    doc = [10, 11, STOP, 12, 13, STOP, 14, 15, 16, STOP] * 5
    steps = [("sentence_permutation", {"full_stop_ids": [STOP]}), ("text_infilling", {"mask_token_id": MASK})]
    out = compose(doc, random.Random(3), steps)
    rng = random.Random(3)
    permuted = [t for s in sentence_permutation(split_sentences(doc, {STOP}), rng) for t in s]
    assert out == text_infilling(permuted, rng, mask_token_id=MASK)
    rotate_then_mask = [("document_rotation", {}), ("token_masking", {"rate": 0.25, "mask_token_id": MASK})]
    rotated = compose(IDS, random.Random(1), rotate_then_mask)
    assert rotated.count(MASK) == 2
    with pytest.raises(ValueError, match="unknown noise"):
        compose(IDS, random.Random(0), [("sentence_shuffling", {})])


def test_seeded_pure_and_deterministic():
    ids = list(range(10, 138))
    frozen = list(ids)
    for noise in (
        lambda r: text_infilling(ids, r, mask_token_id=MASK),
        lambda r: token_masking(ids, r, rate=0.15, mask_token_id=MASK),
        lambda r: token_deletion(ids, r, rate=0.15),
        lambda r: word_shuffle(ids, r),
        lambda r: document_rotation(ids, r),
    ):
        assert noise(random.Random(7)) == noise(random.Random(7)) != noise(random.Random(8))
    assert ids == frozen
