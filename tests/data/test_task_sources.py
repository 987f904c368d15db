"""The derived task sets of `data prepare` (brown_pos, wordnet_*, bbc_headlines) on the real registry artifacts."""
from __future__ import annotations

import functools
import hashlib
import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from ptm_app.data.prepare import prepare, split_records
from ptm_app.data.sources import SOURCES, load_manifest
from ptm_app.data.sources import wordnet as wn
from ptm_app.data.sources.brown_pos import UNIVERSAL_TAGS, universal_tag
from ptm_app.data.sources.fetch import Artifact, fetch
from ptm_app.errors import PtmError

SPLITS = ("train", "validation", "test")
NEW = ("brown_pos", "wordnet_qa", "wordnet_pairs", "wordnet_supersense", "bbc_headlines")


def _records(root: Path, name: str, split: str) -> list[dict]:
    with open(root / name / f"{split}.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


@functools.lru_cache(maxsize=4)
def _all(root: Path, name: str) -> dict[str, list[dict]]:
    """All splits of a prepared set, read once per session (callers must not modify them)."""
    return {s: _records(root, name, s) for s in SPLITS}


def _manifest(root: Path, name: str) -> dict:
    return json.loads((root / name / "manifest.json").read_text(encoding="utf-8"))


def _disjoint(groups: dict[str, set]) -> bool:
    a, b, c = (groups[s] for s in SPLITS)
    return not (a & b or a & c or b & c)


# ------------------------------------------------------------------------------------------------ brown_pos
def test_brown_pos_counts_and_tags(prepared: Path) -> None:
    splits = _all(prepared, "brown_pos")
    rows = [r for s in SPLITS for r in splits[s]]
    assert len(rows) == 57_340 and sum(len(r["words"]) for r in rows) == 1_161_192
    assert all(len(r["words"]) == len(r["tags"]) == len(r["raw_tags"]) for r in rows)
    tags = Counter(t for r in rows for t in r["tags"])
    assert set(tags) == set(UNIVERSAL_TAGS)
    assert tags.most_common(1)[0][0] == "NOUN"
    total = _manifest(prepared, "brown_pos")["counts"]["total"]
    assert (total["records"], total["sentences"], total["tokens"], total["docs"]) == (57_340, 57_340, 1_161_192, 500)
    first = next(r for r in splits["train"] + splits["validation"] + splits["test"] if r["id"] == "ca01:1")
    assert first["doc"] == "ca01" and first["genre"] == "news"
    assert first["words"][:3] == ["The", "Fulton", "County"] and first["raw_tags"][:3] == ["at", "np-tl", "nn-tl"]
    assert first["tags"][:3] == ["DET", "NOUN", "NOUN"]


@pytest.mark.parametrize("raw, tag", [
    ("nn", "NOUN"), ("vbd", "VERB"), ("at", "DET"), ("in", "ADP"), ("cc", "CONJ"), ("np-tl", "NOUN"),
    (".", "."), ("fw-nn", "X"), ("fw-in+at-t", "X"), ("nns$-tl-hl", "NOUN"), ("nn$", "NOUN"), ("pp$", "PRON"),
    ("pp$$", "PRON"), ("wp$", "PRON"), ("bez*", "VERB"), ("md*-hl", "VERB"), ("*", "ADV"), ("*-hl", "ADV"),
    ("ppss+ber", "PRON"), ("ppss+ber-n", "PRON"), ("vb+ppo", "VERB"), ("wdt+ber+pp", "DET"), ("---hl", "."),
    ("``", "."), ("''", "."), ("(-hl", "."), ("cd", "NUM"), ("od", "ADJ"), ("cs", "ADP"), ("to", "PRT"),
    ("rp", "PRT"), ("jjt", "ADJ"), ("ql", "ADV"), ("ex", "DET"), ("uh", "X"), ("nil", "X"), ("pn", "PRON"),
])
def test_brown_to_universal_spot_checks(raw: str, tag: str) -> None:
    assert universal_tag(raw) == tag


def test_unknown_brown_tag_is_refused() -> None:
    with pytest.raises(KeyError):
        universal_tag("zz")


def test_brown_pos_documents_never_cross_splits(prepared: Path) -> None:
    splits = _all(prepared, "brown_pos")
    docs = {s: {r["doc"] for r in splits[s]} for s in SPLITS}
    assert _disjoint(docs)
    brown_ids = {s: {r["id"] for r in _records(prepared, "brown", s)} for s in SPLITS}
    assert docs == brown_ids  # the same documents per split as brown: no POS test document in LM training
    for s in SPLITS:  # a document's sentences are consecutive and in order
        ids = [r["id"] for r in splits[s]]
        assert ids == sorted(ids, key=lambda i: (i.split(":")[0], int(i.split(":")[1])))
    m = _manifest(prepared, "brown_pos")
    assert m["split"]["group_by"] == "doc" and m["split"]["by"] == "genre"
    assert [m["counts"][s]["docs"] for s in SPLITS] == [len(docs[s]) for s in SPLITS]


# ------------------------------------------------------------------------------------------------ wordnet_qa
def test_wordnet_qa_spans_and_counts(prepared: Path) -> None:
    splits = _all(prepared, "wordnet_qa")
    rows = [r for s in SPLITS for r in splits[s]]
    assert 45_000 <= len(rows) <= 50_000  # 47,427 with the documented matching rules (38,874 exact lemmas)
    for r in rows:
        (text,), (start,) = r["answers"]["text"], r["answers"]["answer_start"]
        assert r["context"][start:start + len(text)] == text and text
        assert set(r) == {"id", "question", "context", "answers", "lemma", "synset"}
        assert r["id"].startswith(r["synset"] + ":") and r["question"]
    c = _manifest(prepared, "wordnet_qa")["cleaning"]
    assert c["answers_exact_lemma"] + c["answers_irregular_form"] + c["answers_regular_inflection"] == len(rows)
    assert c["records"] + c["examples_unmatched"] + c["examples_skipped_no_definition"] == c["examples"]
    sample = next(r for r in rows if r["context"] == "the merging of the two groups occurred quickly")
    assert sample["answers"] == {"text": ["merging"], "answer_start": [4]}
    assert sample["question"] == "the act of joining together as one"


def test_wordnet_qa_split_by_synset(prepared: Path) -> None:
    synsets = {s: {r["synset"] for r in _all(prepared, "wordnet_qa")[s]} for s in SPLITS}
    assert _disjoint(synsets)
    m = _manifest(prepared, "wordnet_qa")
    assert m["split"]["group_by"] == "synset" and m["split"]["by"] == "word_class"
    assert set(m["counts"]["total"]["word_classes"]) == {"noun", "verb", "adj", "adv"}
    assert abs(m["counts"]["train"]["synsets"] / m["counts"]["total"]["synsets"] - 0.8) < 0.01
    assert "WordNet-derived" in m["description"] and "NOT SQuAD" in m["description"]


def test_surface_forms() -> None:
    exc = {"run": ["ran"], "goose": ["geese"]}
    verb = dict(wn.surface_forms("run", "verb", exc))
    assert verb["run"] == "exact" and verb["ran"] == "irregular" and verb["running"] == "regular"
    assert {"runs", "running"} <= set(verb)
    assert {"bakes", "baked", "baking"} <= {f for f, _ in wn.surface_forms("bake", "verb", {})}
    assert {"carries", "carried"} <= {f for f, _ in wn.surface_forms("carry", "verb", {})}
    assert ("ran out", "irregular") in wn.surface_forms("run out", "verb", exc)
    assert ("attorney generals", "regular") in wn.surface_forms("attorney general", "noun", {})
    assert dict(wn.surface_forms("goose", "noun", exc))["geese"] == "irregular"
    assert wn.surface_forms("able", "adj", {}) == [("able", "exact")]


# ------------------------------------------------------------------------------------------------ wordnet_pairs
def test_wordnet_pairs_balanced_and_negatives(prepared: Path) -> None:
    splits = _all(prepared, "wordnet_pairs")
    for s in SPLITS:
        labels = Counter(r["label"] for r in splits[s])
        assert labels["match"] == labels["mismatch"] == len(splits[s]) // 2
    rows = [r for s in SPLITS for r in splits[s]]
    assert len(rows) == 2 * 117_659
    by_synset: dict[str, dict[str, dict]] = {}
    for r in rows:
        synset, label = r["id"].rsplit(":", 1)
        assert label == r["label"] and set(r) == {"id", "text", "text_pair", "label"}
        by_synset.setdefault(synset, {})[label] = r
    assert all(len(v) == 2 for v in by_synset.values())
    for pair in by_synset.values():
        assert pair["mismatch"]["text_pair"].lower() != pair["match"]["text_pair"].lower()
        assert pair["mismatch"]["text"] == pair["match"]["text"]
    synsets = {s: {r["id"].rsplit(":", 1)[0] for r in splits[s]} for s in SPLITS}
    assert _disjoint(synsets)


def test_wordnet_pairs_negatives_are_deterministic(prepared: Path, shared_downloads: Path) -> None:
    again, _ = wn.read_pairs(shared_downloads / wn.ARTIFACT.file)  # a second draw, in this process
    written = {r["id"]: r["text_pair"] for s in SPLITS for r in _all(prepared, "wordnet_pairs")[s]}
    assert {r["id"]: r["text_pair"] for r in again} == written


# ------------------------------------------------------------------------------------------------ wordnet_supersense
def test_wordnet_supersense(prepared: Path) -> None:
    rows = [r for s in SPLITS for r in _records(prepared, "wordnet_supersense", s)]
    assert len(rows) == 20_000
    labels = Counter(r["label"] for r in rows)
    assert set(labels) <= set(wn.SUPERSENSES) and len(labels) == len(wn.SUPERSENSES) == 41
    assert all(lab.startswith(("noun.", "verb.")) for lab in labels)
    assert 0.10 < labels.most_common(1)[0][1] / len(rows) < 0.15  # noun.artifact, ~12 %
    assert len({r["text"] for r in rows}) == len(rows)  # no definition in two records (or two splits)
    m = _manifest(prepared, "wordnet_supersense")
    assert "20,000" in m["derivation"]["subsample"] and m["cleaning"]["records"] == 20_000
    assert m["split"]["method"].startswith("synset-level")
    assert wn.LEXNAMES[3] == "noun.Tops" and wn.LEXNAMES[43] == "verb.weather" and len(wn.LEXNAMES) == 45


# ------------------------------------------------------------------------------------------------ bbc_headlines
def test_bbc_headlines_follow_bbc(prepared: Path) -> None:
    for s in SPLITS:
        heads, bbc = _records(prepared, "bbc_headlines", s), _records(prepared, "bbc", s)
        assert [r["id"] for r in heads] == [r["id"] for r in bbc]
        assert all(h["target"] == b["headline"] and h["text"] == b["text"] for h, b in zip(heads, bbc))
        assert all(set(h) == {"id", "text", "target"} for h in heads)
    m = _manifest(prepared, "bbc_headlines")
    assert m["counts"]["total"]["records"] == 2127 and m["derived_from"].startswith("bbc")


# ------------------------------------------------------------------------------------------------ machinery
def test_new_sets_registered_after_the_originals() -> None:
    assert list(SOURCES)[:4] == ["bbc", "tweets", "brown", "minilm"] and set(NEW) <= set(SOURCES)
    assert SOURCES["brown_pos"].artifact == SOURCES["brown"].artifact
    assert SOURCES["bbc_headlines"].artifact == SOURCES["bbc"].artifact


def test_wordnet_manifest_and_idempotency(fresh_env: Path, capsys: pytest.CaptureFixture) -> None:
    prepare(["wordnet_supersense"])
    m = load_manifest("wordnet_supersense")
    assert m["source"] == {"registry": "apt", "package": "wordnet-base", "version": "1:3.0-37",
                           "file": "wordnet-base_1%3a3.0-37_all.deb", "sha256": wn.DEB_SHA256}
    assert m["kind"] == "task" and m["format_version"] == 1 and "WordNet 3.0" in m["licence"]
    assert m["derived_from"].startswith("wordnet-base 1:3.0-37") and "WordNet-derived" in m["description"]
    assert m["counts"]["total"]["records"] == sum(m["counts"][s]["records"] for s in SPLITS) == 20_000
    assert set(m["fields"]) == {"id", "text", "label"} and m["files"] == [f"{s}.jsonl" for s in SPLITS]
    files = sorted((fresh_env / "wordnet_supersense").iterdir())
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in files}
    capsys.readouterr()
    assert prepare(["wordnet_supersense"]) == [fresh_env / "wordnet_supersense"]
    assert "already prepared" in capsys.readouterr().out
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in files} == before
    prepare(["wordnet_supersense"], force=True)  # rebuilt: the same bytes
    assert {p: p.read_bytes() for p in files} == {p: v[1] for p, v in before.items()}


