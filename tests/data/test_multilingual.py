"""Multilingual data (issue 29): the ``quran`` set (11 languages, split by surah), no translation leaking across the
splits of ``quran`` and ``bible_en_es``, XLM's language sampling (Lample & Conneau 2019 §3.1), the SentencePiece
Unigram tokenizer with balanced sampling (fertility per language before and after), and the one-line errors."""
from __future__ import annotations

import io
import json
import random
import tarfile
from collections import Counter
from pathlib import Path

import pytest

from ptm_app import paths
from ptm_app.data.language_sampling import balanced_texts, language_probabilities
from ptm_app.data.multilingual import (MultilingualDataModule, fertility,
                                       sampled_order, split_leaks, split_texts, stream_blocks)
from ptm_app.data.prepare import _is_current, prepare
from ptm_app.data.sources import SOURCES, quran
from ptm_app.data.tokenizer import TokenizerSpec, check_representable, load_tokenizer
from ptm_app.errors import PtmError

SPLITS = ("train", "validation", "test")


@pytest.fixture(scope="module")
def aligned_root(tmp_path_factory: pytest.TempPathFactory, shared_downloads: Path) -> Path:
    """A data root with ``quran`` and ``bible_en_es``: the project's prepared copies when current, else prepared here."""
    root, project = tmp_path_factory.mktemp("aligned"), paths.data_root()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PTM_DATA_DIR", str(root))
        mp.setenv("PTM_DOWNLOAD_CACHE", str(shared_downloads))
        for name in ("quran", "bible_en_es"):
            if _is_current(SOURCES[name], project / name):
                (root / name).symlink_to(project / name, target_is_directory=True)
            else:
                prepare([name])
    return root


@pytest.fixture
def aligned(aligned_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PTM_DATA_DIR", str(aligned_root))
    return aligned_root


def rows(root: Path, name: str) -> dict[str, list[dict]]:
    return {s: [json.loads(line) for line in open(root / name / f"{s}.jsonl", encoding="utf-8")] for s in SPLITS}


# -- the quran set ---------------------------------------------------------------------------------------------
def fake_package(path: Path, surahs: dict[int, tuple[str, int]]) -> Path:
    """A quran-json-like tarball: ``surahs`` = {id: (type, verses)}; verse text '<lang> s:v'."""
    def member(lang: str) -> bytes:
        field = "text" if lang == "ar" else "translation"
        return json.dumps([{"id": s, "type": kind, "verses": [{"id": v, field: f" {lang}  {s}:{v} "}
                                                              for v in range(1, n + 1)]}
                           for s, (kind, n) in surahs.items()]).encode()

    with tarfile.open(path, "w:gz") as tf:
        for lang in quran.LANGUAGES:
            name = "quran.json" if lang == "ar" else f"quran_{quran.PACKAGE_CODES.get(lang, lang)}.json"
            body = member(lang)
            info = tarfile.TarInfo(f"package/dist/{name}")
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))
    return path


def test_quran_records_align_every_language_by_verse(tmp_path):
    records, stats = quran.read(fake_package(tmp_path / "q.tgz", {1: ("meccan", 2), 2: ("medinan", 3)}))
    assert [r["id"] for r in records] == ["001:001", "001:002", "002:001", "002:002", "002:003"]
    assert records[3] == {"id": "002:002", "surah": 2, "verse": 2, "period": "medinan",
                          **{lang: f"{lang} 2:2" for lang in quran.LANGUAGES}}  # whitespace collapsed
    assert records[3]["ind"] == "ind 2:2"  # Indonesian is 'ind': 'id' stays the record id
    assert stats["verses"] == 5 and stats["surahs"] == 2


