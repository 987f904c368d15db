"""``wordnet_kg``: WordNet 3.0 as a knowledge graph, for KEPLER-style link prediction (Wang et al. 2021, TACL §2-4).

Entities are synsets (``entities.jsonl``: id, lemmas as names, the gloss's definition as description); triples are
read off the wndb(5WN) pointers that ``wordnet.py`` parses (``Synset.pointers``). Lexical (word-to-word) pointers,
such as antonymy and derivation, are mapped to their synsets. Self-loops and duplicates are dropped.

Two evaluation settings, one training file (so one run is evaluated on both):

- the entities of any triple are split into disjoint train/validation/test sets (80/10/10), as KEPLER's Wikidata5M
  inductive setting (§4.3); ``inductive/validation.jsonl`` and ``inductive/test.jsonl`` hold the triples between
  two validation (test) entities, which never occur in training; triples across two entity sets are dropped;
- the triples between two train entities form the transductive split (``train/validation/test.jsonl``),
  WN18RR-style (Dettmers et al. 2018 §5): grouped by *unordered entity pair*, so a triple and its inverse
  (h hypernym t / t hyponym h, both antonym directions ...) always share a split and no test triple can be answered
  by its inverse in train. A check then drops any validation/test triple whose inverse is in train (0 by
  construction, counted), and those with an entity train never shows (every evaluated entity is seen, as WN18RR).

``train.jsonl`` trains both settings.
"""
from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from pathlib import Path

from ptm_app import paths
from ptm_app.data.sources import wordnet
from ptm_app.data.sources.fetch import progress

KIND = "task"
ARTIFACT = wordnet.ARTIFACT
LICENCE = wordnet.LICENCE
FORMAT_VERSION = 1
SEED = 1234
SPLIT_BY = "relation"  # the field counted per split; what is split is the entity pair or the entity (``unit``)
PAIR_FRACTIONS = {"validation": 0.05, "test": 0.05}  # transductive: of the entity pairs
ENTITY_FRACTIONS = {"validation": 0.1, "test": 0.1}  # inductive: of the entities in any triple
INDUCTIVE = "inductive"

# wndb(5WN) pointer symbol -> relation name; lexical pointers (source/target != 0000) are mapped to synsets
RELATIONS: dict[str, str] = {
    "@": "hypernym", "~": "hyponym", "@i": "instance_hypernym", "~i": "instance_hyponym",
    "%p": "part_meronym", "#p": "part_holonym", "%m": "member_meronym", "#m": "member_holonym",
    "%s": "substance_meronym", "#s": "substance_holonym",
    "!": "antonym", "+": "derivation", "&": "similar_to", "$": "verb_group", "^": "also_see",
}
_PAIRS = [("hypernym", "hyponym"), ("instance_hypernym", "instance_hyponym"), ("part_meronym", "part_holonym"),
          ("member_meronym", "member_holonym"), ("substance_meronym", "substance_holonym")]
INVERSE: dict[str, str] = {**{a: b for a, b in _PAIRS}, **{b: a for a, b in _PAIRS},
                           **{r: r for r in ("antonym", "derivation", "similar_to", "verb_group", "also_see")}}

DESCRIPTION = ("WordNet 3.0 as a knowledge graph: synsets (lemmas, gloss definition) and triples over "
               f"{len(RELATIONS)} pointer relations; a WN18RR-style transductive split (by entity pair) and an "
               "inductive one (disjoint entity sets), for link prediction.")
DERIVED_FROM = wordnet._DERIVED
FIELDS = {
    "entities.jsonl": "{id: <offset>-<n|v|a|r>, names: [lemmas, '_' as space], description: the gloss's definition, "
                      "word_class}",
    "head": "synset id of the triple's head (train/validation/test.jsonl and inductive/*.jsonl)",
    "relation": f"one of {', '.join(RELATIONS.values())}",
    "tail": "synset id of the triple's tail",
    "head_name / tail_name": "a mention of each entity: its first lemma (the text of K-Adapter's relation "
                             "classification, e.g. TaskDataModule text_field: head_name, text_pair_field: tail_name)",
}


