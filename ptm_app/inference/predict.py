"""Labels for new texts from a sequence classification (or regression) run:
``python main.py predict --ckpt_path REF (--text ... | --input FILE) [--output FILE]``.

The run's own module scores the texts (its ``predict_step``: deltas, frozen features and heads as trained), fed by
its own collator (a plain transformers export: its model's logits), so the rows equal those ``predict --config``
writes for the same texts
(``training.callbacks.score_rows``): the predicted label with every label's probability, or the predicted value.
Texts are truncated to the run's ``data.max_length`` (its ``config.yaml``; the model's limit for an export).
Without ``--text`` / ``--input``, ``predict`` stays LightningCLI's (``predict --config ...``: the data's test split).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional

import torch
import yaml

from ptm_app.adaptation.classification import SequenceClassificationModule
from ptm_app.backbones.build import max_positions
from ptm_app.backbones.delta import transformers_model
from ptm_app.data.collators import PadCollator
from ptm_app.data.datasets import EncodedDataset
from ptm_app.errors import PtmError
from ptm_app.inference.inputs import read_inputs
from ptm_app.inference.loading import LoadedModel, load_for_inference
from ptm_app.model_card import run_directory
from ptm_app.paths import atomic_file
from ptm_app.training.callbacks import score_rows


def scorer(loaded: LoadedModel):
    """``(collate, score, labels)``: the run's own collator and ``predict_step``; for a plain transformers export
    (no module: full fine-tuning or an unmerged delta) the same computation from the model itself, softmax of
    ``SequenceClassificationModule.forward``'s logits, labels from the config's ``id2label``."""
    module = loaded.module
    if isinstance(module, SequenceClassificationModule):
        return module.make_collator(loaded.tokenizer), module.predict_step, list(module.hparams.get("labels") or [])
    if module is None and loaded.head == "sequence_classification":
        config = transformers_model(loaded.model).config
        regression = config.problem_type == "regression" or config.num_labels == 1

        def score(batch: dict, batch_idx: int) -> dict:
            inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
            logits = loaded.model(**inputs).logits.float()
            return {"values": logits.squeeze(-1)} if regression else {"probs": torch.softmax(logits, dim=-1)}

        labels = [config.id2label[i] for i in range(config.num_labels)]
        return PadCollator(pad_token_id=loaded.tokenizer.pad_token_id), score, labels
    raise PtmError(f"predict --text/--input labels texts with a sequence classification or regression run; "
                   f"{loaded.ref} is a {loaded.kind}; for other runs use: python main.py predict --config ... "
                   f"--ckpt_path ...")


def run_max_length(ref: str) -> Optional[int]:
    """``data.init_args.max_length`` of the run a checkpoint belongs to (None for exports and prepared models)."""
    from ptm_app.data.sources.references import resolve_pretrained

    run = run_directory(resolve_pretrained(ref))
    config = run / "config.yaml" if run is not None else None
    if config is None or not config.is_file():
        return None
    data = yaml.safe_load(config.read_text()).get("data") or {}
    return (data.get("init_args") or {}).get("max_length")


@torch.no_grad()
def predict_rows(loaded: LoadedModel, texts: list[str], ids: Optional[list] = None, batch_size: int = 32,
                 max_length: Optional[int] = None) -> list[dict]:
    """One row per text: ``id`` (when given), ``text``, then ``label`` + ``probs`` or ``value``."""
    collate, score, labels = scorer(loaded)
    if batch_size < 1:
        raise PtmError("--batch_size must be at least 1")
    limit = max_length or run_max_length(loaded.ref) or max_positions(transformers_model(loaded.model))
    enc = loaded.tokenizer(texts, truncation=limit is not None, max_length=limit)
    dataset = EncodedDataset(enc["input_ids"], None, enc.get("token_type_ids"))
    rows = []
    for start in range(0, len(texts), batch_size):
        batch = collate([dataset[i] for i in range(start, min(start + batch_size, len(texts)))])
        rows += score_rows(score(batch, start // batch_size), labels)
    head = [{"text": t} if ids is None else {"id": i, "text": t} for i, t in zip(ids or [None] * len(texts), texts)]
    return [{**h, **row} for h, row in zip(head, rows)]


def predict(ckpt_path: str, texts: Optional[list[str]] = None, input: Optional[str] = None, text_field: str = "text",
            id_field: str = "id", output: Optional[str] = None, batch_size: int = 32,
            max_length: Optional[int] = None, trust_checkpoint: bool = False) -> list[dict]:
    """Label the texts; write the rows as JSONL to ``output``, or print them."""
    texts, ids = read_inputs(texts, input, text_field, id_field)
    rows = predict_rows(load_for_inference(ckpt_path, trust_checkpoint), texts, ids, batch_size, max_length)
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
    parser.add_argument("--ckpt_path", required=True,
                        help="a sequence classification run directory, .ckpt or export directory")
    parser.add_argument("--text", action="append", dest="texts", help="a text to label (repeatable)")
    parser.add_argument("--input", help="a .txt (one text per line), .jsonl or .csv file; - reads standard input")
    parser.add_argument("--text_field", default="text", help="the text field of .jsonl / .csv records")
    parser.add_argument("--id_field", default="id", help="the id field of .jsonl / .csv records (kept in the rows)")
    parser.add_argument("--output", help="write the rows to this .jsonl file (default: print them)")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_length", type=int, help="truncate texts to this many tokens (default: the run's "
                        "data.max_length, else the model's limit)")
    parser.add_argument("--trust_checkpoint", action="store_true",
                        help="read a checkpoint you made yourself even if it holds more than plain data (runs its code)")
    args = parser.parse_args(argv)
    predict(**vars(args))
    return 0
