"""Prompts as token ids (survey §5.7): a pattern (PET, Schick & Schütze 2021 §3) with its text fields and one answer
slot, a verbalizer (label → single-token words), and their encoding for one tokenizer, with PET's longest-first
truncation.  The prompt collators (``data.collators``) and the prompt modules (``adaptation.prompting``) build on
these.
"""
from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Optional, Sequence, Union

from ptm_app.errors import PtmError

FIELDS = ("text", "text_pair")
Fields = dict[str, Optional[Sequence[int]]]


@dataclass(frozen=True)
class Template:
    """A pattern (PET §3): literal text around ``{text}`` (optionally ``{text_pair}``) and exactly one answer slot,
    ``{mask}`` in cloze questions or ``{label}`` in in-context demonstrations; ``{{`` and ``}}`` are braces.

    A space just before the slot belongs to the answer's words (``"It was {mask}"`` scores ``" great"``), as
    byte-level BPE tokenizes words in running text; WordPiece ignores it."""

    pattern: str
    slot: str = "mask"

    def __post_init__(self) -> None:
        self.parts()

    def parts(self) -> list[tuple[str, str]]:
        """``("literal", text)``, ``("field", name)`` and one ``("slot", space before it)``, in order."""
        try:
            parsed = list(string.Formatter().parse(self.pattern))
        except ValueError as exc:
            raise PtmError(f"template {self.pattern!r}: {exc}; write literal braces as {{{{ and }}}}") from None
        allowed = (*FIELDS, self.slot)
        names = [name for _, name, _, _ in parsed if name is not None]
        for _, name, spec, conversion in parsed:
            if name is not None and (name not in allowed or spec or conversion):
                shown = name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
                raise PtmError(f"template {self.pattern!r}: unknown placeholder {{{shown}}}; "
                               f"use {{text}}, optionally {{text_pair}}, and one {{{self.slot}}}")
        counts = {name: names.count(name) for name in allowed}
        if counts[self.slot] != 1 or counts["text"] != 1 or counts["text_pair"] > 1:
            raise PtmError(f"template {self.pattern!r} needs exactly one {{{self.slot}}} and one {{text}} "
                           f"(found {counts[self.slot]} and {counts['text']}), and at most one {{text_pair}}")
        parts = []
        for literal, name, _, _ in parsed:
            space = ""
            if name == self.slot and literal.endswith(" "):
                literal, space = literal[:-1], " "
            if literal:
                parts.append(("literal", literal))
            if name is not None:
                parts.append(("slot", space) if name == self.slot else ("field", name))
        return parts

    @property
    def slot_space(self) -> str:
        """The space moved from the pattern into the answer's words."""
        return next(value for kind, value in self.parts() if kind == "slot")

    def render(self, answer: str, text: str, text_pair: str = "") -> str:
        """The filled pattern as text (``answer`` = the tokenizer's mask token for a cloze question)."""
        return self.pattern.format(**{self.slot: answer}, text=text, text_pair=text_pair)


@dataclass
class Verbalizer:
    """PET's verbalizer (§3): each label → one or more label words, each a single token of the tokenizer."""

    words: dict[str, Union[str, list[str]]]

    def __post_init__(self) -> None:
        self.words = {str(k): [v] if isinstance(v, str) else list(v) for k, v in self.words.items()}
        empty = [label for label, words in self.words.items() if not words]
        if empty:
            raise PtmError(f"verbalizer: label '{empty[0]}' has no label words; give it at least one")

    @classmethod
    def of(cls, words: Optional[dict], labels: Sequence[str]) -> "Verbalizer":
        """From a ``{label: word | [words]}`` mapping; None = each label's own name."""
        return cls(dict(words) if words is not None else {label: label for label in labels})

    def token_ids(self, tokenizer, labels: Sequence[str], space: str = "") -> list[list[int]]:
        """Per label (in ``labels`` order) its words' token ids; a word that is not exactly one known token is
        an error naming it."""
        if set(self.words) != set(labels):
            raise PtmError(f"verbalizer labels {sorted(self.words)} differ from the task's labels {sorted(labels)}; "
                           f"give every label its words (model.init_args.verbalizer)")
        out = []
        for label in labels:
            ids = []
            for word in self.words[label]:
                pieces = tokenizer(space + word, add_special_tokens=False)["input_ids"]
                if len(pieces) != 1:
                    shown = " ".join(tokenizer.convert_ids_to_tokens(pieces))
                    raise PtmError(f"verbalizer word '{word}' of label '{label}' is {len(pieces)} tokens ({shown}) for "
                                   f"this tokenizer; a label word must be a single token: choose another word")
                if pieces[0] == tokenizer.unk_token_id:
                    raise PtmError(f"verbalizer word '{word}' of label '{label}' is not in the tokenizer's vocabulary "
                                   f"(it becomes {tokenizer.unk_token}); choose another word")
                ids.append(pieces[0])
            out.append(ids)
        return out


