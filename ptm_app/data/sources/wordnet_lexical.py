"""``wordnet_lexrel``: WordNet lexical-relation word pairs for LIBERT (Lauscher et al. 2020, "Specializing
unsupervised pretraining models for word-level semantic similarity", §3.1 linguistic constraints).

LIBERT's lexical relation classification (LRC) task takes word pairs that stand in a semantic similarity
relation, *synonymy* or *hyponymy-hypernymy*, drawn from WordNet, single words only, and classifies
``[CLS] w1 [SEP] w2 [SEP]`` as related or not against negative pairs.  The paper builds its negatives inside
each batch (the most similar word by embedding); we draw them once, 1:1, at random, as random word pairs in
no such relation (documented in the manifest), so the set is a plain pair-classification task.

Read from the same Debian ``wordnet-base`` .deb as ``wordnet.py`` (its reader ``load`` for synsets; the
pointer fields it skips are read here: ``@`` = hypernym, wndb(5WN)).
"""
from __future__ import annotations

import itertools
import random
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

from ptm_app.data.sources import wordnet
from ptm_app.data.sources.fetch import deb_files, progress

SEED = 1234
SINGLE_WORD = re.compile(r"^[a-z]+$")  # lower-case alphabetic lemmas: single words, no proper nouns


def hypernym_links(deb: Path) -> list[tuple[str, str]]:
    """(synset id, hypernym synset id) for every ``@`` pointer of the noun and verb synsets (wndb(5WN):
    ``... w_cnt [word lex_id]... p_cnt [symbol offset pos source/target]... | gloss``)."""
    names = {pos: f"usr/share/wordnet/data.{pos}" for pos in ("noun", "verb")}
    files = deb_files(deb, names.values())
    links = []
    for pos, name in names.items():
        for line in files[name].decode("utf-8", "replace").splitlines():
            if not line or line.startswith("  "):
                continue
            f = line.partition(" | ")[0].split()
            i = 4 + 2 * int(f[3], 16)
            for k in range(int(f[i])):
                symbol, offset, target_pos = f[i + 1 + 4 * k: i + 4 + 4 * k]
                if symbol == "@":
                    links.append((f"{f[0]}-{pos[0]}", f"{offset}-{target_pos}"))
    return links


def relation_pairs(deb: Path) -> dict[tuple[str, str], tuple[str, str, str]]:
    """Unordered word pair -> (w1, w2, relation) for every synonym pair (two single-word lemmas of one
    synset) and hyponym-hypernym pair (a lemma of a synset, a lemma of its direct hypernym; w1 = the
    hyponym); a pair related both ways keeps ``synonym``."""
    synsets, _ = wordnet.load(deb)
    words = {s.id: sorted({lem for lem in s.lemmas if SINGLE_WORD.match(lem)}) for s in synsets}
    pairs: dict[tuple[str, str], tuple[str, str, str]] = {}
    for s in progress(synsets, "wordnet_lexrel: synonyms"):
        for a, b in itertools.combinations(words[s.id], 2):
            pairs[(a, b)] = (a, b, "synonym")
    for hypo, hyper in progress(hypernym_links(deb), "wordnet_lexrel: hypernyms"):
        for a in words[hypo]:
            for b in words[hyper]:
                if a != b:
                    pairs.setdefault(tuple(sorted((a, b))), (a, b, "hypernym"))
    return pairs


def read_lexrel(deb: Path) -> tuple[list[dict], dict]:
    pairs = relation_pairs(deb)
    vocab = sorted({w for key in pairs for w in key})
    rng = random.Random(SEED)
    records, taken, redrawn = [], set(pairs), 0
    for n, key in enumerate(sorted(pairs)):
        w1, w2, relation = pairs[key]
        records.append({"id": f"pos:{n}", "text": w1, "text_pair": w2, "label": "related", "relation": relation})
        while True:  # the negative keeps w1 and pairs it with a random word in no relation to it
            other = rng.choice(vocab)
            neg = tuple(sorted((w1, other)))
            if other != w1 and neg not in taken:
                break
            redrawn += 1
        taken.add(neg)
        records.append({"id": f"neg:{n}", "text": w1, "text_pair": other, "label": "unrelated", "relation": "none"})
    stats = {"words": len(vocab), "pairs": len(records), "negatives_redrawn": redrawn,
             "relations": dict(sorted(Counter(r["relation"] for r in records).items()))}
    return records, stats


LEXREL = SimpleNamespace(
    KIND="task", ARTIFACT=wordnet.ARTIFACT, LICENCE=wordnet.LICENCE, FORMAT_VERSION=1, read=read_lexrel,
    SPLIT_BY="relation", SPLIT_UNIT="word-pair",
    DESCRIPTION=("WordNet lexical-relation pairs for LIBERT's lexical relation classification (Lauscher et al. "
                 "2020): synonym and hyponym-hypernym single-word pairs ('related') and as many random word "
                 "pairs in neither relation ('unrelated'); every unordered word pair occurs once, so no pair is "
                 "in two splits."),
    DERIVED_FROM=wordnet._DERIVED + " (synsets and their '@' hypernym pointers)",
    DERIVATION={
        "words": "lemmas matching ^[a-z]+$ (single lower-case words: no multiword lemmas, no proper nouns)",
        "synonym": "two different such lemmas of one synset (any part of speech)",
        "hypernym": "a lemma of a noun or verb synset (text) and a lemma of a direct '@' hypernym of it "
                    "(text_pair); instance hypernyms (@i) are left out",
        "dedup": "one record per unordered word pair; a pair that is both keeps 'synonym'",
        "negative": f"one per positive, in pair order, with one random.Random({SEED}): the positive's text and a "
                    "random word of the set's vocabulary, drawn again while the unordered pair is a positive "
                    "pair or an earlier negative (so it is in no synonym or direct hypernym relation in any "
                    "sense) or the word itself",
        "split": "record (= unordered word pair) level, stratified by relation; pairs are unique, so no word "
                 "pair (in either order) is in two splits; words do recur across splits, as in LIBERT",
    },
    FIELDS={
        "id": "pos:<n> / neg:<n> (the negative drawn for positive n)",
        "text": "w1 (for hypernym pairs the hyponym)",
        "text_pair": "w2 (for hypernym pairs the hypernym)",
        "label": "related | unrelated",
        "relation": "synonym | hypernym | none",
    },
)
