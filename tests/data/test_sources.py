"""`data prepare` on the real registry artifacts: counts, cleaning, splits, idempotency, failures."""
from __future__ import annotations

import hashlib
import json
import random
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from ptm_app.data import prepare as prep
from ptm_app.data.prepare import prepare, split_records
from ptm_app.main import main
from ptm_app.data.sources import SOURCES, load_manifest, prepared_dir
from ptm_app.data.sources.fetch import Artifact, fetch
from ptm_app.data.sources.tweets import MOJIBAKE, clean_text
from ptm_app.errors import PtmError

SPLITS = ("train", "validation", "test")
DATASETS = ("bbc", "tweets", "brown")


def _records(root: Path, name: str, split: str) -> list[dict]:
    with open(root / name / f"{split}.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def _manifest(root: Path, name: str) -> dict:
    return json.loads((root / name / "manifest.json").read_text(encoding="utf-8"))


def test_bbc_counts_and_cleaning(prepared: Path) -> None:
    m = _manifest(prepared, "bbc")
    assert m["kind"] == "task" and m["source"]["sha256"] == SOURCES["bbc"].artifact.sha256
    assert m["cleaning"]["files_read"] == 2225
    assert m["cleaning"]["dropped_duplicates"] == 98
    assert m["cleaning"]["decoded_as_cp1252"] == 1  # sports/199 is not UTF-8
    assert m["counts"]["total"]["records"] == 2127
    assert sorted(m["counts"]["total"]["labels"]) == ["business", "entertainment", "politics", "sports", "tech"]
    rows = [r for s in SPLITS for r in _records(prepared, "bbc", s)]
    assert len({(r["headline"], r["text"]) for r in rows}) == 2127
    first = min(rows, key=lambda r: r["id"])
    assert first["id"] == "business/001" and first["headline"] == "Ad sales boost Time Warner profit"
    assert "\n\n" not in first["text"] and "£600m" in first["text"]


def test_tweets_cleaning_adds_up(prepared: Path) -> None:
    c = _manifest(prepared, "tweets")["cleaning"]
    dropped = sum(v for k, v in c.items() if k.startswith("dropped_") and isinstance(v, int))
    assert c["rows_read"] == 38158 == c["kept"] + dropped
    assert c["clean"] + c["repaired"] == c["kept"] + c["dropped_conflicting_rows"] + c["dropped_duplicates"]
    assert 0.10 < c["dropped_mojibake"] / c["rows_read"] < 0.16  # "about 13 %"
    assert 30 <= c["conflicting_label_texts"] <= 46
    rows = [r for s in SPLITS for r in _records(prepared, "tweets", s)]
    assert len(rows) == c["kept"] > 30_000
    assert len({r["text"] for r in rows}) == len(rows)
    assert Counter(r["label"] for r in rows).keys() == {"negative", "neutral", "positive"}
    assert not any(MOJIBAKE.search(r["text"]) for r in rows)
    assert all(r["confidence"] is None or 0 <= r["confidence"] <= 1 for r in rows)


def test_clean_text_repairs_or_rejects() -> None:
    assert clean_text(b"plain") == ("plain", "clean")
    assert clean_text("naïve café £5 😀".encode()) == ("naïve café £5 😀", "clean")
    assert clean_text("Iâ€™m".encode()) == ("I’m", "repaired")  # UTF-8 read as cp1252
    assert clean_text(b"caf\x8e") == ("café", "repaired")  # Mac Roman bytes
    assert clean_text(b"I don\xd5\xa2_\x8a\xce_\x86\xa2t") == (None, "mojibake")  # real row, lossy


def test_brown_counts(prepared: Path) -> None:
    total = _manifest(prepared, "brown")["counts"]["total"]
    assert (total["records"], total["sentences"], total["tokens"]) == (500, 57_340, 1_161_192)
    assert len(total["genres"]) == 15
    doc = next(r for r in _records(prepared, "brown", "train") + _records(prepared, "brown", "test")
               + _records(prepared, "brown", "validation") if r["id"] == "ca01")
    assert doc["genre"] == "news"
    assert doc["sentences"][0]["words"][:2] == ["The", "Fulton"] and doc["sentences"][0]["tags"][:2] == ["at", "np-tl"]
    assert doc["text"].split("\n")[0].startswith("The Fulton County Grand Jury said Friday")


def test_minilm_loads_offline(data_env: Path) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    path = prepared_dir("minilm")
    m = load_manifest("minilm")["model"]
    assert (m["hidden_size"], m["num_hidden_layers"], m["vocab_size"]) == (384, 6, 30522)
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True).eval()
    with torch.no_grad():
        out = model(**tok(["The film was excellent."], return_tensors="pt")).last_hidden_state
    assert out.shape[0] == 1 and out.shape[-1] == 384