def triples(synsets) -> tuple[list[tuple[str, str, str]], dict]:
    """The graph's (head, relation, tail) triples, sorted, and counts of what was mapped or dropped."""
    out: set[tuple[str, str, str]] = set()
    stats: Counter = Counter()
    for syn in synsets:
        for symbol, target, source_word, _ in syn.pointers:
            relation = RELATIONS.get(symbol)
            if relation is None:
                stats["pointers_other_relations"] += 1
                continue
            if target == syn.id:
                stats["self_loops_dropped"] += 1
                continue
            stats["lexical_pointers_mapped_to_synsets" if source_word else "semantic_pointers"] += 1
            out.add((syn.id, relation, target))
    stats["duplicates_dropped"] = stats["lexical_pointers_mapped_to_synsets"] + stats["semantic_pointers"] - len(out)
    return sorted(out), dict(sorted(stats.items()))


def transductive_split(graph: list[tuple[str, str, str]], seed: int = SEED) -> tuple[dict[str, list], dict]:
    """WN18RR-style split by unordered entity pair (see the module docstring), with the counts of each step."""
    by_pair: dict[tuple[str, str], list] = defaultdict(list)
    for h, r, t in graph:
        by_pair[min(h, t), max(h, t)].append((h, r, t))
    pairs = sorted(by_pair)
    random.Random(seed).shuffle(pairs)
    n_test, n_val = (int(len(pairs) * PAIR_FRACTIONS[s] + 0.5) for s in ("test", "validation"))
    parts = {"test": pairs[:n_test], "validation": pairs[n_test:n_test + n_val], "train": pairs[n_test + n_val:]}
    split = {name: sorted(t for p in units for t in by_pair[p]) for name, units in parts.items()}
    train = set(split["train"])
    seen = {e for h, _, t in train for e in (h, t)}
    stats = {"entity_pairs": len(pairs), "pairs_by_split": {k: len(v) for k, v in parts.items()}}
    for name in ("validation", "test"):
        leaked = [x for x in split[name] if (x[2], INVERSE[x[1]], x[0]) in train]
        kept = [x for x in split[name] if (x[2], INVERSE[x[1]], x[0]) not in train]
        unseen = [x for x in kept if x[0] not in seen or x[2] not in seen]
        split[name] = [x for x in kept if x[0] in seen and x[2] in seen]
        stats[name] = {"inverse_in_train_removed": len(leaked), "unseen_entity_removed": len(unseen)}
    return split, stats


def inductive_split(graph: list[tuple[str, str, str]], seed: int = SEED) -> tuple[dict[str, list], dict]:
    """Disjoint entity sets; a triple goes to the split holding both its entities (see the module docstring)."""
    entities = sorted({e for h, _, t in graph for e in (h, t)})
    random.Random(seed).shuffle(entities)
    n_test, n_val = (int(len(entities) * ENTITY_FRACTIONS[s] + 0.5) for s in ("test", "validation"))
    owner = {e: "test" for e in entities[:n_test]}
    owner.update({e: "validation" for e in entities[n_test:n_test + n_val]})
    owner.update({e: "train" for e in entities[n_test + n_val:]})
    split: dict[str, list] = {"train": [], "validation": [], "test": []}
    crossing = 0
    for h, r, t in graph:
        if owner[h] == owner[t]:
            split[owner[h]].append((h, r, t))
        else:
            crossing += 1
    stats = {"entities_by_split": dict(sorted(Counter(owner.values()).items())),
             "triples_across_entity_sets_dropped": crossing}
    return split, stats


def _write_triples(path: Path, rows: list[tuple[str, str, str]], names: dict[str, str]) -> None:
    with paths.atomic_file(path, encoding="utf-8") as fh:
        for h, r, t in rows:
            fh.write(json.dumps({"head": h, "relation": r, "tail": t, "head_name": names[h], "tail_name": names[t]},
                                ensure_ascii=False) + "\n")