def test_quran_prepared_set_has_eleven_languages_and_its_licence(aligned):
    manifest = json.loads((aligned / "quran" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["counts"]["total"]["records"] == 6236 and manifest["counts"]["total"]["surahs"] == 114
    assert manifest["counts"]["total"]["periods"] == {"meccan": 4613, "medinan": 1623}
    assert manifest["source"]["sha256"] == quran.ARTIFACT.sha256 and manifest["split"]["group_by"] == "surah"
    assert "CC BY-SA 4.0" in manifest["licence"] and "non-commercial" in manifest["licence"]
    first = json.loads(open(aligned / "quran" / "train.jsonl", encoding="utf-8").readline())
    assert set(quran.LANGUAGES) <= set(first) and first["id"] == "001:001"
    assert first["en"] == "In the name of Allah, the Entirely Merciful, the Especially Merciful"


@pytest.mark.parametrize("name,unit,languages", [("quran", ("surah",), ("ar", "en", "zh")),
                                                ("bible_en_es", ("book",), ("en", "es"))])
def test_no_verse_translation_leaks_across_splits(aligned, name, unit, languages):
    split = rows(aligned, name)
    leaks = split_leaks(split, unit, languages)
    assert leaks["ids_in_two_splits"] == [] and leaks["units_in_two_splits"] == []
    # every language of a verse sits in the verse's split: an evaluation verse's translation is never in training
    train_ids = {r["id"] for r in split["train"]}
    assert not any(r["id"] in train_ids for s in ("validation", "test") for r in split[s])
    # chapters of a book (bible) stay together too, as the book does
    if name == "bible_en_es":
        chapters = {(r["book"], r["chapter"]) for r in split["train"]}
        assert not chapters & {(r["book"], r["chapter"]) for s in ("validation", "test") for r in split[s]}
    # the control: the same records split by line put units in two splits, which the check reports
    every = [r for s in SPLITS for r in split[s]]
    random.Random(0).shuffle(every)
    by_line = {"train": every[: len(every) * 8 // 10], "test": every[len(every) * 8 // 10:]}
    assert len(split_leaks(by_line, unit, languages)["units_in_two_splits"]) > 10


def test_repeated_verses_across_splits_are_counted_not_hidden(aligned):
    """Verses the source itself repeats in another surah / book (e.g. the lists of Ezra 2 and Nehemiah 7) share
    their text across splits: counted, and few."""
    quran_leaks = split_leaks(rows(aligned, "quran"), ("surah",), ("ar", "en"))["texts_repeated_from_train"]
    bible_leaks = split_leaks(rows(aligned, "bible_en_es"), ("book",), ("en", "es"))["texts_repeated_from_train"]
    assert 0 < quran_leaks["en"] < 60 and 0 < bible_leaks["es"] < 60  # a few dozen repeats among 6,236 / 30,400


# -- XLM's language sampling ------------------------------------------------------------------------------------
def test_language_probabilities_are_xlm_exponent_smoothing():
    q = language_probabilities({"en": 900, "sw": 100}, 0.5)  # p = .9/.1 -> sqrt -> .949/.316 -> q = .75/.25
    assert q["en"] == pytest.approx(0.75) and q["sw"] == pytest.approx(0.25)
    assert language_probabilities({"en": 900, "sw": 100}, 1.0) == pytest.approx({"en": 0.9, "sw": 0.1})
    assert language_probabilities({"en": 900, "sw": 100}, 0.3)["sw"] == pytest.approx(
        0.1 ** 0.3 / (0.1 ** 0.3 + 0.9 ** 0.3))


def test_sampled_order_draws_languages_with_q_and_cycles_the_small_one():
    order = sampled_order([900, 100], alpha=0.5, seed=3)
    langs = Counter(order[:, 0].tolist())
    assert len(order) == 1000 and 700 < langs[0] < 800 and 200 < langs[1] < 300  # q = .75 / .25, not .9 / .1
    small = Counter(int(b) for lang, b in order if lang == 1)
    assert set(small) == set(range(100)) and max(small.values()) - min(small.values()) <= 1  # each block 2 or 3 times
    assert (order == sampled_order([900, 100], alpha=0.5, seed=3)).all()  # seeded: a resumed run draws the same


def test_balanced_texts_resample_each_language_and_refuse_a_missing_one():
    texts, record = balanced_texts({"en": [f"e{i}" for i in range(90)], "sw": [f"s{i}" for i in range(10)]}, 0.5)
    counts = Counter(t[0] for t in texts)
    assert counts == {"e": 75, "s": 25} and record["sampled_sentences"] == {"en": 75, "sw": 25}
    assert len({t for t in texts if t[0] == "s"}) == 10  # all ten sw sentences, repeated
    with pytest.raises(PtmError, match="no text in sw"):
        balanced_texts({"en": ["a b"], "sw": []}, 0.5)


def test_stream_blocks_are_xlm_streams():
    blocks = stream_blocks([[5, 6], [7], [8, 9, 10]], cls_id=2, sep_id=3, max_length=5)
    assert blocks == [[2, 5, 6, 3, 7], [2, 3, 8, 9, 10]]  # the last ([CLS] [SEP]), shorter than half, is dropped


# -- the Unigram tokenizer and balancing ---------------------------------------------------------------------------
def test_balanced_sampling_lowers_the_fertility_of_the_low_resource_languages(aligned, tmp_path, monkeypatch):
    """English and Spanish have the Bible too (8x the Quran's verses here); sampled with alpha 0.3 the Unigram
    vocabulary spends more pieces on the others, which then need fewer tokens per word (zh: per character)."""
    monkeypatch.setenv("PTM_CACHE_DIR", str(tmp_path))
    langs, high = ["ar", "en", "es", "ru", "bn"], {"en", "es"}
    quran_train, bible = split_texts(["quran"], langs, "train"), split_texts(["bible_en_es"], ["en", "es"], "train")
    train = {lang: quran_train[lang][:200] + bible.get(lang, [])[:1600] for lang in langs}
    held = {lang: texts[:300] for lang, texts in split_texts(["quran"], langs, "validation").items()}
    before, after = (fertility(load_tokenizer(TokenizerSpec(train="unigram", vocab_size=1500, alpha=a),
                                              lambda: train, "fertility"), held) for a in (1.0, 0.3))
    for lang in set(langs) - high:
        assert after[lang] < before[lang] - 0.1, (lang, before[lang], after[lang])
    for lang in high:
        assert after[lang] > before[lang], (lang, before[lang], after[lang])
    assert before["ar"] > before["en"]  # the low-resource script is cut into more pieces to begin with


def test_tokenizer_trained_without_a_requested_language_is_refused(aligned, tmp_path, monkeypatch):
    monkeypatch.setenv("PTM_CACHE_DIR", str(tmp_path))
    spec = TokenizerSpec(train="unigram", vocab_size=800, alpha=0.5)
    en_es = MultilingualDataModule(spec, sources=["bible_en_es"], limit_documents=300)
    tok = en_es.load_tokenizer()
    tok.save_pretrained(tmp_path / "copy")  # as a run and an export save it: the languages go along
    for where in (tok.name_or_path, str(tmp_path / "copy")):
        with pytest.raises(PtmError) as err:
            MultilingualDataModule(TokenizerSpec(pretrained=where), sources=["quran", "bible_en_es"],
                                   languages=["en", "es", "ar"]).load_tokenizer()
        assert str(err.value).startswith(f"the tokenizer {where} was trained without ar (it knows en, es)")
    with pytest.raises(PtmError, match="cannot represent its script") as err:  # Arabic through an en/es tokenizer
        check_representable(tok, ["بِسۡمِ ٱللَّهِ ٱلرَّحۡمَٰنِ ٱلرَّحِيمِ"])
    assert "4 of its 8 pieces are the unknown token [UNK] (100% of its characters)" in str(err.value)
    check_representable(tok, ["In the beginning God created the heavens"])  # its own languages pass


def test_unknown_language_code_names_the_ones_the_data_has(aligned):
    with pytest.raises(PtmError) as err:
        _ = MultilingualDataModule(TokenizerSpec(train="unigram"), languages=["en", "xx"]).languages
    assert str(err.value) == ("language 'xx' is not in the data (quran, bible_en_es); the data has ar, bn, en, es, "
                              "fr, ind, ru, sv, tr, ur, zh")
    with pytest.raises(PtmError, match="'en-fr' uses fr, not among the languages en, es"):
        _ = MultilingualDataModule(TokenizerSpec(train="unigram"), pairs=["en-fr"], languages=["en", "es"]).languages
