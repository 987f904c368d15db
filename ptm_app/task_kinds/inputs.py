"""The texts an inference command works on: ``--text`` values, or a file (``-`` = standard input).

``.txt`` (and standard input): one text per non-blank line.  ``.jsonl`` / ``.csv`` / ``.tsv``: one record per
line with a text field (``text`` unless ``--text_field`` names another), read by ``data.formats.read_records`` so
a bad line is reported as ``file:line``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

from ptm_app.data.formats import not_utf8, read_records
from ptm_app.errors import not_utf8_lines
from ptm_app.errors import DataFormatError, PtmError

RECORD_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv")


def read_texts(texts: Optional[list[str]], input_path: Optional[str], text_field: str = "text") -> list[str]:
    """The texts to embed / classify / continue, in order; no texts at all is a one-line error."""
    return read_inputs(texts, input_path, text_field)[0]


def read_inputs(texts: Optional[list[str]], input_path: Optional[str], text_field: str = "text",
                id_field: str = "id") -> tuple[list[str], Optional[list]]:
    """The texts and, when every record of a .jsonl / .csv file has one, their ids (else None)."""
    if texts and input_path:
        raise PtmError("give the texts either with --text or with --input FILE, not both")
    if texts:
        return list(texts), None
    if not input_path:
        raise PtmError("no input: give --text \"...\" (repeatable) or --input FILE (.txt, .jsonl, .csv; - for stdin)")
    ids = None
    if input_path == "-":
        found, where = _lines(_stdin_text().splitlines()), "standard input"
    else:
        path = Path(input_path)
        if not path.is_file():
            raise PtmError(f"--input {path} does not exist; check the path")
        where = str(path)
        if path.suffix.lower() in RECORD_SUFFIXES:
            found, ids = _records(path, text_field, id_field)
        else:
            try:
                found = _lines(path.read_text(encoding="utf-8").splitlines())
            except UnicodeDecodeError:
                raise not_utf8(path) from None
    if not found:
        raise PtmError(f"{where}: no texts in it (it is empty); give one text per line (.txt) or one record with a "
                       f"'{text_field}' field per line (.jsonl, .csv)")
    return found, ids


def _stdin_text() -> str:
    """Standard input decoded as UTF-8, strictly (Python's own stdin may let bad bytes through as surrogates)."""
    raw = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode("utf-8", "surrogateescape")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise not_utf8_lines("standard input", raw.splitlines(keepends=True)) from None


def _lines(lines: list[str]) -> list[str]:
    return [line.strip() for line in lines if line.strip()]


def _records(path: Path, field: str, id_field: str) -> tuple[list[str], Optional[list]]:
    found, ids = [], []
    for line, record in read_records(path):
        value = record.get(field)
        if not isinstance(value, str):
            problem = f"no '{field}' field" if value is None else f"'{field}' is not a string"
            raise DataFormatError(path, line, problem, "add it, or name the text field with --text_field")
        found.append(value)
        ids.append(record.get(id_field))
    return found, (ids if all(i is not None for i in ids) else None)


def read_words(texts: Optional[list[str]], input_path: Optional[str], text_field: str = "text",
               words_field: str = "words", id_field: str = "id") -> tuple[list[list[str]], Optional[list]]:
    """Pre-split sentences for a tagger: a record's ``words`` list when it has one (as the tagging data), else its
    text (or a ``--text`` value, or a .txt line) split on whitespace."""
    if input_path and input_path != "-" and Path(input_path).suffix.lower() in RECORD_SUFFIXES \
            and Path(input_path).is_file():
        sentences, ids = [], []
        for line, record in read_records(input_path):
            words = record.get(words_field)
            if words is None and isinstance(record.get(text_field), str):
                words = record[text_field].split()
            if not isinstance(words, list) or not words:
                raise DataFormatError(input_path, line, f"no '{words_field}' list nor '{text_field}' text",
                                      "give the words (a list) or the text, or name them with --words_field / "
                                      "--text_field")
            sentences.append([str(w) for w in words])
            ids.append(record.get(id_field))
        if not sentences:
            raise PtmError(f"{input_path}: no records in it (it is empty); give one record per line")
        return sentences, (ids if all(i is not None for i in ids) else None)
    found, ids = read_inputs(texts, input_path, text_field, id_field)
    return [text.split() for text in found], ids


def read_questions(questions: Optional[list[str]], contexts: Optional[list[str]], input_path: Optional[str],
                   question_field: str = "question", context_field: str = "context",
                   id_field: str = "id") -> tuple[list[tuple[str, str]], Optional[list]]:
    """(question, context) pairs for extractive QA: ``--question`` / ``--context`` values (one context for all
    questions, or one per question), or the two fields of each .jsonl / .csv record."""
    if (questions or contexts) and input_path:
        raise PtmError("give the questions either with --question/--context or with --input FILE, not both")
    if questions or contexts:
        if not questions or not contexts or len(contexts) not in (1, len(questions)):
            raise PtmError("extractive QA needs --question \"...\" and --context \"...\" (one context, or one per "
                           "question)")
        return [(q, contexts[0 if len(contexts) == 1 else i]) for i, q in enumerate(questions)], None
    if not input_path:
        raise PtmError("no input: give --question \"...\" --context \"...\" or --input FILE (.jsonl, .csv records "
                       f"with '{question_field}' and '{context_field}' fields)")
    path = Path(input_path)
    if input_path == "-" or path.suffix.lower() not in RECORD_SUFFIXES:
        raise PtmError(f"--input {input_path}: extractive QA reads .jsonl / .csv records with '{question_field}' and "
                       f"'{context_field}' fields; give such a file")
    if not path.is_file():
        raise PtmError(f"--input {path} does not exist; check the path")
    pairs, ids = [], []
    for line, record in read_records(path):
        values = [record.get(question_field), record.get(context_field)]
        if not all(isinstance(v, str) for v in values):
            raise DataFormatError(path, line, f"'{question_field}' and '{context_field}' must both be strings",
                                  "add them, or name the fields with --question_field / --context_field")
        pairs.append((values[0], values[1]))
        ids.append(record.get(id_field))
    if not pairs:
        raise PtmError(f"{path}: no records in it (it is empty); give one record per line")
    return pairs, (ids if all(i is not None for i in ids) else None)


CHOICES_EXAMPLE = '{"question": "...", "choices": ["...", "..."]}'


def _question_choices(record, question_field: str, choices_field: str,
                      text_field: str = "text") -> Optional[tuple[str, list[str]]]:
    """``(question, choices)`` of a record (the question in ``question_field``, else ``text_field`` as the
    multiple-choice data keeps it; choices: a list of at least 2 strings, or its JSON text), else None."""
    if not isinstance(record, dict):
        return None
    question, choices = record.get(question_field, record.get(text_field)), record.get(choices_field)
    if isinstance(choices, str):
        try:
            choices = json.loads(choices)
        except ValueError:
            return None
    if not isinstance(question, str) or not isinstance(choices, list) or len(choices) < 2 \
            or not all(isinstance(c, str) for c in choices):
        return None
    return question, choices


def read_choices(texts: Optional[list[str]], input_path: Optional[str], question_field: str = "question",
                 choices_field: str = "choices", id_field: str = "id",
                 text_field: str = "text") -> tuple[list[tuple[str, list[str]]], Optional[list]]:
    """Multiple-choice questions as ``(question, choices)``: each ``--text`` value is one JSON object
    ``{"question": "...", "choices": ["...", ...]}``, or each record of a .jsonl / .csv file (in CSV the choices
    are a JSON list) holds the two fields (the question may be in ``text_field``, as in the training data)."""
    if texts and input_path:
        raise PtmError("give the questions either with --text or with --input FILE, not both")
    want = CHOICES_EXAMPLE.replace('"question"', f'"{question_field}"').replace('"choices"', f'"{choices_field}"')
    if texts:
        found = []
        for text in texts:
            try:
                record = json.loads(text)
            except ValueError:
                record = None
            pair = _question_choices(record, question_field, choices_field, text_field)
            if pair is None:
                shown = text if len(text) <= 40 else text[:37] + "..."
                raise PtmError(f"--text {shown!r} is not a multiple-choice question; give one JSON object {want} "
                               f"per --text, or --input FILE.jsonl of such records")
            found.append(pair)
        return found, None
    if not input_path:
        raise PtmError(f"no input: give --text '{want}' (repeatable) or --input FILE (.jsonl, .csv records)")
    path = Path(input_path)
    if input_path == "-" or path.suffix.lower() not in RECORD_SUFFIXES:
        raise PtmError(f"--input {input_path}: multiple choice reads .jsonl / .csv records like {want}; give such a "
                       f"file")
    if not path.is_file():
        raise PtmError(f"--input {path} does not exist; check the path")
    found, ids = [], []
    for line, record in read_records(path):
        pair = _question_choices(record, question_field, choices_field, text_field)
        if pair is None:
            raise DataFormatError(path, line, f"'{question_field}' (or '{text_field}') must be a string and "
                                  f"'{choices_field}' a list of at least 2 strings",
                                  "fix the record, or name the question field with --question_field")
        found.append(pair)
        ids.append(record.get(id_field))
    if not found:
        raise PtmError(f"{path}: no records in it (it is empty); give one record per line")
    return found, (ids if all(i is not None for i in ids) else None)
