"""SQuAD v1.1 and WNUT-16 through the QA and tagging paths: the official v1.1 EM/F1 on hand-computed cases, a real
long SQuAD paragraph cut into windows whose best span wins across them, and the BIO entity P/R/F1 against seqeval."""
import json
import random
from types import SimpleNamespace

import pytest
import torch

from ptm_app.data.qa_data import QADataModule
from ptm_app.data.sources import prepared_dir
from ptm_app.data.tokenizer import TokenizerSpec
from ptm_app.task_kinds.metrics import SquadMetric, entity_f1, squad_em, squad_f1, squad_normalize
from ptm_app.task_kinds.registry import TASK_KINDS
from tests.conftest import write_jsonl

MINILM = TokenizerSpec(pretrained="minilm")


# -- the official SQuAD v1.1 evaluation (evaluate-v1.1.py), hand-computed --------------------------------------
def test_squad_v11_normalisation_matches_the_official_steps():
    # lowercase, punctuation removed (string.punctuation, inside words too), then the articles a/an/the as whole
    # words, then single spaces
    assert squad_normalize("The  Beatles!") == "beatles"
    assert squad_normalize("Theatre, an Anthem") == "theatre anthem"  # 'the' inside a word stays
    assert squad_normalize("U.S.-based") == "usbased"
    assert squad_normalize("A\tcat's \n'toy'") == "cats toy"
    # punctuation goes first, so "a.n" becomes the article "an" and is dropped; "Anne" is a word of its own
    assert squad_normalize("Anne") == "anne" and squad_normalize("a.n") == ""


def test_squad_v11_em_and_f1_hand_computed():
    # several golds (dev has 1-6): the maximum over them, EM and F1 each on its own
    golds = ["Denver Broncos", "the Denver Broncos", "Broncos"]
    assert squad_em("denver broncos.", golds) == 1.0
    assert squad_f1("Broncos", golds) == 1.0  # equals the third gold
    # pred {the, broncos, of, denver} -> {broncos, of, denver}: vs "denver broncos" 2 shared, P 2/3, R 1 -> 0.8
    assert squad_f1("The Broncos of Denver", golds) == pytest.approx(0.8)
    assert squad_em("The Broncos of Denver", golds) == 0.0
    # repeated tokens count with multiplicity: pred {new, new, york} vs {new, york}: 2 shared, P 2/3, R 1
    assert squad_f1("new new york", ["New York"]) == pytest.approx(0.8)
    # pred {in, 1905}: vs "1905 and 1906" 1 shared, P 1/2 R 1/3 -> 0.4; vs "in 1905 only" 2 shared, P 1 R 2/3 -> 0.8
    assert squad_f1("in 1905", ["1905 and 1906", "in 1905 only"]) == pytest.approx(0.8)
    # the v1.1 script scores F1 0 when no token is shared, even an empty prediction against a gold that normalises
    # to empty (three dev answers are "."); EM compares the normalised strings, so that EM is 1
    assert squad_f1("", ["."]) == 0.0 and squad_em("", ["."]) == 1.0
    assert squad_f1("?", [".", "Paris"]) == 0.0
    metric = SquadMetric()  # the mean over questions
    metric.update(["denver broncos.", "The Broncos of Denver", "nothing"], [golds, golds, ["x"]])
    scores = metric.compute()
    assert float(scores["em"]) == pytest.approx(1 / 3) and float(scores["f1"]) == pytest.approx((1 + 0.8) / 3)


# -- doc stride on a real long SQuAD paragraph ------------------------------------------------------------------
LONG_ID = "57263b1638643c19005ad336"  # dev, 'Packet_switching': 733 context tokens, the answer near token 648


@pytest.fixture(scope="module")
def long_squad(tmp_path_factory) -> QADataModule:
    with open(prepared_dir("squad") / "test.jsonl", encoding="utf-8") as fh:
        row = next(r for r in map(json.loads, fh) if r["id"] == LONG_ID)
    root = tmp_path_factory.mktemp("squad_long")
    write_jsonl(root / "train.jsonl", [row])
    write_jsonl(root / "validation.jsonl", [row])
    dm = QADataModule(source=str(root), tokenizer=MINILM, max_length=384, doc_stride=128, max_question_length=64)
    dm.setup("fit")
    return dm


