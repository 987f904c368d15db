"""Attention-head measures (Clark et al. 2019 §3) on hand-built attention maps, and the command end to end."""
import json
import math

import pytest
import torch

from ptm_app.analysis.attention_stats import (OFFSETS, add_sums, is_punctuation, means, relation_shares,
                                              relation_sums, relation_targets, sentence_sums, word_attention)
from ptm_app.analysis.representations import first_sub_tokens, token_words
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


def test_word_attention_sums_into_words_and_averages_from_them():
    # tokens: [CLS] the dog ##s ran [SEP] -> words 0 (the), 1 (dog ##s), 2 (ran); specials left out
    words = [-1, 0, 1, 1, 2, -1]
    att = torch.zeros(1, 6, 6)
    att[0, 1, 2], att[0, 1, 3], att[0, 1, 0] = 0.3, 0.5, 0.2  # "the" -> dog (0.3) + ##s (0.5) = 0.8 to word 1
    att[0, 2, 1], att[0, 3, 4] = 1.0, 1.0  # "dog" -> the, "##s" -> ran: from word 1 = the mean, 0.5 and 0.5
    att[0, 4, 4] = 1.0
    maps = word_attention(att, words, 3)[0]
    assert maps[0].tolist() == pytest.approx([0.0, 0.8, 0.0])
    assert maps[1].tolist() == pytest.approx([0.5, 0.0, 0.5])
    assert maps[2].tolist() == pytest.approx([0.0, 0.0, 1.0])


def test_relation_targets_from_pos_tags():
    tags = ["DET", "ADJ", "NOUN", "ADP", "DET", "NOUN", "VERB", "DET"]
    t = relation_targets(tags)
    assert t["prev_word"] == [-1, 0, 1, 2, 3, 4, 5, 6]
    assert t["next_word"] == [1, 2, 3, 4, 5, 6, 7, -1]
    assert t["det_noun"] == [2, -1, -1, -1, 5, -1, -1, -1]  # the last DET has no noun after it
    assert t["adj_noun"] == [-1, 2, -1, -1, -1, -1, -1, -1]
    assert t["adp_noun"] == [-1, -1, -1, 5, -1, -1, -1, -1]


def test_relation_shares_of_a_next_word_head_and_the_offset_baseline():
    tags = ["DET", "ADJ", "NOUN", "VERB"]
    n = len(tags)
    nxt = torch.zeros(n, n)
    for i in range(n - 1):
        nxt[i, i + 1] = 1.0
    nxt[n - 1, 0] = 1.0
    prev = torch.zeros(n, n)
    for i in range(n):
        prev[i, i - 1] = 1.0  # word i attends to i - 1 (word 0 to the last word)
    total = add_sums(None, relation_sums(torch.stack([nxt, prev]), tags))
    shares = relation_shares(total)
    assert shares["next_word"]["heads"].tolist() == pytest.approx([1.0, 0.0]) and shares["next_word"]["count"] == 3
    assert shares["prev_word"]["heads"].tolist() == pytest.approx([0.0, 1.0])
    # det -> noun: DET at 0, its noun at 2; the next-word head picks 1 (wrong); ADJ at 1 -> noun 2 (right)
    assert shares["det_noun"]["heads"].tolist() == pytest.approx([0.0, 0.0]) and shares["det_noun"]["count"] == 1
    assert shares["adj_noun"]["heads"].tolist() == pytest.approx([1.0, 0.0])
    assert shares["det_noun"]["baseline_offset"] == 2 and shares["det_noun"]["baseline"] == 1.0
    assert shares["adp_noun"]["count"] == 0 and shares["adp_noun"]["heads"] is None
    assert len(total["next_word_offset"]) == len(OFFSETS)


def test_token_words_and_first_sub_tokens_agree():
    offsets = [(0, 0), (0, 3), (4, 7), (7, 8), (9, 12), (0, 0)]  # [CLS] the dog ##s ran [SEP]
    special = [1, 0, 0, 0, 0, 1]
    owner = [0, 0, 0, -1, 1, 1, 1, 1, -1, 2, 2, 2]  # "the dogs ran"
    assert token_words(offsets, special, owner) == [-1, 0, 1, 1, 2, -1]
    assert first_sub_tokens(offsets, special, owner) == {0: 1, 1: 2, 2: 4}


def test_attention_command_on_a_tiny_model(tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "att"
    assert run_main(["attention", "--models", str(tiny_bert_dir), "--sentences", "5", "--output_dir", str(out)],
                    tmp_path) == 0
    rows = json.loads((out / "attention.json").read_text())
    assert [(r["layer"], r["head"]) for r in rows] == [(1, 0), (1, 1), (2, 0), (2, 1)]  # 2 layers x 2 heads
    for r in rows:
        assert 0 < r["entropy"] <= math.log(128) and 0 <= r["to_cls"] <= 1 and 0 <= r["to_punct"] <= 1
        assert r["distance"] > 0
        assert all(r[k] is None or 0 <= r[k] <= 1 for k in ("prev_word", "next_word", "det_noun"))
    assert (out / "attention.png").stat().st_size > 1000 and (out / "attention_by_layer.md").is_file()
    best = json.loads((out / "attention_relations.json").read_text())
    assert {b["relation"] for b in best} >= {"prev_word", "next_word"}
    for b in best:
        share = max(r[b["relation"]] for r in rows)
        assert b["accuracy"] == pytest.approx(share) and b["words"] > 0 and 0 <= b["baseline"] <= 1
    capsys.readouterr()


def test_a_backbone_without_attention_is_one_line(tiny_bilstm_dir, tmp_path, capsys):
    assert run_main(["attention", "--models", str(tiny_bilstm_dir), "--sentences", "2"], tmp_path) == 2
    err = capsys.readouterr().err
    assert "has no attention heads" in err and err.count("\n") == 1
