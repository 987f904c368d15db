"""The input forms a task kind's predictions take: what ``predict --text/--input`` reads and what one ``serve``
request body holds (its fields, as data: ``serve`` builds the request model from them).

- ``text``: one text (``--text``, a .txt line, a record's text field; ``{"text": "..."}``);
- ``words``: one sentence as words (a record's ``words`` list, else its text split on whitespace);
- ``qa``: a (question, context) pair (``--question`` / ``--context``, or records with both fields);
- ``choices``: a question and its candidate answers, ``{"question": "...", "choices": ["...", ...]}`` (a ``--text``
  value is one such JSON object; ``--input`` a .jsonl / .csv file of such records).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ptm_app.errors import PtmError
from ptm_app.task_kinds.inputs import read_choices, read_inputs, read_questions, read_words


@dataclass(frozen=True)
class Inputs:
    """The command line's inputs and field names (``predict``'s arguments)."""

    ref: str
    texts: Optional[list[str]] = None
    input: Optional[str] = None
    questions: Optional[list[str]] = None
    contexts: Optional[list[str]] = None
    text_field: str = "text"
    words_field: str = "words"
    question_field: str = "question"
    context_field: str = "context"
    choices_field: str = "choices"
    id_field: str = "id"


@dataclass(frozen=True)
class InputForm:
    """``read(inputs) -> (examples, ids, shown texts or None)``; ``fields``: the serve request body's fields and
    types; ``decode(body) -> (example, shown text or None)`` for one request (a PtmError answers 422)."""

    name: str
    fields: dict[str, Any]
    read: Callable[[Inputs], tuple[list, Optional[list], Optional[list[str]]]]
    decode: Callable[[dict], tuple[Any, Optional[str]]]

    @property
    def example(self) -> str:
        """An example request body, for messages."""
        return json.dumps({name: ["...", "..."] if kind == list[str] else "..." for name, kind in self.fields.items()})


def _no_questions(inputs: Inputs) -> None:
    if inputs.questions or inputs.contexts:
        raise PtmError(f"--question / --context are for extractive QA runs; {inputs.ref} takes --text or --input")


def _read_text(inputs: Inputs):
    _no_questions(inputs)
    found, ids = read_inputs(inputs.texts, inputs.input, inputs.text_field, inputs.id_field)
    return found, ids, found


def _read_words(inputs: Inputs):
    _no_questions(inputs)
    sentences, ids = read_words(inputs.texts, inputs.input, inputs.text_field, inputs.words_field, inputs.id_field)
    return sentences, ids, list(inputs.texts) if inputs.texts else None


def _read_qa(inputs: Inputs):
    if inputs.texts:
        raise PtmError(f"{inputs.ref} answers questions: give --question \"...\" --context \"...\" (not --text), "
                       f"or --input FILE with '{inputs.question_field}' and '{inputs.context_field}' fields")
    pairs, ids = read_questions(inputs.questions, inputs.contexts, inputs.input, inputs.question_field,
                                inputs.context_field, inputs.id_field)
    return pairs, ids, None


def _read_choices(inputs: Inputs):
    _no_questions(inputs)
    examples, ids = read_choices(inputs.texts, inputs.input, inputs.question_field, inputs.choices_field,
                                 inputs.id_field, inputs.text_field)
    return examples, ids, None


def _decode_words(body: dict):
    words = body["text"].split()
    if not words:
        raise PtmError("'text' holds no words; send {\"text\": \"...\"} with at least one word")
    return words, body["text"]


def _decode_choices(body: dict):
    if len(body["choices"]) < 2:
        raise PtmError("'choices' needs at least 2 candidate answers; send "
                       "{\"question\": \"...\", \"choices\": [\"...\", \"...\"]}")
    return (body["question"], list(body["choices"])), None


TEXT = InputForm("text", {"text": str}, _read_text, lambda body: (body["text"], body["text"]))
WORDS = InputForm("words", {"text": str}, _read_words, _decode_words)
QA = InputForm("qa", {"question": str, "context": str}, _read_qa,
               lambda body: ((body["question"], body["context"]), None))
CHOICES = InputForm("choices", {"question": str, "choices": list[str]}, _read_choices, _decode_choices)