def test_a_long_squad_paragraph_is_windowed_and_the_best_span_wins_across_windows(long_squad):
    records = long_squad.records("validation")
    f, context = SimpleNamespace(**records.columns), records.fields["context"][0]
    golds = records.fields["answers"][0]
    n = len(f.example)
    assert n == 3 and f.example == [0] * n and all(len(ids) <= 384 for ids in f.input_ids)
    # consecutive windows share doc_stride context tokens; together they cover the whole paragraph
    spans = [[tuple(o) for o in f.offsets[i] if o != [-1, -1]] for i in range(n)]
    assert all(len(set(spans[i]) & set(spans[i + 1])) == 128 for i in range(n - 1))
    assert spans[0][0][0] == 0 and spans[-1][-1][1] == len(context.rstrip())
    inside = [i for i in range(n) if f.start[i] > 0]
    assert inside == [n - 1]  # the answer is only in the last window; the others point at [CLS]
    s, e = f.offsets[n - 1][f.start[n - 1]][0], f.offsets[n - 1][f.end[n - 1]][1]
    assert context[s:e] == golds[0]
    # scores through the QA task kind: a wrong span scores 6 in window 0, the gold 10 in the last window, and
    # the last window's own runner-up 4: the example's answer is the gold, EM = F1 = 1
    kind = TASK_KINDS["qa"]
    metric = kind.build_metrics(None)
    batch = {"examples": torch.tensor(f.example), "offsets": torch.full((n, 384, 2), -1, dtype=torch.long)}
    for i in range(n):
        batch["offsets"][i, : len(f.offsets[i])] = torch.tensor(f.offsets[i])
    start, end = torch.zeros(n, 384), torch.zeros(n, 384)
    first_context = f.offsets[0].index(next(o for o in f.offsets[0] if o != [-1, -1]))
    start[0, first_context + 5], end[0, first_context + 7] = 3.0, 3.0
    start[n - 1, f.start[n - 1]], end[n - 1, f.end[n - 1]] = 5.0, 5.0
    start[n - 1, f.start[n - 1] - 3], end[n - 1, f.start[n - 1] - 2] = 2.0, 2.0
    kind.update(metric, (start, end), batch, {"n_best": 20, "max_answer_length": 30})
    scores = kind.compute(metric, lambda: records)
    assert float(scores["em"]) == 1.0 and float(scores["f1"]) == 1.0
    start[0, first_context + 5], end[0, first_context + 7] = 6.0, 6.0  # now window 0's wrong span is best
    kind.update(metric, (start, end), batch, {"n_best": 20, "max_answer_length": 30})
    assert float(kind.compute(metric, lambda: records)["em"]) == 0.0


# -- entity-level P/R/F1 against seqeval -----------------------------------------------------------------------
def _random_tags(rng: random.Random, n: int) -> list[str]:
    """BIO tags with ill-formed pieces too (I- after O, I- of another type), as a model may predict."""
    return [rng.choice(["O", "O", "O", "B-person", "I-person", "B-geo-loc", "I-geo-loc", "I-other"]) for _ in range(n)]


def test_entity_precision_recall_f1_equal_seqeval_default_mode():
    seqeval = pytest.importorskip("seqeval.metrics")
    rng = random.Random(0)
    for _ in range(200):
        gold = [_random_tags(rng, rng.randint(1, 12)) for _ in range(rng.randint(1, 4))]
        pred = [_random_tags(rng, len(g)) for g in gold]
        ours = entity_f1(pred, gold)
        assert ours["precision"] == pytest.approx(seqeval.precision_score(gold, pred, zero_division=0))
        assert ours["recall"] == pytest.approx(seqeval.recall_score(gold, pred, zero_division=0))
        assert ours["f1"] == pytest.approx(seqeval.f1_score(gold, pred, zero_division=0))


def test_entity_f1_on_wnut16_gold_with_corrupted_predictions_equals_seqeval():
    seqeval = pytest.importorskip("seqeval.metrics")
    with open(prepared_dir("wnut16") / "validation.jsonl", encoding="utf-8") as fh:
        gold = [json.loads(line)["tags"] for line in fh]
    rng = random.Random(1)
    types = ["person", "geo-loc", "company", "other"]
    pred = [[t if rng.random() < 0.9 else rng.choice(["O", f"B-{rng.choice(types)}", f"I-{rng.choice(types)}"])
             for t in tags] for tags in gold]
    ours = entity_f1(pred, gold)
    assert 0.3 < ours["f1"] < 0.95  # a real mix of hits and misses, not a trivial case
    assert ours["precision"] == pytest.approx(seqeval.precision_score(gold, pred))
    assert ours["recall"] == pytest.approx(seqeval.recall_score(gold, pred))
    assert ours["f1"] == pytest.approx(seqeval.f1_score(gold, pred))
