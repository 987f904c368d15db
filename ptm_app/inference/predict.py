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

import json
import math
from pathlib import Path
from typing import Literal, Optional

import torch

from ptm_app.errors import PtmError
from ptm_app.inference.export import recorded_precision
from ptm_app.inference.loading import LoadedModel, load_for_inference
from ptm_app.paths import atomic_file
from ptm_app.task_kinds.forms import Inputs
from ptm_app.task_kinds.inputs import read_inputs
from ptm_app.task_kinds.registry import TaskKind, kind_of
from ptm_app.task_kinds.rows import PRECISIONS, TOO_LONG, Settings


def precision_context(loaded: LoadedModel, settings: Settings):
    """bf16 autocast on the CPU, as Lightning's ``bf16-mixed`` runs ``predict_step``, when asked (``bf16``) or
    when the run itself predicted so (``run``: ``trainer.precision`` bf16-mixed, or ``auto`` on a CPU with native
    bf16, ``training.precision.auto_precision``); else fp32.  An ONNX Runtime session always runs its fp32 graph."""
    from contextlib import nullcontext

    from ptm_app.data.sources.references import resolve_pretrained
    from ptm_app.training.precision import auto_precision

    wanted = settings.precision
    if wanted == "run":
        value = recorded_precision(resolve_pretrained(loaded.ref)) or "32-true"
        value = auto_precision("cpu") if value == "auto" else value
        wanted = "bf16" if value.startswith("bf16") else "32"
    if wanted == "bf16" and loaded.session is None:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return nullcontext()


def refuse(loaded: LoadedModel, what: str) -> PtmError:
    return PtmError(f"predict --text/--input {what}; {loaded.ref} is a {loaded.kind} (model class "
                    f"{loaded.model_class}); for other runs use: python main.py predict --config ... --ckpt_path ... "
                    f"(generate / embed for language models and encoders)")


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
    fields (``task_kinds.rows``)."""
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


def predict(ckpt_path: str, text: Optional[list[str]] = None, input: Optional[str] = None, text_field: str = "text",
            id_field: str = "id", output: Optional[str] = None, batch_size: int = 32,
            max_length: Optional[int] = None, trust_checkpoint: bool = False, question: Optional[list[str]] = None,
            context: Optional[list[str]] = None, words_field: str = "words", question_field: str = "question",
            context_field: str = "context", too_long: Literal[TOO_LONG] = "truncate",
            backend: Literal["torch", "onnxruntime"] = "torch",
            precision: Literal[PRECISIONS] = "run", choices_field: str = "choices",
            image: Optional[list[str]] = None) -> list[dict]:
    """Labels with probabilities, label sets, values, word tags, answer spans, choices or generated text for given inputs, from a
    fine-tuned run or export (with --config instead: LightningCLI's predict over the data's test split).

    Writes the rows as JSONL to ``output``, or prints them; ``backend="onnxruntime"`` runs the export's
    ``model.onnx`` (``inference.onnx_export``) instead of PyTorch.

    Args:
        ckpt_path: a classification (single- or multi-label), regression, tagging, extractive QA, multiple choice or
            generation run directory, .ckpt or export directory.
        text: a text to label (repeatable, or several after one --text); multiple choice: one JSON object
            {"question": ..., "choices": [...]} per --text.
        input: a .txt (one text per line), .jsonl or .csv file; - reads standard input.
        text_field: the text field of .jsonl / .csv records.
        id_field: the id field of .jsonl / .csv records (kept in the rows).
        output: write the rows to this .jsonl file (default: print them).
        batch_size: inputs per forward.
        max_length: truncate texts to this many tokens (default: the run's data.max_length, else the model's limit).
        trust_checkpoint: read a checkpoint you made yourself even if it holds more than plain data (runs its code).
        question: extractive QA: a question (repeatable) about --context.
        context: extractive QA: the passage the answer is cut from (one, or one per --question).
        words_field: tagging: the word-list field of .jsonl records (else the text field is split on whitespace).
        question_field: extractive QA: the question field of records.
        context_field: extractive QA: the context field of records.
        choices_field: multiple choice: the choices field of records.
        too_long: inputs longer than the run's limit: truncate them (with a warning) or refuse.
        backend: onnxruntime: run the export directory's model.onnx (export --format onnx).
        precision: run: bf16 autocast when the run predicted in bf16 (precision auto on a CPU with native bf16, or
            bf16-mixed), else fp32; 32 / bf16: force one.
        image: an image-text model (a DualEncoderModule run or export): a picture (repeatable) whose given captions
            (--text / --input) are ranked, CLIP's zero-shot classifier (§3.1.2): probabilities are the softmax of the
            learned logit scale times the cosine similarities over the captions.
    """
    texts, questions, contexts = text, question, context
    loaded = load_for_inference(ckpt_path, trust_checkpoint)
    if image:
        rows = rank_captions(loaded, list(image), read_inputs(texts, input, text_field)[0], max_length, too_long)
        return _emit(rows, output)
    if texts:
        from ptm_app.data.tokenizer import check_representable

        check_representable(loaded.tokenizer, texts)
    if backend == "onnxruntime":
        from ptm_app.inference.onnx_export import open_session

        loaded.session = open_session(loaded)
    examples, ids, shown = read_examples(loaded, Inputs(ckpt_path, texts, input, questions, contexts, text_field,
                                                        words_field, question_field, context_field, choices_field,
                                                        id_field))
    rows = predict_rows(loaded, examples, ids, batch_size, max_length, too_long, shown, progress=input is not None,
                        precision=precision)
    return _emit(rows, output)


def rank_captions(loaded: LoadedModel, images: list[str], captions: list[str], max_length: Optional[int] = None,
                  too_long: str = "truncate") -> list[dict]:
    """One row per picture: the captions from most to least likely (``probability``: softmax over the captions of
    ``exp(logit_scale) · cosine``, as the model scores pairs; ``similarity``: the cosine)."""
    from ptm_app.inference.embed import dual_encoder, embed_pairs

    texts, pictures = embed_pairs(loaded, captions, images, normalize=True, max_length=max_length, too_long=too_long)
    scale = dual_encoder(loaded).logit_scale.detach().float().clamp(max=math.log(100)).exp()  # CLIP §2.5's clip
    cos = torch.from_numpy(pictures) @ torch.from_numpy(texts).T
    probs = torch.softmax(scale * cos, dim=-1)
    rows = []
    for path, p, c in zip(images, probs, cos):
        order = p.argsort(descending=True).tolist()
        rows.append({"image": path, "ranking": [{"text": captions[j], "probability": round(p[j].item(), 6),
                                                 "similarity": round(c[j].item(), 6)} for j in order]})
    return rows


def _emit(rows: list[dict], output: Optional[str]) -> list[dict]:
    lines = [json.dumps(row, ensure_ascii=False) for row in rows]
    if output is None:
        print("\n".join(lines))
        return rows
    with atomic_file(Path(output), "w", encoding="utf-8") as fh:
        fh.write("".join(line + "\n" for line in lines))
    print(f"wrote {len(rows)} predictions to {output}")
    return rows