def special_affixes(tokenizer) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after one sequence ([CLS] / [SEP]; a BOS; none)."""
    plain, full = tokenizer("a", add_special_tokens=False)["input_ids"], tokenizer("a")["input_ids"]
    start = full.index(plain[0])
    return full[:start], full[start + len(plain):]


def longest_first(lengths: list[int], budget: int) -> list[int]:
    """Drop the last token of the longest field until the total fits ``budget`` (PET's truncation)."""
    kept = list(lengths)
    while sum(kept) > budget:
        kept[kept.index(max(kept))] -= 1
    return kept


class PromptEncoder:
    """A template compiled for one tokenizer: literal pieces tokenized once; examples come as field token ids."""

    def __init__(self, template: Template, tokenizer):
        self.template, self.tokenizer = template, tokenizer
        self.pieces: list[Union[list[int], str, None]] = []  # literal ids, a field name, or None for the slot
        for kind, value in template.parts():
            if kind == "literal":
                self.pieces.append(tokenizer(value, add_special_tokens=False)["input_ids"])
            else:
                self.pieces.append(value if kind == "field" else None)
        self.prefix, self.suffix = special_affixes(tokenizer)

    def encode(self, fields: Fields, answer: list[int], budget: Optional[int] = None,
               until_slot: bool = False) -> tuple[list[int], int]:
        """The filled template's ids (no special tokens) and the index of the slot's first token.

        Fields are cut at their ends, longest first, to fit ``budget`` tokens, so the literal text and the
        slot always stay.  ``until_slot``: stop after the answer (an in-context query)."""
        pieces = self.pieces[: self.pieces.index(None) + 1] if until_slot else self.pieces
        names = [p for p in pieces if isinstance(p, str)]
        for name in names:
            if fields.get(name) is None:
                raise PtmError(f"template {self.template.pattern!r} uses {{{name}}} but the examples have no such "
                               f"field; set data.init_args.text_pair_field")
        lengths = [len(fields[name]) for name in names]
        if budget is not None:
            fixed = sum(len(p) for p in pieces if isinstance(p, list)) + len(answer)
            if budget - fixed < 1:
                raise PtmError(f"template {self.template.pattern!r} takes {fixed} tokens, leaving no room for the text "
                               f"within {budget} (data.max_length without special tokens); shorten the template "
                               f"or raise data.max_length")
            lengths = longest_first(lengths, budget - fixed)
        kept = dict(zip(names, lengths))
        ids: list[int] = []
        slot_at = -1
        for piece in pieces:
            if piece is None:
                slot_at = len(ids)
                ids += answer
            elif isinstance(piece, str):
                ids += list(fields[piece][: kept[piece]])
            else:
                ids += piece
        return ids, slot_at

    def cloze(self, fields: Fields, max_length: int) -> tuple[list[int], int]:
        """A PET input, special tokens included, with the mask token in the slot: ids and the mask's index."""
        budget = max_length - len(self.prefix) - len(self.suffix)
        content, at = self.encode(fields, [self.tokenizer.mask_token_id], budget)
        return self.prefix + content + self.suffix, len(self.prefix) + at
