"""Seeded text perturbations for robustness tests: character typos, word dropout and WordNet synonym swaps.

Each is a pure function ``(text, rate, rng) -> (text, changed words)`` that changes ``round(rate * words)`` of the
text's words (capped at the words it can change), chosen without replacement, and leaves the whitespace between
words as it was.  A word is a run of non-space characters; a typo goes to one of its letters.
- ``typo_swap``, ``typo_drop``, ``typo_insert``, ``typo_replace``: one character edit per chosen word (two
  adjacent different letters swapped; a letter deleted; a random letter inserted; a letter replaced by a different
  one), the four edit kinds of Belinkov & Bisk 2018 and Pruthi et al. 2019.
- ``word_dropout``: the chosen words are deleted (at least one word is kept).
- ``synonym``: a chosen word becomes another one-word lemma of a WordNet synset it is a lemma of (so the same part
  of speech), first letter's case kept; only words of three or more letters with such a lemma, and no function
  words, can be chosen (the WordNet-synonym attack of Ren et al. 2019, without their word-saliency ranking).
"""
from __future__ import annotations

import functools
import random
import re
import string
from collections import defaultdict
from typing import Callable, Optional

PERTURBATIONS = ("typo_swap", "typo_drop", "typo_insert", "typo_replace", "word_dropout", "synonym")
LETTERS = string.ascii_lowercase
FUNCTION_WORDS = frozenset(
    "a an the and or but nor so yet if then than of in on at by for with to from into onto up down out off over "
    "under about as is am are was were be been being do does did have has had i me my we us our you your he him "
    "his she her it its they them their this that these those not no can will would shall should may might must "
    "who whom whose which what".split())
_PIECES = re.compile(r"(\s+)")


def _words(text: str) -> list[str]:
    """The text as alternating words and whitespace runs (joined back, it is the text)."""
    return [p for p in _PIECES.split(text) if p != ""]


def _letters(word: str) -> list[int]:
    return [i for i, c in enumerate(word) if c.isalpha()]


def typo(kind: str, word: str, rng: random.Random) -> Optional[str]:
    """One character edit of ``word`` (None when it has no letter to edit that way)."""
    letters = _letters(word)
    if kind == "typo_swap":
        spots = [i for i in letters if i + 1 < len(word) and word[i + 1].isalpha() and word[i] != word[i + 1]]
        if not spots:
            return None
        i = rng.choice(spots)
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    if not letters or (kind == "typo_drop" and len(word) < 2):
        return None
    i = rng.choice(letters)
    if kind == "typo_drop":
        return word[:i] + word[i + 1:]
    if kind == "typo_insert":
        return word[:i] + rng.choice(LETTERS) + word[i:]
    new = rng.choice([c for c in LETTERS if c != word[i].lower()])
    return word[:i] + (new.upper() if word[i].isupper() else new) + word[i + 1:]


def _chosen(candidates: list[int], total: int, rate: float, rng: random.Random) -> list[int]:
    """``round(rate * total)`` of the candidate positions (all of them when fewer), in text order."""
    k = min(len(candidates), round(rate * total))
    return sorted(rng.sample(candidates, k))


def perturb(text: str, kind: str, rate: float, rng: random.Random,
            synonyms: Optional[dict[str, tuple[tuple[str, ...], ...]]] = None) -> tuple[str, int]:
    """``text`` with ``rate`` of its words perturbed by ``kind``; returns ``(new text, words changed)``."""
    pieces = _words(text)
    words = [i for i, p in enumerate(pieces) if not p.isspace()]
    if kind == "word_dropout":
        chosen = set(_chosen(words, len(words), rate, rng)[:max(0, len(words) - 1)])
        if not chosen:
            return text, 0
        out: list[str] = []
        for i in words:  # each kept word after the whitespace that preceded it
            if i not in chosen:
                out += [pieces[i - 1] if out and i > 0 and pieces[i - 1].isspace() else "" if not out else " ",
                        pieces[i]]
        return "".join(out), len(chosen)
    if kind == "synonym":
        if synonyms is None:
            raise ValueError("synonym perturbation needs a synonym table")
        can = [i for i in words if _synonym_key(pieces[i]) in synonyms]
        edit: Callable[[str], Optional[str]] = lambda w: _swap_synonym(w, synonyms, rng)  # noqa: E731
    else:
        can = [i for i in words if typo(kind, pieces[i], random.Random(0)) is not None]
        edit = lambda w: typo(kind, w, rng)  # noqa: E731
    changed = 0
    for i in _chosen(can, len(words), rate, rng):
        new = edit(pieces[i])
        if new is not None and new != pieces[i]:
            pieces[i] = new
            changed += 1
    return "".join(pieces), changed


def count_words(text: str) -> int:
    return sum(not p.isspace() for p in _words(text))


# ---------------------------------------------------------------------------------------------- synonyms
_BARE = re.compile(r"^([^A-Za-z]*)([A-Za-z]+)([^A-Za-z]*)$")


def _synonym_key(word: str) -> Optional[str]:
    m = _BARE.match(word)
    if not m or len(m.group(2)) < 3 or m.group(2).lower() in FUNCTION_WORDS:
        return None
    return m.group(2).lower()


def _swap_synonym(word: str, synonyms: dict, rng: random.Random) -> Optional[str]:
    m = _BARE.match(word)
    key = _synonym_key(word)
    if key is None or key not in synonyms:
        return None
    group = rng.choice(synonyms[key])
    new = rng.choice(group)
    if m.group(2)[0].isupper():
        new = new[0].upper() + new[1:]
    return m.group(1) + new + m.group(3)


def synonym_table(synsets) -> dict[str, tuple[tuple[str, ...], ...]]:
    """lower-case one-word lemma -> per synset it is a lemma of, that synset's other one-word lemmas (only synsets
    that have some; WordNet 3.0 ``wordnet.Synset`` records)."""
    table: dict[str, list[tuple[str, ...]]] = defaultdict(list)
    for syn in synsets:
        lemmas = [lem.lower() for lem in syn.lemmas if lem.isalpha()]
        lemmas = list(dict.fromkeys(lemmas))
        for lem in lemmas:
            others = tuple(o for o in lemmas if o != lem)
            if others and len(lem) >= 3 and lem not in FUNCTION_WORDS:
                table[lem].append(others)
    return {k: tuple(v) for k, v in table.items()}


@functools.lru_cache(maxsize=1)
def wordnet_synonyms() -> dict[str, tuple[tuple[str, ...], ...]]:
    """The synonym table of WordNet 3.0 (the .deb the data sources fetch and verify)."""
    from ptm_app.data.sources import wordnet
    from ptm_app.data.sources.fetch import fetch

    synsets, _ = wordnet.load(fetch(wordnet.ARTIFACT))
    return synonym_table(synsets)
