"""ERNIE (Baidu) knowledge masking (Sun et al. 2019 §3.2): basic-level, phrase-level and entity-level masking.

A sentence is cut into *units*: at the basic level every word (all its sub-tokens) is a unit, as in
whole-word masking; at the phrase level every phrase is one unit and the other words stay units of their own;
at the entity level the same with named entities.  Units are drawn in random order and selected while they
fit in the 15 % token budget (``spans.unit_mask``, the rule of whole-word masking), so a phrase or an entity
is masked as a whole or not at all; each selected token then gets BERT's 80 % ``[MASK]`` / 10 % random /
10 % unchanged (Devlin et al. 2019 §3.1).  ERNIE trains the three levels as successive stages; ``mixed``
(entities, then phrases that do not overlap one, then words) puts all three kinds of unit in one draw.

Phrases and entities come per token as unit ids (``-1``: not in one); equal ids on consecutive tokens form a
unit.
"""
from __future__ import annotations

import random
from typing import Literal, Sequence

from ptm_app.data.corruption.spans import Span, unit_mask, whole_word_spans

Level = Literal["word", "phrase", "entity", "mixed"]
LEVELS: tuple[str, ...] = ("word", "phrase", "entity")  # ERNIE's three stages, in order


def _runs(unit_ids: Sequence[int]) -> list[Span]:
    """Token spans of the runs of equal non-negative ids."""
    out, i, n = [], 0, len(unit_ids)
    while i < n:
        j = i + 1
        if unit_ids[i] >= 0:
            while j < n and unit_ids[j] == unit_ids[i]:
                j += 1
            out.append((i, j))
        i = j
    return out


def knowledge_units(word_starts: Sequence[bool], phrase_ids: Sequence[int], entity_ids: Sequence[int],
                    level: Level) -> list[Span]:
    """The masking units of one sequence at ``level``, sorted by start, covering every token once.

    A knowledge unit (phrase/entity) is extended to whole words (a window may cut a word); words outside the
    chosen units are units of their own.
    """
    words = whole_word_spans(word_starts)
    if level == "word":
        return words
    kinds = {"phrase": [phrase_ids], "entity": [entity_ids], "mixed": [entity_ids, phrase_ids]}[level]
    word_of = [k for k, (a, b) in enumerate(words) for _ in range(a, b)]
    taken = [False] * len(words)
    units: list[Span] = []
    for ids in kinds:
        for start, end in _runs(ids):
            first, last = word_of[start], word_of[end - 1]
            if any(taken[first:last + 1]):  # mixed: a phrase overlapping an entity stays out
                continue
            taken[first:last + 1] = [True] * (last - first + 1)
            units.append((words[first][0], words[last][1]))
    units += [w for k, w in enumerate(words) if not taken[k]]
    return sorted(units)


def knowledge_mask(ids: Sequence[int], word_starts: Sequence[bool], phrase_ids: Sequence[int],
                   entity_ids: Sequence[int], rng: random.Random, *, level: Level, mask_token_id: int,
                   vocab_size: int, rate: float = 0.15, mask_ratio: float = 0.8, random_ratio: float = 0.1,
                   random_ids: Sequence[int] | None = None) -> tuple[list[int], list[int]]:
    """ERNIE masking of one sequence at ``level`` (see the module docstring)."""
    if not len(ids) == len(word_starts) == len(phrase_ids) == len(entity_ids):
        raise ValueError("ids, word_starts, phrase_ids and entity_ids need one entry per token")
    units = knowledge_units(word_starts, phrase_ids, entity_ids, level)
    return unit_mask(ids, units, rng, mask_token_id=mask_token_id, vocab_size=vocab_size, rate=rate,
                     mask_ratio=mask_ratio, random_ratio=random_ratio, random_ids=random_ids)
