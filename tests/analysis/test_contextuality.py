"""Ethayarajh (2019) contextuality measures: known values on constructed vectors, and the command end to end."""
import json

import pytest
import torch

from ptm_app.analysis import geometry
from ptm_app.analysis.contextuality import occurrence_rows
from ptm_app.analysis.representations import Examples, Features
from tests.conftest import run_main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_identical_occurrences_are_fully_self_similar_with_one_component():
    word = torch.tensor([[1.0, 2.0, 3.0]]).repeat(5, 1)
    assert geometry.self_similarity([word]) == pytest.approx(1.0)
    assert geometry.explainable_variance(word) == pytest.approx(1.0)
    scaled = word * torch.tensor([[1.0], [2.0], [0.5], [3.0], [1.0]])  # same direction, other lengths
    assert geometry.self_similarity([scaled]) == pytest.approx(1.0)


def test_orthogonal_occurrences_have_zero_similarity_and_spread_variance():
    basis = torch.eye(4)
    assert geometry.mean_pairwise_cosine(basis) == pytest.approx(0.0, abs=1e-12)
    assert geometry.explainable_variance(basis) == pytest.approx(0.25)  # 4 equal singular values
    # two words: one constant (1.0), one orthogonal (0.0): the mean over words
    assert geometry.self_similarity([torch.ones(3, 2), basis]) == pytest.approx(0.5)
    assert geometry.max_explainable_variance([torch.ones(3, 2), basis]) == pytest.approx(0.625)
    # known pair: cos(45 degrees)
    assert geometry.mean_pairwise_cosine(torch.tensor([[1.0, 0.0], [1.0, 1.0]])) == pytest.approx(2 ** -0.5)


def test_intra_sentence_similarity():
    same = torch.tensor([[1.0, 1.0]]).repeat(3, 1)
    assert geometry.intra_sentence_similarity([same]) == pytest.approx(1.0)
    opposite = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # mean (0.5, 0.5): each at 45 degrees
    assert geometry.intra_sentence_similarity([opposite, same]) == pytest.approx((2 ** -0.5 + 1) / 2)


def test_anisotropy_of_a_cone_and_of_random_directions():
    g = torch.Generator().manual_seed(0)
    isotropic = torch.randn(2000, 256, generator=g)
    groups = torch.arange(2000) // 10
    first, second = geometry.random_pairs(2000, 3000, torch.Generator().manual_seed(1), groups)
    assert len(first) == 3000 and bool((groups[first] != groups[second]).all())
    assert abs(geometry.anisotropy(isotropic, first, second)) < 0.02
    cone = isotropic * 0.1 + torch.ones(256)  # every vector near one direction
    assert geometry.anisotropy(cone, first, second) > 0.95
    # identical vectors: anisotropy 1, so the adjusted self-similarity of any word is 0
    same = torch.ones(50, 8)
    assert geometry.anisotropy(same, first[first < 50][:20], second[second < 50][:20]) == pytest.approx(1.0)
    assert geometry.random_sets_mev(same, [3, 5], torch.Generator().manual_seed(0)) == pytest.approx(1.0)
    # random sets of isotropic vectors in 256 dimensions: the first component explains about 1/n of n vectors
    assert geometry.random_sets_mev(isotropic, [10] * 20, torch.Generator().manual_seed(0)) < 0.2


def test_occurrences_are_per_sentence_with_a_floor_and_a_cap():
    texts = [["The", "cat", "the"], ["the", "dog"], ["THE", "cat"], ["a", "cat"]]
    sentence = torch.tensor([s for s, ws in enumerate(texts) for _ in ws])
    word = torch.tensor([w for ws in texts for w in range(len(ws))])
    features = Features(layers=[], sentence=sentence, word=word)
    examples = Examples(level="token", texts=texts, labels=[])
    assert occurrence_rows(examples, features, 2, 10) == {"the": [0, 3, 5], "cat": [1, 6, 8]}
    assert occurrence_rows(examples, features, 3, 2) == {}  # capped at 2 occurrences: below the floor of 3
    assert occurrence_rows(examples, features, 2, 2) == {"the": [0, 3], "cat": [1, 6]}


def test_contextuality_command_on_a_tiny_model(tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "ctx"
    assert run_main(["contextuality", "--models", str(tiny_bert_dir), "--sentences", "40", "--min_occurrences", "3",
                     "--baseline_pairs", "300", "--output_dir", str(out)], tmp_path) == 0
    rows = json.loads((out / "contextuality.json").read_text())
    assert [r["layer"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert -1 <= r["self_similarity"] <= 1 and 0 < r["mev"] <= 1 and r["words"] > 3
        assert r["self_similarity_adjusted"] == pytest.approx(r["self_similarity"] - r["anisotropy"])
        assert r["mev_adjusted"] == pytest.approx(r["mev"] - r["baseline_mev"])
    assert (out / "contextuality.png").stat().st_size > 1000 and "wrote" in capsys.readouterr().out
    assert run_main(["contextuality", "--models", str(tiny_bert_dir), "--layers", "3"], tmp_path) == 2
    assert "layer 3 is not in tiny_bert" in capsys.readouterr().err
