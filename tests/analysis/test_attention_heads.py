"""Attention-head measures (Clark et al. 2019 §3) on hand-built attention maps, and the command end to end."""
import json
import math

import pytest
import torch

from ptm_app.analysis.attention_stats import add_sums, is_punctuation, means, sentence_sums
from tests.conftest import run_main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_measures_of_hand_built_heads():
    T = 4
    uniform = torch.full((T, T), 1 / T)
    to_first = torch.zeros(T, T)
    to_first[:, 0] = 1.0  # every query looks at [CLS]
    previous = torch.zeros(T, T)
    previous[0, 0] = 1.0
    for i in range(1, T):
        previous[i, i - 1] = 1.0  # a "previous token" head
    attention = torch.stack([uniform, to_first, previous])  # [H=3, T, T]
    cls = torch.tensor([True, False, False, False])
    sep = torch.tensor([False, False, False, True])
    punct = torch.tensor([False, False, True, False])
    result = means(sentence_sums(attention, {"to_cls": cls, "to_sep": sep, "to_punct": punct}))
    assert result["entropy"].tolist() == pytest.approx([math.log(4), 0.0, 0.0])
    assert result["to_cls"].tolist() == pytest.approx([0.25, 1.0, 0.5])  # previous head: queries 0 and 1 on CLS
    assert result["to_sep"].tolist() == pytest.approx([0.25, 0.0, 0.0])
    assert result["to_punct"].tolist() == pytest.approx([0.25, 0.0, 0.25])  # query 3 looks at position 2
    # uniform: (6 + 4 + 4 + 6) / 16; to [CLS]: mean of i; previous token: 1 for every query but the first
    assert result["distance"].tolist() == pytest.approx([1.25, 1.5, 0.75])


def test_sentences_average_token_weighted_and_missing_tokens_stay_missing():
    short = sentence_sums(torch.ones(1, 1, 1), {"to_cls": None, "to_sep": torch.tensor([True])})
    long = sentence_sums(torch.eye(3).unsqueeze(0), {"to_cls": None, "to_sep": torch.tensor([False, False, True])})
    result = means(add_sums(add_sums(None, short), long))
    assert result["to_cls"] is None
    assert result["to_sep"].item() == pytest.approx((1 + 1) / 4)  # one of 1 query + one of 3 queries


def test_punctuation_tokens():
    assert all(is_punctuation(t) for t in [",", ".", "##.", "\u0120,", "''", "``", "--", "\u2014"])
    assert not any(is_punctuation(t) for t in ["the", "##s", "\u0120the", "", "3", "a."])


def test_attention_command_on_a_tiny_model(tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "att"
    assert run_main(["attention", "--models", str(tiny_bert_dir), "--sentences", "5", "--output_dir", str(out)],
                    tmp_path) == 0
    rows = json.loads((out / "attention.json").read_text())
    assert [(r["layer"], r["head"]) for r in rows] == [(1, 0), (1, 1), (2, 0), (2, 1)]  # 2 layers x 2 heads
    for r in rows:
        assert 0 < r["entropy"] <= math.log(128) and 0 <= r["to_cls"] <= 1 and 0 <= r["to_punct"] <= 1
        assert r["distance"] > 0
    assert (out / "attention.png").stat().st_size > 1000 and (out / "attention_by_layer.md").is_file()
    capsys.readouterr()


def test_a_backbone_without_attention_is_one_line(tiny_bilstm_dir, tmp_path, capsys):
    assert run_main(["attention", "--models", str(tiny_bilstm_dir), "--sentences", "2"], tmp_path) == 2
    err = capsys.readouterr().err
    assert "has no attention heads" in err and err.count("\n") == 1
