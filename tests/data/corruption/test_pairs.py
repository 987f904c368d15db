"""NSP / SOP pair builders: golden formats, balance, negatives, HF conventions."""
import random

import pytest

from ptm_app.data.corruption.pairs import nsp_example, pair_input, sop_example

CLS, SEP = 2, 3
SENT1, SENT2 = [10, 11, 12], [13, 14, 15, 16, 17]  # "I am happy" / "to join with you today"
OTHER = [[20, 21], [22, 23, 24]]
DOCS = [[SENT1, SENT2], OTHER]


def corpus(seed: int = 0, n_docs: int = 40) -> list[list[list[int]]]:
    """Token id = doc * 100_000 + sentence * 100 + position, so every token tells where it came from."""
    rng = random.Random(seed)
    return [
        [[d * 100_000 + s * 100 + p for p in range(rng.randrange(3, 20))] for s in range(rng.randrange(2, 12))]
        for d in range(n_docs)
    ]


def origin(token: int) -> tuple[int, int, int]:
    return token // 100_000, token // 100 % 1000, token % 100


def is_consecutive_text(tokens: list[int], document: list[list[int]]) -> bool:
    flat = [t for sentence in document for t in sentence]
    start = flat.index(tokens[0])
    return flat[start : start + len(tokens)] == tokens


def test_pair_input_golden():
    input_ids, token_type_ids = pair_input(SENT1, SENT2, cls_id=CLS, sep_id=SEP)
    assert input_ids == [CLS, 10, 11, 12, SEP, 13, 14, 15, 16, 17, SEP]  # [CLS] I am happy [SEP] to join ... [SEP]
    assert token_type_ids == [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1]


def test_nsp_golden():
    assert nsp_example(DOCS, 0, 0, random.Random(2), max_tokens=16) == (SENT1, SENT2, 1)  # Sent1 [SEP] Next Sent
    assert nsp_example(DOCS, 0, 0, random.Random(0), max_tokens=16) == (SENT1, [20, 21, 22, 23, 24], 0)  # Random Sent


def test_sop_golden():
    assert sop_example(DOCS, 0, 0, random.Random(0), max_tokens=16) == (SENT1, SENT2, 0)  # in order
    assert sop_example(DOCS, 0, 0, random.Random(2), max_tokens=16) == (SENT2, SENT1, 1)  # swapped


def test_nsp_balance_and_negatives_from_another_document():
    docs = corpus()
    rng = random.Random(1)
    labels = []
    for _ in range(4000):
        d = rng.randrange(len(docs))
        s = rng.randrange(len(docs[d]) - 1)  # a start with a following sentence
        a, b, is_next = nsp_example(docs, d, s, rng, max_tokens=48)
        assert a and b and len(a) + len(b) <= 48
        assert origin(a[0])[:2] == (d, s) and is_consecutive_text(a, docs[d])
        b_doc = origin(b[0])[0]
        assert is_consecutive_text(b, docs[b_doc])
        if is_next:
            # B starts at a sentence boundary after A (A's end may have been trimmed)
            assert b_doc == d and origin(b[0])[2] == 0 and origin(b[0])[1] > origin(a[-1])[1]
            if len(a) + len(b) < 48:  # nothing trimmed (trimming stops at exactly 48): B is the very next text
                assert is_consecutive_text(a + b, docs[d])
        else:
            assert b_doc != d
        labels.append(is_next)
    assert abs(sum(labels) / len(labels) - 0.5) < 0.03


def test_sop_balance_and_negatives_are_the_swap():
    docs = corpus(1)
    rng = random.Random(2)
    labels = []
    for _ in range(4000):
        d = rng.randrange(len(docs))
        s = rng.randrange(len(docs[d]) - 1)
        first, second, label = sop_example(docs, d, s, rng, max_tokens=512)  # no truncation
        a, b = (second, first) if label else (first, second)
        assert a + b == [t for sentence in docs[d][s:] for t in sentence]  # consecutive, same document
        assert origin(b[0])[2] == 0  # the split falls on a sentence boundary
        labels.append(label)
    assert abs(sum(labels) / len(labels) - 0.5) < 0.03


def test_truncation_trims_the_end_of_the_longer_segment():
    long_doc = [[[1000 + i for i in range(30)], [2000 + i for i in range(5)]]]
    a, b, label = sop_example(long_doc, 0, 0, random.Random(0), max_tokens=20)
    a, b = (b, a) if label else (a, b)
    assert a == [1000 + i for i in range(15)] and b == [2000 + i for i in range(5)]
    for seed in range(50):
        a, b, _ = nsp_example(corpus(), 3, 0, random.Random(seed), max_tokens=10)
        assert len(a) + len(b) <= 10 and a and b


def test_edge_cases():
    # nothing follows the last sentence: NSP falls back to a negative (as BERT), SOP refuses
    assert all(nsp_example(DOCS, 0, 1, random.Random(s), max_tokens=16)[2] == 0 for s in range(20))
    with pytest.raises(ValueError, match="SOP"):
        sop_example(DOCS, 0, 1, random.Random(0), max_tokens=16)
    with pytest.raises(ValueError, match="two documents"):
        nsp_example([[SENT1, SENT2]], 0, 1, random.Random(0), max_tokens=16)
    with pytest.raises(ValueError):
        nsp_example(DOCS, 0, 5, random.Random(0), max_tokens=16)


def test_seeded_and_deterministic():
    docs = corpus()
    for build in (nsp_example, sop_example):
        assert build(docs, 5, 0, random.Random(3), max_tokens=32) == build(docs, 5, 0, random.Random(3), max_tokens=32)
        assert len({repr(build(docs, 5, 0, random.Random(s), max_tokens=32)) for s in range(10)}) > 1


def test_label_conventions_match_transformers():
    from transformers import AlbertForPreTraining, BertForPreTraining

    # SOP: we return 0 = in order, 1 = swapped, exactly HF's sentence_order_label
    assert "`0` indicates original order" in AlbertForPreTraining.forward.__doc__
    # NSP: we return is_next (1 = continuation); HF's next_sentence_label is the opposite, so use 1 - is_next
    assert "1 indicates sequence B is a random sequence" in BertForPreTraining.forward.__doc__