def test_deb_hash_mismatch_is_one_line_error(fresh_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / wn.ARTIFACT.file).write_bytes(b"not the pinned wordnet-base package")
    monkeypatch.setenv("PTM_DOWNLOAD_CACHE", str(cache))
    with pytest.raises(PtmError) as exc:
        prepare(["wordnet_qa"])
    msg = str(exc.value)
    assert "\n" not in msg and wn.DEB_SHA256 in msg and wn.ARTIFACT.file in msg and "delete" in msg
    assert not (fresh_env / "wordnet_qa").exists()


def test_apt_download_updates_lists_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTM_DOWNLOAD_CACHE", str(tmp_path))
    art = Artifact("apt", "some-pkg", "1:2.0-1", "some-pkg_1%3a2.0-1_all.deb", hashlib.sha256(b"deb").hexdigest())
    calls = []

    def fake_run(cmd, cwd=None, **_):
        calls.append(cmd)
        if cmd[:2] == ["apt-get", "download"] and len(calls) == 1:
            return subprocess.CompletedProcess(cmd, 100, "", "E: Unable to locate package some-pkg\n")
        if cmd[:2] == ["apt-get", "download"]:
            (Path(cwd) / art.file).write_bytes(b"deb")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    assert fetch(art) == tmp_path / art.file
    assert calls == [["apt-get", "download", "-q", "some-pkg=1:2.0-1"], ["apt-get", "update", "-q"],
                     ["apt-get", "download", "-q", "some-pkg=1:2.0-1"]]