@pytest.mark.parametrize("name", DATASETS)
def test_splits_disjoint_stratified_and_counted(prepared: Path, name: str) -> None:
    m = _manifest(prepared, name)
    key = m["split"]["by"]
    ids = {s: [r["id"] for r in _records(prepared, name, s)] for s in SPLITS}
    assert all(ids[s] == sorted(set(ids[s])) for s in SPLITS)  # sorted, no repeats
    assert not (set(ids["train"]) & set(ids["validation"]) or set(ids["train"]) & set(ids["test"])
                or set(ids["validation"]) & set(ids["test"]))
    assert sum(len(v) for v in ids.values()) == m["counts"]["total"]["records"]
    for s in SPLITS:
        assert m["counts"][s]["records"] == len(ids[s])
        assert m["counts"][s][f"{key}s"].keys() == m["counts"]["total"][f"{key}s"].keys()  # every stratum
    assert abs(len(ids["train"]) / m["counts"]["total"]["records"] - 0.8) < 0.02


def test_split_records_ignores_input_order() -> None:
    recs = [{"id": f"r{i:03d}", "label": "ab"[i % 2]} for i in range(60)]
    shuffled = recs[:]
    random.Random(0).shuffle(shuffled)
    a, b = split_records(recs, "label"), split_records(shuffled, "label")
    assert a == b and {k: len(v) for k, v in a.items()} == {"train": 48, "validation": 6, "test": 6}


def test_prepare_is_deterministic(prepared: Path, fresh_env: Path) -> None:
    prepare(list(DATASETS))
    for name in DATASETS:
        for f in ["manifest.json"] + [f"{s}.jsonl" for s in SPLITS]:
            assert (fresh_env / name / f).read_bytes() == (prepared / name / f).read_bytes(), f"{name}/{f}"


def test_second_run_does_not_rewrite(data_env: Path, capsys: pytest.CaptureFixture) -> None:
    files = [p for name in SOURCES for p in (data_env / name).rglob("*") if p.is_file()]
    before = {p: p.stat().st_mtime_ns for p in files}
    assert prepare() == [data_env / name for name in SOURCES]
    assert {p: p.stat().st_mtime_ns for p in files} == before
    assert capsys.readouterr().out.count("already prepared") == len(SOURCES)


def test_interrupted_write_leaves_no_partial_dir(fresh_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = prep.write_jsonl

    def write_then_fail(path: Path, records) -> None:
        real_write(path, records)
        if path.name == "validation.jsonl":
            raise RuntimeError("simulated crash")

    prepare(["bbc"])
    before = (fresh_env / "bbc" / "train.jsonl").read_bytes()
    monkeypatch.setattr(prep, "write_jsonl", write_then_fail)
    with pytest.raises(RuntimeError):
        prepare(["bbc"], force=True)  # the old complete dataset must survive
    assert (fresh_env / "bbc" / "train.jsonl").read_bytes() == before
    with pytest.raises(RuntimeError):
        prepare(["tweets"])  # a first preparation must leave nothing behind
    assert not (fresh_env / "tweets").exists()
    assert sorted(p.name for p in fresh_env.iterdir()) == ["bbc"]


def _artifact(file: str, content: bytes) -> Artifact:
    return Artifact("pypi", "some-pkg", "1.0", file, hashlib.sha256(content).hexdigest())


def test_sha_mismatch_is_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTM_DOWNLOAD_CACHE", str(tmp_path))
    (tmp_path / "pkg.whl").write_bytes(b"tampered")
    art = _artifact("pkg.whl", b"original")
    with pytest.raises(PtmError) as exc:
        fetch(art)
    msg = str(exc.value)
    assert "\n" not in msg and "pkg.whl" in msg and art.sha256 in msg
    assert hashlib.sha256(b"tampered").hexdigest() in msg and "delete" in msg


def test_cached_file_is_not_downloaded_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTM_DOWNLOAD_CACHE", str(tmp_path))
    (tmp_path / "pkg.whl").write_bytes(b"payload")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("downloaded again"))
    assert fetch(_artifact("pkg.whl", b"payload")) == tmp_path / "pkg.whl"


def test_download_failure_names_package_and_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTM_DOWNLOAD_CACHE", str(tmp_path))
    failed = subprocess.CompletedProcess([], 1, "", "ERROR: No matching distribution found for some-pkg==1.0\n")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(PtmError) as exc:
        fetch(_artifact("pkg.whl", b"x"))
    msg = str(exc.value)
    assert "\n" not in msg and "some-pkg" in msg and "pip download" in msg and "No matching distribution" in msg
    assert [p.name for p in tmp_path.iterdir()] == []  # no temp download dir left


def test_prepared_dir_messages(fresh_env: Path, tmp_path: Path) -> None:
    with pytest.raises(PtmError) as exc:
        prepared_dir("tweets")
    assert str(exc.value) == (f"dataset or model 'tweets' is not prepared (looked in {fresh_env / 'tweets'}); "
                              "run: python main.py data prepare tweets")
    with pytest.raises(PtmError) as exc:
        prepared_dir("imdb")
    assert "\n" not in str(exc.value) and all(name in str(exc.value) for name in SOURCES)
    assert prepared_dir(str(tmp_path)) == tmp_path.resolve()


def test_data_command(data_env: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert out.count(" prepared ") == len(SOURCES) and "2,127 records" in out and "1,161,192 tokens" in out
    with pytest.raises(PtmError, match="known: bbc, tweets, brown, minilm"):
        prepare(["imdb"])
    assert main(["data", "prepare", "imdb"]) == 2 and "known: bbc, tweets, brown, minilm" in capsys.readouterr().err
    assert main(["data", "frobnicate"]) == 2
