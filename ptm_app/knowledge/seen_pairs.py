"""The word pairs the knowledge pre-trainings see as training pairs, so a knowledge probe can leave them out.

LIBERT (Lauscher et al. 2020 §3) classifies ``wordnet_lexrel``'s train pairs (synonyms, hyponym-hypernym) and
KEPLER (Wang et al. 2021 §2.2) embeds ``wordnet_kg``'s train triples.  A LAMA cloze (Petroni et al. 2019) of
WordNet hypernymy drawn from all of WordNet would score those two models partly on their own training pairs;
``held_out`` keeps the facts that neither trains on.  Pairs are unordered and lower-case; a triple between two
synsets covers every pair of their lemmas (``wordnet_kg`` maps word-level pointers to synsets too).
"""
from __future__ import annotations

import json
from pathlib import Path

from ptm_app.analysis.knowledge_facts import WORDNET_RELATIONS, Fact

Pair = frozenset[str]


def lexrel_pairs(root: Path) -> set[Pair]:
    """The related (non-``none``) pairs of ``<root>/train.jsonl`` (``data prepare wordnet_lexrel``)."""
    pairs = set()
    with open(root / "train.jsonl", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if row["relation"] != "none":
                pairs.add(frozenset((row["text"].lower(), row["text_pair"].lower())))
    return pairs


def graph_pairs(root: Path, relation: str) -> set[Pair]:
    """The lemma pairs of ``<root>/train.jsonl``'s triples of the probe ``relation`` or its inverse
    (``data prepare wordnet_kg``); none for a relation the graph does not hold (the supersense)."""
    from ptm_app.data.sources.wordnet_kg import INVERSE, RELATIONS

    name = RELATIONS.get(WORDNET_RELATIONS[relation].symbol) if relation in WORDNET_RELATIONS else None
    if name is None:
        return set()
    wanted, links = {name, INVERSE[name]}, []
    with open(root / "train.jsonl", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if row["relation"] in wanted:
                links.append((row["head"], row["tail"]))
    ends = {e for link in links for e in link}
    names: dict[str, list[str]] = {}
    with open(root / "entities.jsonl", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if row["id"] in ends:
                names[row["id"]] = [n.lower() for n in row["names"]]
    return {frozenset((a, b)) for h, t in links for a in names.get(h, ()) for b in names.get(t, ()) if a != b}


def held_out(facts: list[Fact], seen: set[Pair]) -> list[Fact]:
    """The facts whose (subject, object) pair, in either order, is not in ``seen``."""
    return [f for f in facts if frozenset((f.subject, f.object)) not in seen]


def knowledge_training_pairs(relation: str) -> set[Pair]:
    """What LIBERT and KEPLER train on, of ``relation``: the prepared ``wordnet_lexrel`` and ``wordnet_kg``."""
    from ptm_app.data.sources import prepared_dir

    return lexrel_pairs(prepared_dir("wordnet_lexrel")) | graph_pairs(prepared_dir("wordnet_kg"), relation)