def test_apt_update_failure_is_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTM_DOWNLOAD_CACHE", str(tmp_path))
    art = Artifact("apt", "some-pkg", "1.0", "some-pkg_1.0_all.deb", "0" * 64)

    def fake_run(cmd, **_):
        if cmd[1] == "update":
            return subprocess.CompletedProcess(cmd, 100, "", "E: Could not open lock file - open (13: Permission denied)\n")
        return subprocess.CompletedProcess(cmd, 100, "", "E: Version '1.0' for 'some-pkg' was not found\n")

    monkeypatch.setattr(subprocess, "run", fake_run)
    with pytest.raises(PtmError) as exc:
        fetch(art)
    msg = str(exc.value)
    assert "\n" not in msg and "apt-get update" in msg and "Permission denied" in msg and "some-pkg" in msg
    assert [p.name for p in tmp_path.iterdir()] == []


def test_split_records_group_by() -> None:
    recs = [{"id": f"d{d:02d}:{i}", "doc": f"d{d:02d}", "genre": "ab"[d % 2]} for d in range(40) for i in range(1, 4)]
    splits = split_records(list(reversed(recs)), "genre", group_by="doc")
    docs = {s: {r["doc"] for r in splits[s]} for s in SPLITS}
    assert _disjoint(docs) and [len(docs[s]) for s in SPLITS] == [32, 4, 4]
    assert sum(map(len, splits.values())) == 120
    units = split_records([{"id": f"d{d:02d}", "genre": "ab"[d % 2]} for d in range(40)], "genre")
    assert {s: {u["id"] for u in units[s]} for s in SPLITS} == docs  # the same as splitting the documents
    assert [r["doc"] for r in splits["train"]] == sorted(r["doc"] for r in splits["train"])
    with pytest.raises(ValueError, match="spans several genre"):
        split_records([{"id": "a", "doc": "x", "genre": "g1"}, {"id": "b", "doc": "x", "genre": "g2"}],
                      "genre", group_by="doc")
