"""``data prepare bible_en_es``: verse-aligned World English Bible / Reina-Valera 1909 pairs (XLM's TLM data,
Lample & Conneau 2019 §3.3): alignment, markup removal, book-level splits, the manifest, and xlm_tlm_bible.yaml as shipped."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from ptm_app.data.prepare import _is_current, prepare
from ptm_app.data.sources import SOURCES
from ptm_app.data.sources.bible import pair_verses, verse_text
from tests.conftest import run_main

ROOT = Path(__file__).resolve().parents[2]
SPLITS = ("train", "validation", "test")


@pytest.fixture(scope="module")
def bible_root(tmp_path_factory: pytest.TempPathFactory, shared_downloads: Path) -> Path:
    """A data root holding bible_en_es only (prepared here; the .debs come from the shared download cache)."""
    root = tmp_path_factory.mktemp("bible")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PTM_DATA_DIR", str(root))
        mp.setenv("PTM_DOWNLOAD_CACHE", str(shared_downloads))
        prepare(["bible_en_es"])
    return root


@pytest.fixture(scope="module")
def rows(bible_root: Path) -> dict[str, list[dict]]:
    return {split: [json.loads(line) for line in open(bible_root / "bible_en_es" / f"{split}.jsonl", encoding="utf-8")]
            for split in SPLITS}


@pytest.fixture(scope="module")
def manifest(bible_root: Path) -> dict:
    return json.loads((bible_root / "bible_en_es" / "manifest.json").read_text(encoding="utf-8"))


def test_known_verses_are_paired_with_their_translation(rows):
    by_id = {r["id"]: r for split in rows.values() for r in split}
    john = by_id["John.3.16"]
    assert (john["book"], john["chapter"], john["verse"], john["testament"]) == ("John", 3, 16, "nt")
    assert john["en"] == ("For God so loved the world, that he gave his only born Son, that whoever believes in him "
                          "should not perish, but have eternal life.")  # a footnote sat between "born" and "Son"
    assert john["es"] == ("Porque de tal manera amó Dios al mundo, que ha dado á su Hijo unigénito, para que todo "
                          "aquel que en él cree, no se pierda, mas tenga vida eterna.")
    gen = by_id["Gen.1.1"]
    assert gen["en"] == "In the beginning, God created the heavens and the earth."
    assert gen["es"] == "EN el principio crió Dios los cielos y la tierra."
    # canonical psalm titles are verse 1 on both sides
    assert by_id["Ps.3.1"]["en"].startswith("A Psalm by David, when he fled from Absalom his son. Yahweh, how")
    assert by_id["Ps.3.1"]["es"].startswith("Salmo de David, cuando huía de delante de Absalom su hijo. ¡OH Jehová")
    # a quotation's end tag no longer glues the next word; the glossary after Revelation is not verse text
    assert by_id["Matt.3.15"]["en"].endswith("to fulfill all righteousness.” Then he allowed him.")
    assert by_id["Rev.22.21"]["en"] == "The grace of the Lord Jesus Christ be with all the saints. Amen."
    assert by_id["Judg.1.1"]["en"].startswith("After the death of Joshua, the children of Israel asked of Yahweh, "
                                              "saying")  # a footnote sat after "Yahweh,"
    assert by_id["Judg.1.1"]["es"].startswith("Y ACONTECIÓ después de la muerte de Josué")
    # chapters the Reina-Valera divides like the Hebrew are left out (its Num.13.1 is KJV Num.12.16)
    assert not any(k.startswith(("Num.13.", "Jonah.2.", "1Kgs.22.")) for k in by_id)
    assert "Num.14.1" in by_id and "Jonah.3.1" in by_id


def test_no_markup_is_left_and_no_side_is_empty(rows):
    texts = [r[lang] for split in rows.values() for r in split for lang in ("en", "es")]
    assert all(t and t == t.strip() and "<" not in t and ">" not in t and "\x00" not in t and "  " not in t
               for t in texts)
    assert not any(" ," in t or " ." in t for t in texts)


def test_splits_are_disjoint_by_book_and_match_the_manifest(rows, manifest):
    books = {split: {r["book"] for r in recs} for split, recs in rows.items()}
    assert not books["train"] & books["validation"] and not books["train"] & books["test"]
    assert not books["validation"] & books["test"]
    assert len(books["train"] | books["validation"] | books["test"]) == 66
    counts = manifest["counts"]
    for split, recs in rows.items():
        assert counts[split]["records"] == len(recs) and counts[split]["books"] == len(books[split])
        assert {t: n for t, n in counts[split]["testaments"].items()} == {
            t: sum(r["testament"] == t for r in recs) for t in ("nt", "ot")}
        assert {"nt", "ot"} == set(counts[split]["testaments"])  # stratified: both testaments in every split
    ids = [r["id"] for recs in rows.values() for r in recs]
    assert len(ids) == len(set(ids)) == counts["total"]["records"] == manifest["cleaning"]["pairs"] == 30_400
    assert all(r["id"] == f"{r['book']}.{r['chapter']}.{r['verse']}" for recs in rows.values() for r in recs)
    assert manifest["split"]["group_by"] == "book" and manifest["split"]["by"] == "testament"


def test_manifest_counts_every_skipped_verse_and_pins_both_packages(manifest):
    c = manifest["cleaning"]
    assert c["verse_references"] == 31_102 and c["books"] == 66  # the KJV scheme: 23,145 OT + 7,957 NT verses
    assert c["skipped_empty_english"] == 7 and "Acts.8.37" in c["skipped_empty_references"]["en"]
    assert c["skipped_empty_spanish"] == 18 and "Num.12.16" in c["skipped_empty_references"]["es"]
    assert c["skipped_empty_both"] == 0
    assert c["verse_references"] == (c["pairs"] + c["skipped_empty_english"] + c["skipped_empty_spanish"]
                                     + c["skipped_in_those_chapters"] + c["skipped_length_ratio"])
    assert c["skipped_chapters_misfit_lengths"] == ["1Chr.21", "1Kgs.22", "Judg.14"]
    assert c["nrsva_only_references"] == ["3John.1.15", "Rev.12.18"] and c["nrsva_only_references_with_text"] == []
    assert manifest["source"]["package"] == "sword-text-web" and manifest["source"]["version"] == "426.0-1"
    assert [s["package"] for s in manifest["more_sources"]] == ["sword-text-sparv"]
    assert manifest["source"]["sha256"] == SOURCES["bible_en_es"].artifact.sha256
    assert manifest["more_sources"][0]["sha256"] == SOURCES["bible_en_es"].more_artifacts[0].sha256
    assert "Public domain" in manifest["licence"] and set(manifest["fields"]) >= {"id", "book", "en", "es"}


def test_a_changed_second_package_makes_the_set_outdated(bible_root, tmp_path):
    src = SOURCES["bible_en_es"]
    assert _is_current(src, bible_root / "bible_en_es")
    copy = tmp_path / "bible_en_es"
    shutil.copytree(bible_root / "bible_en_es", copy)
    m = json.loads((copy / "manifest.json").read_text(encoding="utf-8"))
    m["more_sources"][0]["sha256"] = "0" * 64
    (copy / "manifest.json").write_text(json.dumps(m), encoding="utf-8")
    assert not _is_current(src, copy)


def test_verse_markup_rules():
    w = '<w lemma="strong:G1">{}</w>'
    note = '<note placement="foot"><reference type="annotateRef">1:1 </reference>a note</note>'
    assert verse_text(w.format("God") + note + w.format("created") + " " + w.format("all")) == "God created all"
    assert verse_text(w.format("God") + note + ", and") == "God, and"
    assert verse_text(w.format("Yahweh") + "," + note + w.format("saying")) == "Yahweh, saying"
    assert verse_text(w.format("God") + note + "’s") == "God’s"
    assert verse_text('said, <q marker="">“Go.”</q>Then he went.') == "said, “Go.” Then he went."
    assert verse_text(w.format("ejército") + '<transChange type="added">se llamaba</transChange>'
                      + w.format("Sísara")) == "ejército se llamaba Sísara"
    assert verse_text('fué<transChange type="added">le</transChange> entregado') == "fuéle entregado"
    assert verse_text('<title canonical="true" type="psalm">A Psalm.</title> <l level="1"/>Yahweh<lb/>is') == \
        "A Psalm. Yahweh is"
    assert verse_text('<title type="main">Heading</title><speaker>Beloved</speaker> Let him') == "Let him"
    assert verse_text('Amen. <chapter eID="Rev.22"/> <div eID="g1" osisID="Rev" type="book"/> Glossary') == "Amen."


def test_shifted_chapters_and_omitted_verses_are_skipped_and_counted():
    lengths = [10, 60, 15, 80, 20, 70, 12, 50]

    def chapter(book, c, pairs):
        return [("ot", book, c, v, en, es) for v, (en, es) in enumerate(pairs, 1)]

    same = [("e" * n, "s" * n) for n in lengths]
    shifted = [("e" * a, "s" * b) for a, b in zip(lengths, lengths[1:] + [40])]  # each Spanish verse one later
    verses = (chapter("Num", 1, same) + chapter("Num", 2, same[:7] + [("the last verse", "")])
              + chapter("Num", 3, same) + chapter("Num", 4, [same[0], ("e" * 15, ""), *same[2:]])
              + chapter("Num", 5, same)
              + chapter("Num", 6, [same[0], ("", "s" * 60), same[2], ("e" * 80, "s" * 300), *same[4:]])
              + chapter("Num", 7, shifted))
    records, stats = pair_verses(verses)
    ids = [r["id"] for r in records]
    # Num 2 has an empty Spanish verse: it and Num 3 are skipped; so is Num 4 and, after it, Num 5
    assert {i.rsplit(".", 1)[0] for i in ids} == {"Num.1", "Num.6"}
    assert stats["skipped_chapters_after_empty_spanish_verse"] == ["Num.2", "Num.3", "Num.4", "Num.5"]
    assert stats["skipped_in_those_chapters"] == 7 + 8 + 7 + 8 + 8  # the last 8: Num 7, by its lengths
    assert stats["skipped_chapters_misfit_lengths"] == ["Num.7"]
    assert (stats["skipped_empty_spanish"], stats["skipped_empty_english"]) == (2, 1)
    assert stats["skipped_length_ratio_references"] == ["Num.6.4"]  # 300 characters against 80
    # an English verse the WEB omits is skipped alone (Num.6.2), and so is an uneven pair (Num.6.4)
    assert [i for i in ids if i.startswith("Num.6.")] == ["Num.6.1", "Num.6.3", "Num.6.5", "Num.6.6", "Num.6.7",
                                                          "Num.6.8"]
    assert stats["pairs"] == len(ids) == 14 and stats["verse_references"] == 8 * 7


def test_parallel_data_module_reads_the_prepared_splits(bible_root, rows, monkeypatch):
    from ptm_app.data.parallel import ParallelDataModule
    from ptm_app.data.tokenizer import TokenizerSpec

    monkeypatch.setenv("PTM_DATA_DIR", str(bible_root))
    dm = ParallelDataModule(TokenizerSpec(train="wordpiece", vocab_size=300), source_file="bible_en_es",
                            source_field="en", target_field="es", source_lang="en", target_lang="es")
    assert set(dm.sources) == set(SPLITS)
    for split in SPLITS:
        pairs = list(dm.sources[split].pairs())
        assert [(s, t) for _, s, t in pairs] == [(r["en"], r["es"]) for r in rows[split]]


@pytest.mark.slow
def test_xlm_recipe_runs_as_shipped(bible_root, tmp_path, monkeypatch):
    """configs/pretrain/xlm_tlm_bible.yaml with only the step count changed (about a minute on 2 busy cores)."""
    monkeypatch.setenv("PTM_DATA_DIR", str(bible_root))
    assert run_main(["fit", "--config", str(ROOT / "configs/pretrain/xlm_tlm_bible.yaml"), "--trainer.max_steps", "2"],
                    tmp_path) == 0
    ckpt = torch.load(tmp_path / "xlm_tlm_bible" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 2


def test_xlm_recipe_without_the_prepared_set_says_how_to_prepare_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PTM_DATA_DIR", str(tmp_path / "empty"))
    code = run_main(["fit", "--config", str(ROOT / "configs/pretrain/xlm_tlm_bible.yaml"), "--trainer.max_steps", "2"], tmp_path)
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2 and errors == [f"error: dataset or model 'bible_en_es' is not prepared (looked in "
                                    f"{tmp_path / 'empty' / 'bible_en_es'}); run: python main.py data prepare "
                                    f"bible_en_es"]
