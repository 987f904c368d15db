"""Relation files for the knowledge probe (LAMA, Petroni et al. 2019 §3): one JSONL per relation, one fact a line,
``{"relation": ..., "template": ..., "subject": ..., "object": ...}``.  A template names the subject ``[X]`` and the
object's slot ``[MASK]`` ("A [X] is a kind of [MASK].").

The built-in relations are read off WordNet 3.0's pointers (the Debian ``wordnet-base`` package the data sources
fetch, ``data/sources/wordnet.py``; wndb(5WN): after the words, ``p_cnt`` then ``pointer_symbol offset pos
source/target`` per pointer): hypernymy (``@``), part-of (``#p``, part holonym), member-of (``#m``, member holonym),
antonymy (``!``, a word-to-word pointer between adjectives) and the supersense (the noun's lexicographer file,
``noun.animal`` -> ``animal``).  Subjects and objects are lemmas of lower-case letters (proper nouns, numbers and
hyphenated forms left out); every (subject, object) pair is one fact.  The files are written once, atomically,
into ``<cache>/knowledge/`` and reused.
"""
from __future__ import annotations

import functools
import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ptm_app.data.formats import read_records
from ptm_app.errors import DataFormatError, PtmError

SLOT, SUBJECT = "[MASK]", "[X]"
FIELDS = ("relation", "template", "subject", "object")
FORMAT_VERSION = 1
_LEMMA = re.compile(r"^[a-z]+(?: [a-z]+)*$")


@dataclass(frozen=True)
class Fact:
    relation: str
    template: str
    subject: str
    object: str


@dataclass(frozen=True)
class WordNetRelation:
    """A relation read off WordNet pointers (``symbol`` from the synsets of ``pos``), or the supersense."""

    name: str
    pos: str
    symbol: str
    template: str
    description: str


WORDNET_RELATIONS: dict[str, WordNetRelation] = {r.name: r for r in (
    WordNetRelation("hypernym", "noun", "@", "A [X] is a kind of [MASK].", "noun -> a lemma of its hypernym synset"),
    WordNetRelation("part_of", "noun", "#p", "A [X] is part of a [MASK].", "noun -> its part holonym (wheel -> car)"),
    WordNetRelation("member_of", "noun", "#m", "A [X] is a member of a [MASK].",
                    "noun -> its member holonym (player -> team)"),
    WordNetRelation("antonym", "adj", "!", "The opposite of [X] is [MASK].", "adjective -> its antonym (hot -> cold)"),
    WordNetRelation("supersense", "noun", "", "The noun [X] belongs to the category [MASK].",
                    "noun -> its supersense, the lexicographer file without 'noun.' (dog -> animal)"),
)}


def check_template(template: str, where: str) -> str:
    """A template has exactly one ``[MASK]`` slot and one ``[X]``; one line naming ``where`` otherwise."""
    if template.count(SLOT) != 1:
        raise PtmError(f"{where}: template {template!r} has {template.count(SLOT)} {SLOT} slots; a cloze template "
                       f"needs exactly one {SLOT} where the object goes, e.g. 'A {SUBJECT} is a kind of {SLOT}.'")
    if template.count(SUBJECT) != 1:
        raise PtmError(f"{where}: template {template!r} has {template.count(SUBJECT)} {SUBJECT} slots; put the "
                       f"subject in as {SUBJECT} exactly once, e.g. 'A {SUBJECT} is a kind of {SLOT}.'")
    return template


def read_facts(path: str | Path, template: Optional[str] = None) -> list[Fact]:
    """The facts of one relation file; a malformed line is one ``file:line`` message.  ``template`` (when given)
    replaces the lines' own."""
    path = Path(path)
    if not path.is_file():
        raise PtmError(f"relation file {path} does not exist; give a built-in relation "
                       f"({', '.join(WORDNET_RELATIONS)}) or the path of a JSONL with {', '.join(FIELDS)} per line")
    if template is not None:
        check_template(template, f"templates.{path.stem}")
    facts: list[Fact] = []
    for number, record in read_records(path):  # one JSON object a line; a malformed line is file:line
        wanted = FIELDS[1:] if template is not None else FIELDS
        for name in wanted:
            if not isinstance(record.get(name), str) or not record[name].strip():
                raise DataFormatError(path, number, f"missing or empty field '{name}'",
                                      f"every line needs {', '.join(FIELDS)} (strings)")
        own = template if template is not None else record["template"]
        if template is None:
            check_template(own, f"{path}:{number}")
        facts.append(Fact(str(record.get("relation") or path.stem), own, record["subject"].strip(),
                          record["object"].strip()))
    if not facts:
        raise PtmError(f"relation file {path} has no facts; add lines with {', '.join(FIELDS)}")
    return facts


