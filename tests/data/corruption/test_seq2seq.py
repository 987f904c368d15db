"""T5 span corruption and MASS: golden formats and statistics."""
import random

import pytest

from ptm_app.data.corruption.seq2seq import (
    mass_format,
    mass_fragment,
    t5_format,
    t5_reconstruct,
    t5_span_corruption,
    t5_spans,
)

MASK, EOS, BOS = 4, 1, 0
SENTINELS = list(range(100, 200))  # <X> = 100, <Y> = 101, ...
IDS = list(range(10, 18))  # I am happy to join with you today


def words(ids: list[int]) -> str:
    vocab = dict(zip(IDS, "I am happy to join with you today".split()))
    vocab |= {MASK: "[MASK]", EOS: "</s>", BOS: "<s>", 100: "<X>", 101: "<Y>", 102: "<Z>"}
    return " ".join(vocab[i] for i in ids)


def test_t5_golden():
    inputs, targets = t5_format(IDS, [(2, 5)], sentinel_ids=SENTINELS)
    assert words(inputs) == "I am <X> with you today"
    assert words(targets) == "<X> happy to join <Y>"
    inputs, targets = t5_format(IDS, [(2, 5)], sentinel_ids=SENTINELS, eos_id=EOS)
    assert words(inputs) == "I am <X> with you today </s>" and words(targets) == "<X> happy to join <Y> </s>"
    seeded = t5_span_corruption(IDS, random.Random(7), noise_density=3 / 8, sentinel_ids=SENTINELS)
    assert seeded == t5_format(IDS, [(2, 5)], sentinel_ids=SENTINELS)
    two = t5_format(IDS, [(0, 1), (3, 5)], sentinel_ids=SENTINELS)
    assert [words(x) for x in two] == ["<X> am happy <Y> with you today", "<X> I <Y> to join <Z>"]


def test_t5_reconstruct_inverts_on_many_seeds():
    rng = random.Random(0)
    for seed in range(300):
        n = rng.randrange(0, 60)
        ids = [rng.randrange(10, 100) for _ in range(n)]
        inputs, targets = t5_span_corruption(ids, random.Random(seed), sentinel_ids=SENTINELS, eos_id=EOS)
        assert t5_reconstruct(inputs, targets, SENTINELS, eos_id=EOS) == ids
        n_spans = sum(t in SENTINELS for t in inputs)
        assert [t for t in inputs if t in SENTINELS] == SENTINELS[:n_spans]  # distinct, in order
        assert [t for t in targets if t in SENTINELS] == SENTINELS[: n_spans + 1]  # plus the final sentinel


def test_t5_statistics():
    rng = random.Random(1)
    noise = n_spans = total = 0
    for _ in range(2000):
        n = rng.randrange(64, 257)
        spans = t5_spans(n, rng)
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start > end  # never two sentinels in a row
        assert all(0 <= s < e <= n for s, e in spans)
        noise += sum(e - s for s, e in spans)
        n_spans += len(spans)
        total += n
    assert abs(noise / total - 0.15) < 0.01
    assert abs(noise / n_spans - 3.0) < 0.1
    starts = {t5_spans(8, random.Random(s), noise_density=3 / 8)[0][0] for s in range(100)}
    assert starts == set(range(6))  # a lone span can sit anywhere, not only at the end


def test_t5_needs_enough_sentinels():
    with pytest.raises(ValueError, match="sentinel"):
        t5_format(IDS, [(0, 1), (3, 5)], sentinel_ids=SENTINELS[:2])


def test_mass_golden():
    encoder_input, decoder_input, target = mass_format(IDS, 2, 3, mask_token_id=MASK)
    assert words(encoder_input) == "I am [MASK] [MASK] [MASK] with you today"
    assert words(target) == "happy to join"
    assert words(decoder_input) == "[MASK] happy to"
    assert mass_format(IDS, 2, 3, mask_token_id=MASK, decoder_start_id=BOS)[1] == [BOS, 12, 13]
    assert mass_fragment(IDS, random.Random(7), fraction=3 / 8, mask_token_id=MASK) == (
        encoder_input, decoder_input, target, 2,
    )


def test_mass_fragment_statistics():
    rng = random.Random(2)
    starts = []
    for _ in range(2000):
        n = rng.randrange(1, 80)
        ids = [rng.randrange(10, 100) for _ in range(n)]
        encoder_input, decoder_input, target, start = mass_fragment(ids, rng, mask_token_id=MASK)
        length = min(n, max(1, int(0.5 * n + 0.5)))
        assert target == ids[start : start + length]  # decoder target = exactly the fragment
        assert decoder_input == [MASK] + target[:-1]
        assert encoder_input == ids[:start] + [MASK] * length + ids[start + length :]
        if n == 21:
            starts.append(start)
    assert set(starts) <= set(range(11)) and len(set(starts)) > 5
    assert mass_fragment([], rng, mask_token_id=MASK) == ([], [], [], 0)


def test_seeded_pure_and_deterministic():
    ids = list(range(10, 138))
    frozen = list(ids)
    for draw in (
        lambda r: t5_span_corruption(ids, r, sentinel_ids=SENTINELS),
        lambda r: mass_fragment(ids, r, mask_token_id=MASK),
    ):
        assert draw(random.Random(3)) == draw(random.Random(3))
        assert len({repr(draw(random.Random(seed))) for seed in range(10)}) > 5
    assert ids == frozen
