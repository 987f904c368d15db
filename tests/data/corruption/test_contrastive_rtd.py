"""InfoWord n-grams + InfoNCE (trap T4) and ELECTRA replaced-token detection (trap T5)."""
import math
import random

import pytest
import torch

from ptm_app.data.corruption.contrastive import info_nce, mask_ngram, ngram_span
from ptm_app.data import IGNORE_INDEX
from ptm_app.data.corruption.rtd import rtd_labels, sample_replacements

MASK = 4
IDS = list(range(10, 18))  # I am happy to join with you today
THRILLED, STUDY = 18, 19
CORRUPTED = [10, 11, THRILLED, 13, STUDY, 15, 16, 17]  # I am thrilled to study with you today


def test_ngram_span_distribution():
    rng = random.Random(0)
    lengths = []
    for _ in range(20000):
        start, end = ngram_span(64, rng)
        assert 0 <= start < end <= 64
        lengths.append(end - start)
    assert min(lengths) >= 1 and max(lengths) <= 10
    assert abs(sum(lengths) / len(lengths) - 5.0) < 0.05
    assert abs(lengths.count(5) / len(lengths) - 0.383) < 0.015  # P(|N(0,1)| < 0.5)
    assert all(end <= 3 for _, end in (ngram_span(3, rng) for _ in range(100)))  # clipped to the sequence
    assert ngram_span(1, rng) == (0, 1)
    assert len({ngram_span(64, random.Random(s)) for s in range(10)}) > 1
    assert ngram_span(64, random.Random(3)) == ngram_span(64, random.Random(3))


def test_mask_ngram_golden():
    assert mask_ngram(IDS, 2, 5, mask_token_id=MASK) == [10, 11, MASK, MASK, MASK, 15, 16, 17]
    with pytest.raises(ValueError):
        mask_ngram(IDS, 6, 9, mask_token_id=MASK)


def test_info_nce_is_cross_entropy_with_diagonal_positives():
    scores = torch.randn(4, 7, generator=torch.Generator().manual_seed(0))  # 3 extra negatives per row
    manual = sum(
        -(scores[i, i].item() - math.log(sum(math.exp(s) for s in scores[i].tolist()))) for i in range(4)
    ) / 4
    assert info_nce(scores).item() == pytest.approx(manual, rel=1e-5)
    square = scores[:, :4]
    assert torch.allclose(info_nce(square), torch.nn.functional.cross_entropy(square, torch.arange(4)))
    assert info_nce(50 * torch.eye(8)).item() < 1e-6  # dominant diagonal -> ~0
    assert info_nce(torch.zeros(8, 8)).item() == pytest.approx(math.log(8))  # uninformative -> log N
    with pytest.raises(ValueError):
        info_nce(torch.zeros(4, 3))


def test_rtd_labels_golden_discriminator():
    original, corrupted = torch.tensor([IDS]), torch.tensor([CORRUPTED])
    labels = rtd_labels(original, corrupted, torch.ones(1, 8))
    assert " ".join("or"[y] for y in labels[0].tolist()) == "o o r o r o o o"  # 1 = replaced (HF)
    padded = torch.tensor([IDS + [0, 0]])
    resampled = torch.tensor([IDS[:2] + [12] + IDS[3:] + [0, 0]])  # generator sampled the original "happy"
    labels = rtd_labels(padded, resampled, torch.tensor([[1] * 8 + [0, 0]]))
    assert labels.tolist() == [[0] * 8 + [IGNORE_INDEX] * 2]  # sampled == original counts as original


def test_sample_replacements_golden_and_no_grad():
    peaked = torch.full((1, 8, 32), -1e4)
    peaked[0, 2, THRILLED] = peaked[0, 4, STUDY] = 0.0
    peaked.requires_grad_(True)
    masked = torch.zeros(1, 8, dtype=torch.bool)
    masked[0, [2, 4]] = True
    sampled = sample_replacements(peaked, masked, torch.Generator().manual_seed(0))
    assert not sampled.requires_grad and sampled.tolist() == [THRILLED, STUDY]
    corrupted = torch.tensor([IDS])
    corrupted[masked] = sampled
    assert corrupted[0].tolist() == CORRUPTED
    assert rtd_labels(torch.tensor([IDS]), corrupted, torch.ones(1, 8))[0].tolist() == [0, 0, 1, 0, 1, 0, 0, 0]


def test_sample_replacements_follow_the_softmax():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(20000, 4)
    masked = torch.ones(20000, dtype=torch.bool)
    sampled = sample_replacements(logits, masked, torch.Generator().manual_seed(1))
    assert torch.allclose(torch.bincount(sampled, minlength=4) / 20000, probs, atol=0.015)
    hot = sample_replacements(logits, masked, torch.Generator().manual_seed(1), temperature=100.0)
    assert torch.allclose(torch.bincount(hot, minlength=4) / 20000, torch.full((4,), 0.25), atol=0.015)
    again = sample_replacements(logits[:50], masked[:50], torch.Generator().manual_seed(1))
    assert torch.equal(again, sampled[:50])  # same generator state -> same draws
    other = sample_replacements(logits[:50], masked[:50], torch.Generator().manual_seed(2))
    assert not torch.equal(other, again)