def _counts(rows: list[tuple[str, str, str]]) -> dict:
    return {"records": len(rows), "entities": len({e for h, _, t in rows for e in (h, t)}),
            "relations": dict(sorted(Counter(r for _, r, _ in rows).items()))}


def write(archives: list[Path], out: Path) -> dict:
    """Write ``entities.jsonl``, the transductive and the inductive split into ``out``; return the manifest facts."""
    synsets, _ = wordnet.load(archives[0])
    graph, cleaning = triples(progress(synsets, "wordnet_kg: reading pointers"))
    with paths.atomic_file(out / "entities.jsonl", encoding="utf-8") as fh:
        for s in synsets:
            fh.write(json.dumps({"id": s.id, "names": list(s.lemmas), "description": s.definition,
                                 "word_class": s.pos}, ensure_ascii=False) + "\n")
    names = {s.id: s.lemmas[0] if s.lemmas else s.id for s in synsets}  # a mention of the entity: its first lemma
    inductive, i_stats = inductive_split(graph)
    transductive, t_stats = transductive_split(inductive["train"])
    (out / INDUCTIVE).mkdir()
    for name in ("train", "validation", "test"):
        _write_triples(out / f"{name}.jsonl", transductive[name], names)
    for name in ("validation", "test"):
        _write_triples(out / INDUCTIVE / f"{name}.jsonl", inductive[name], names)
    train_entities = {e for h, _, t in transductive["train"] for e in (h, t)}
    counts = {name: _counts(rows) for name, rows in transductive.items()}
    counts["total"] = {**_counts(graph), "entities_in_file": len(synsets)}
    counts[INDUCTIVE] = {name: _counts(inductive[name]) for name in ("validation", "test")}
    for name in ("validation", "test"):
        seen = sum(h in train_entities or t in train_entities for h, _, t in inductive[name])
        counts[INDUCTIVE][name]["triples_with_an_entity_seen_in_train"] = seen
    split = {
        "seed": SEED, "by": SPLIT_BY, "unit": "unordered entity pair (transductive), entity (inductive)",
        "training_file": "train.jsonl (both settings)",
        "inductive": {
            "files": [f"{INDUCTIVE}/validation.jsonl", f"{INDUCTIVE}/test.jsonl"],
            "fractions_of_entities": ENTITY_FRACTIONS,
            "method": "as KEPLER's Wikidata5M inductive setting (Wang et al. 2021 §4.3): the entities of any triple "
                      "sorted, shuffled with random.Random(seed); test = round(n*0.1), validation = round(n*0.1), "
                      "train = the rest; a triple goes to the split holding both its entities, triples between two "
                      "sets are dropped; validation/test entities never occur in train.jsonl.",
            **i_stats, "triples_between_train_entities": len(inductive["train"])},
        "transductive": {
            "files": ["train.jsonl", "validation.jsonl", "test.jsonl"], "fractions_of_entity_pairs": PAIR_FRACTIONS,
            "method": "over the triples between two inductive-train entities, WN18RR-style (Dettmers et al. 2018 "
                      "§5): triples grouped by unordered entity pair {h, t}; the pairs sorted, shuffled with "
                      "random.Random(seed); test = round(n*0.05), validation = round(n*0.05), train = the rest. A "
                      "triple and its inverse (INVERSE: hypernym/hyponym, instance_hypernym/instance_hyponym, each "
                      "meronym/holonym, and the symmetric antonym, derivation, similar_to, verb_group, also_see) "
                      "therefore share a split. Then every validation/test triple (h, r, t) with (t, inverse(r), h) "
                      "in train is removed, and every one with an entity absent from train. Both relations of each "
                      "inverse pair are kept.",
            **t_stats},
    }
    return {"split": split, "counts": counts, "cleaning": {**cleaning, "synsets": len(synsets)},
            "derived_from": DERIVED_FROM, "relations": {"pointer_symbols": RELATIONS, "inverse": INVERSE},
            "files": ["entities.jsonl", "train.jsonl", "validation.jsonl", "test.jsonl",
                      *split["inductive"]["files"]]}
