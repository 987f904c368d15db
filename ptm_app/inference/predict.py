"""Predictions for new inputs from any fine-tuned run:
``python main.py predict --ckpt_path REF (--text ... | --input FILE | --question ... --context ...) [--output FILE]``.

The run's own module scores the inputs (deltas, frozen features and heads as trained), fed by its own collator
(a plain transformers export: its model's outputs), so the rows equal those ``predict --config`` writes for the
same examples: labels with probabilities (classification), values (regression), one tag per word (tagging),
answer spans (extractive QA), the chosen answer (multiple choice: ``--text '{"question": "...", "choices": [...]}'``)
or generated text (a ``GenerationModule`` run); the run's task kind (``task_kinds.registry``) says which, and what
its inputs are (``task_kinds.forms``).
Inputs are cut to the run's own limits (its ``config.yaml``; the model's limit for an export) with a warning, or
refused with ``--too_long refuse``.  Without ``--text`` / ``--input`` / ``--question``, ``predict`` stays
LightningCLI's (``predict --config ...``: the data's test split).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional

import torch

from ptm_app.inference.loading import LoadedModel, load_for_inference
from ptm_app.inference.predictors import PRECISIONS, TOO_LONG, Settings, precision_context, refuse
from ptm_app.paths import atomic_file
from ptm_app.task_kinds.forms import Inputs
from ptm_app.task_kinds.registry import TaskKind, kind_of


def predicting_kind(loaded: LoadedModel) -> TaskKind:
    """The loaded model's task kind (its entry's ``prediction``: input form and rows); a model without one is one
    line."""
    kind = kind_of(loaded)
    if kind is None:
        raise refuse(loaded, "labels texts (classification, regression), tags words, answers questions, picks "
                             "answers or generates with a fine-tuned run")
    return kind


@torch.no_grad()
def predict_rows(loaded: LoadedModel, examples: list, ids: Optional[list] = None, batch_size: int = 32,
                 max_length: Optional[int] = None, too_long: str = "truncate", texts: Optional[list[str]] = None,
                 progress: bool = False, precision: str = "run", warn_truncated: bool = True) -> list[dict]:
    """One row per example: ``id`` (when given), ``text`` (when the examples came as texts), then the head's
    fields (``inference.predictors``)."""
    settings = Settings(batch_size, max_length, too_long, progress, precision, warn_truncated)
    with precision_context(loaded, settings):
        kind = predicting_kind(loaded)
        rows = kind.prediction.rows(loaded, examples, settings, kind)
    heads = [{} if ids is None else {"id": i} for i in (ids or [None] * len(rows))]
    if texts is not None:
        heads = [{**h, "text": t} for h, t in zip(heads, texts)]
    return [{**h, **row} for h, row in zip(heads, rows)]


def read_examples(loaded: LoadedModel, inputs: Inputs) -> tuple[list, Optional[list], Optional[list[str]]]:
    """``(examples, ids, texts)`` in the form the model's task kind takes (``task_kinds.forms``)."""
    return predicting_kind(loaded).prediction.form.read(inputs)


def predict(ckpt_path: str, texts: Optional[list[str]] = None, input: Optional[str] = None, text_field: str = "text",
            id_field: str = "id", output: Optional[str] = None, batch_size: int = 32,
            max_length: Optional[int] = None, trust_checkpoint: bool = False, questions: Optional[list[str]] = None,
            contexts: Optional[list[str]] = None, words_field: str = "words", question_field: str = "question",
            context_field: str = "context", too_long: str = "truncate", backend: str = "torch",
            precision: str = "run", choices_field: str = "choices") -> list[dict]:
    """Predict for the examples; write the rows as JSONL to ``output``, or print them.  ``backend="onnxruntime"``
    runs the export's ``model.onnx`` (``inference.onnx_export``) instead of PyTorch."""
    loaded = load_for_inference(ckpt_path, trust_checkpoint)
    if backend == "onnxruntime":
        from ptm_app.inference.onnx_export import open_session

        loaded.session = open_session(loaded)
    examples, ids, shown = read_examples(loaded, Inputs(ckpt_path, texts, input, questions, contexts, text_field,
                                                        words_field, question_field, context_field, choices_field,
                                                        id_field))
    rows = predict_rows(loaded, examples, ids, batch_size, max_length, too_long, shown, progress=input is not None,
                        precision=precision)
    lines = [json.dumps(row, ensure_ascii=False) for row in rows]
    if output is None:
        print("\n".join(lines))
        return rows
    with atomic_file(Path(output), "w", encoding="utf-8") as fh:
        fh.write("".join(line + "\n" for line in lines))
    print(f"wrote {len(rows)} predictions to {output}")
    return rows


def predict_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="main.py predict", description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt_path", required=True, help="a classification, regression, tagging, extractive QA "
                        "or generation run directory, .ckpt or export directory")
    parser.add_argument("--text", action="append", dest="texts", help="a text to label (repeatable)")
    parser.add_argument("--input", help="a .txt (one text per line), .jsonl or .csv file; - reads standard input")
    parser.add_argument("--text_field", default="text", help="the text field of .jsonl / .csv records")
    parser.add_argument("--id_field", default="id", help="the id field of .jsonl / .csv records (kept in the rows)")
    parser.add_argument("--output", help="write the rows to this .jsonl file (default: print them)")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_length", type=int, help="truncate texts to this many tokens (default: the run's "
                        "data.max_length, else the model's limit)")
    parser.add_argument("--question", action="append", dest="questions",
                        help="extractive QA: a question (repeatable) about --context")
    parser.add_argument("--context", action="append", dest="contexts",
                        help="extractive QA: the passage the answer is cut from (one, or one per --question)")
    parser.add_argument("--words_field", default="words", help="tagging: the word-list field of .jsonl records "
                        "(else the text field is split on whitespace)")
    parser.add_argument("--question_field", default="question", help="extractive QA: the question field of records")
    parser.add_argument("--context_field", default="context", help="extractive QA: the context field of records")
    parser.add_argument("--too_long", choices=TOO_LONG, default="truncate",
                        help="inputs longer than the run's limit: truncate them (with a warning) or refuse")
    parser.add_argument("--precision", choices=PRECISIONS, default="run",
                        help="run: bf16 autocast when the run predicted in bf16 (precision auto on a CPU with native "
                             "bf16, or bf16-mixed), else fp32; 32 / bf16: force one")
    parser.add_argument("--backend", choices=("torch", "onnxruntime"), default="torch",
                        help="onnxruntime: run the export directory's model.onnx (export --format onnx)")
    parser.add_argument("--trust_checkpoint", action="store_true",
                        help="read a checkpoint you made yourself even if it holds more than plain data (runs its code)")
    args = parser.parse_args(argv)
    predict(**vars(args))
    return 0
