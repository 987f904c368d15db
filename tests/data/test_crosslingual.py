"""``python main.py crosslingual``: retrieval accuracy@1, zero-shot transfer with its gap, the intervals, the book ->
genre map, the report between markers, and the one-line errors."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ptm_app.errors import PtmError
from ptm_app.experiments.crosslingual import GENRES, crosslingual, probe_hits, retrieval_hits
from ptm_app.experiments.stats import bootstrap_interval, seed_interval
from tests.conftest import TINY_BERT, run_main
from tests.data.test_multilingual import aligned, aligned_root  # noqa: F401  (fixtures)


def test_retrieval_hits_find_the_translation_by_cosine():
    rng = np.random.default_rng(0)
    src = rng.normal(size=(5, 8))
    tgt = src * 3 + rng.normal(scale=0.01, size=(5, 8))  # scaled: cosine, not distance
    assert retrieval_hits(src, tgt).all()
    swapped = tgt[[1, 0, 2, 3, 4]]
    assert retrieval_hits(src, swapped).tolist() == [False, False, True, True, True]


def test_probe_transfers_to_a_shifted_language_only_as_far_as_it_is_aligned():
    rng = np.random.default_rng(0)
    y = ["a", "b"] * 100
    x = np.asarray([[1.0 if t == "a" else -1.0, 0.0] for t in y]) + rng.normal(scale=0.3, size=(200, 2))
    hits = probe_hits(x, y, {"en": (x, y), "aligned": (x + [0, 5], y), "flipped": (-x, y)})
    assert hits["en"].mean() > 0.95 and hits["aligned"].mean() > 0.95 and hits["flipped"].mean() < 0.05


def test_intervals():
    lo, hi = bootstrap_interval([1] * 70 + [0] * 30, seed=0)
    assert lo < 0.7 < hi and 0.05 < hi - lo < 0.25  # ~ +-1.96 * sqrt(.21/100) = +-0.09
    assert seed_interval([0.5, 0.6, 0.7]) == pytest.approx((0.6 - 4.303 * 0.1 / 3 ** 0.5, 0.6 + 4.303 * 0.1 / 3 ** 0.5),
                                                           abs=1e-3)
    assert np.isnan(seed_interval([0.5])[0])


def test_every_bible_book_has_a_genre(aligned):  # noqa: F811
    books = {json.loads(line)["book"] for s in ("train", "validation", "test")
             for line in open(aligned / "bible_en_es" / f"{s}.jsonl", encoding="utf-8")}
    assert len(books) == 66 and books <= set(GENRES)
    assert {GENRES[b] for b in books} == {"law", "history", "wisdom", "prophets", "gospels", "letters", "apocalyptic"}


def tiny_encoder(root: Path) -> Path:
    """A randomly initialised tiny BERT with a Unigram tokenizer of the aligned sets: any encoder will do."""
    from transformers import BertConfig, BertModel

    from ptm_app.data.multilingual import MultilingualDataModule
    from ptm_app.data.tokenizer import TokenizerSpec

    tok = MultilingualDataModule(TokenizerSpec(train="unigram", vocab_size=1500), limit_documents=200).load_tokenizer()
    out = root / "tiny"
    config = {k: v for k, v in TINY_BERT.items() if k != "model_type"}
    BertModel(BertConfig(vocab_size=len(tok), **config)).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.mark.slow  # ~30-70 s on 2 busy cores: a Unigram tokenizer of 11 languages, then 2 x 3 languages encoded
def test_report_goes_between_the_markers_with_consistent_gaps(aligned, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("PTM_CACHE_DIR", str(tmp_path / "cache"))
    encoder = tiny_encoder(tmp_path)
    doc = tmp_path / "doc.md"
    doc.write_text("# x\n<!-- xl:start -->\nold\n<!-- xl:end -->\ntail\n", encoding="utf-8")
    results = crosslingual([f"tiny={encoder}"], seeds=[0, 1], limit=30, limit_train=60,
                           languages=["en", "es", "zh"], name="xl", readme=str(doc))
    text = doc.read_text(encoding="utf-8")
    assert "old" not in text and text.endswith("<!-- xl:end -->\ntail\n")
    assert "| tiny | en->x |" in text and "verse -> revelation period" in text and "verse -> book genre" in text
    quran = results["tiny"]["transfer"]["quran"]
    for lang in ("es", "zh"):  # the gap is English's accuracy minus the language's, seed by seed
        gap = results["tiny"]["transfer"]["quran:gap"][lang]
        assert gap["seeds"] == pytest.approx([e - x for e, x in zip(quran["en"]["seeds"], quran[lang]["seeds"])])
        assert gap["low"] <= gap["mean"] <= gap["high"]
    assert set(results["tiny"]["retrieval"]) == {"quran:es", "quran:zh", "bible_en_es:es"}
    assert all(0 <= c["mean"] <= 1 and c["n"] == 30 for r in results["tiny"]["retrieval"].values() for c in r.values())


@pytest.mark.parametrize("args,message", [
    (["--encoder", "m=minilm", "--languages", "[en, xx]"],
     "error: language 'xx' is not in the data (quran, bible_en_es); the data has ar, bn, en, es, fr, ind, ru, sv, tr, "
     "ur, zh"),
    (["--encoder", "m=minilm", "--languages", "[es, fr]"], "error: --languages must include en"),
    (["--encoder", "minilm"], "error: --encoder 'minilm': give LABEL=REF"),
])
def test_bad_input_is_one_line(args, message, tmp_path, capsys):
    assert run_main(["crosslingual", *args], tmp_path) != 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(message), err


def test_readme_without_markers_is_refused_before_any_work(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("no markers\n", encoding="utf-8")
    with pytest.raises(PtmError, match="has no '<!-- multilingual:start -->'"):
        crosslingual(["m=minilm"], readme=str(doc))