# ---------------------------------------------------------------------------------------------- WordNet
def _clean(word: str) -> str:
    return re.sub(r"\((a|p|ip)\)$", "", word).replace("_", " ")


def parse_pointers(text: str, pos: str) -> dict[str, tuple[tuple[str, ...], int, list[tuple[str, str, int, int]]]]:
    """``{synset id: (words, lex_filenum, [(symbol, target id, source word, target word), ...])}`` of one
    ``data.<pos>`` file (word numbers 1-based, 0 = the whole synset; ids as ``wordnet.Synset.id``)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("  "):
            continue
        f = line.partition(" | ")[0].split()
        n_words = int(f[3], 16)
        words = tuple(_clean(f[4 + 2 * i]) for i in range(n_words))
        at = 4 + 2 * n_words
        pointers = []
        for k in range(int(f[at])):
            symbol, offset, target_pos, numbers = f[at + 1 + 4 * k: at + 5 + 4 * k]
            pointers.append((symbol, f"{offset}-{'a' if target_pos == 's' else target_pos}",
                             int(numbers[:2], 16), int(numbers[2:], 16)))
        out[f"{f[0]}-{'a' if f[2] == 's' else f[2]}"] = (words, int(f[1]), pointers)
    return out


@functools.lru_cache(maxsize=1)
def _pointers(deb: str) -> dict:
    from ptm_app.data.sources import wordnet

    files = wordnet.deb_files(Path(deb), [f"usr/share/wordnet/data.{p}" for p in ("noun", "adj")])
    table = {}
    for pos in ("noun", "adj"):
        table.update(parse_pointers(files[f"usr/share/wordnet/data.{pos}"].decode("utf-8", "replace"), pos))
    return table


def wordnet_facts(relation: WordNetRelation, table: dict) -> list[Fact]:
    """Every (subject, object) pair of ``relation`` in the parsed pointer table, sorted."""
    from ptm_app.data.sources.wordnet import LEXNAMES

    tag = relation.pos[0]
    pairs: set[tuple[str, str]] = set()
    for sid, (words, lexfile, pointers) in table.items():
        if not sid.endswith(f"-{tag}"):
            continue
        if relation.name == "supersense":
            name = LEXNAMES.get(lexfile, "")
            if name.startswith("noun.") and name != "noun.Tops":
                pairs.update((w, name.split(".", 1)[1].lower()) for w in words)
            continue
        for symbol, target, source_word, target_word in pointers:
            if symbol != relation.symbol or target not in table:
                continue
            others = table[target][0]
            subjects = words if source_word == 0 else words[source_word - 1:source_word]
            objects = others if target_word == 0 else others[target_word - 1:target_word]
            pairs.update((s, o) for s in subjects for o in objects)
    return [Fact(relation.name, relation.template, s, o) for s, o in sorted(pairs)
            if s != o and _LEMMA.match(s) and _LEMMA.match(o)]


def write_facts(facts: list[Fact], path: Path) -> Path:
    from ptm_app.paths import atomic_file

    with atomic_file(path, "w", encoding="utf-8") as fh:
        for fact in facts:
            fh.write(json.dumps({"relation": fact.relation, "template": fact.template, "subject": fact.subject,
                                 "object": fact.object}) + "\n")
    return path


def relation_file(name: str) -> Path:
    """The JSONL of a built-in WordNet relation (built once into ``<cache>/knowledge/``), or ``name`` as a path."""
    if name not in WORDNET_RELATIONS:
        return Path(name).expanduser()
    from ptm_app.data.sources import wordnet
    from ptm_app.data.sources.fetch import fetch
    from ptm_app.paths import cache_root

    path = cache_root() / "knowledge" / f"wordnet-{wordnet.DEB_SHA256[:12]}-v{FORMAT_VERSION}" / f"{name}.jsonl"
    if not path.is_file():
        write_facts(wordnet_facts(WORDNET_RELATIONS[name], _pointers(str(fetch(wordnet.ARTIFACT)))), path)
    return path


def valid_objects(facts: list[Fact]) -> dict[tuple[str, str], set[str]]:
    """Every object of each (relation, subject): LAMA's filtered ranking leaves the other valid ones out
    (Petroni et al. 2019 §4, after Bordes et al. 2013)."""
    out: dict[tuple[str, str], set[str]] = defaultdict(set)
    for fact in facts:
        out[fact.relation, fact.subject].add(fact.object)
    return out
