"""``python main.py quantize``: post-training dynamic int8 of a run, export or QAT run (``compression.quantization``),
written as a directory ``predict`` loads, with ``summary.json``: size on disk, CPU latency at batch 1 and 32
(median of repeats, fp32 and int8 timed alternately in one process) and, given ``--eval_source``, the accuracy of
both on that prepared set's test split."""
from __future__ import annotations

import functools
import json
import statistics
import time
from pathlib import Path
from typing import Literal, Optional

import torch

from ptm_app.compression.quantization import BACKENDS, STATIC
from ptm_app.errors import PtmError
from ptm_app.paths import atomic_file, check_output_dir

COMMAND_BACKENDS = (*BACKENDS, STATIC)
SENTENCE = "Shares in the bank fell sharply after it warned that profits would be lower than expected this year."


def eval_records(source: str, split: str, limit: int) -> list[dict]:
    """``(text, label)`` records of a prepared set's split (``data/<source>/<split>.jsonl``)."""
    from ptm_app.data.formats import read_records
    from ptm_app.data.sources import prepared_dir

    path = Path(prepared_dir(source)) / f"{split}.jsonl"
    if not path.is_file():
        raise PtmError(f"--eval_source {source}: no {path}; prepare it with: python main.py data prepare {source}")
    records = [r for _, r in read_records(path, ("text", "label"))]
    return records[:limit] if limit else records


def accuracy(loaded, records: list[dict], max_length: int) -> float:
    from ptm_app.inference.predict import predict_rows

    rows = predict_rows(loaded, [r["text"] for r in records], batch_size=32, max_length=max_length)
    return sum(row["label"] == r["label"] for row, r in zip(rows, records)) / max(len(records), 1)


def latency_batches(tokenizer, texts: list[str], max_length: int) -> dict:
    """The timed inputs: each of the (up to 32) texts alone (``batch_1``: a list, timed per text) and 32 texts padded
    together (``batch_32``).  Batch 1 over many texts, not one: their lengths differ, and an early exit stops at
    each text's own layer."""
    texts = (texts * 32)[:32]
    return {"batch_1": [tokenizer([t], truncation=True, max_length=max_length, return_tensors="pt") for t in texts],
            "batch_32": tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors="pt")}


class EachInTurn:
    """One timed call that runs ``calls`` one after another; ``alternating_medians`` reports its time per call."""

    def __init__(self, calls: list):
        self.calls = calls

    def __len__(self) -> int:
        return len(self.calls)

    def __call__(self) -> None:
        for call in self.calls:
            call()


def timed_call(make, inputs):
    """``make(inputs)`` for one encoded batch; an ``EachInTurn`` of them for a list (batch 1, per text)."""
    return EachInTurn([make(one) for one in inputs]) if isinstance(inputs, list) else make(inputs)


@torch.no_grad()
def alternating_medians(calls: dict, repeats: int) -> dict:
    """Median milliseconds of ``calls[name][batch]()`` (a forward on prepared inputs; an ``EachInTurn``: per forward)
    for every name and batch: one warm-up call each, then ``repeats`` rounds that time every name in turn (so a busy
    moment of a shared machine falls on all of them, not on one)."""
    batches = list(dict.fromkeys(b for per in calls.values() for b in per))
    times = {name: {b: [] for b in per} for name, per in calls.items()}
    for b in batches:
        for per in calls.values():  # warm-up
            per[b]()
        for _ in range(repeats):
            for name, per in calls.items():
                start = time.perf_counter()
                per[b]()
                calls_made = len(per[b]) if isinstance(per[b], EachInTurn) else 1
                times[name][b].append(1000 * (time.perf_counter() - start) / calls_made)
    return {name: {b: round(statistics.median(v), 3) for b, v in per.items()} for name, per in times.items()}


def latencies(models: dict, tokenizer, texts: list[str], max_length: int, repeats: int) -> dict:
    """Median milliseconds per forward at batch 1 and batch 32 for each model, timed alternately."""
    batches = latency_batches(tokenizer, texts, max_length)
    return alternating_medians({name: {b: timed_call(lambda enc, m=model: functools.partial(m, **enc), inputs)
                                       for b, inputs in batches.items()}
                                for name, model in models.items()}, repeats)


def qat_input_ranges(loaded, where) -> dict[str, float]:
    """The EMA input ranges (``max|x|``) per linear layer that a QAT run learned, for Q8BERT's static int8."""
    ranges = getattr(loaded.module, "qat_ranges", None)
    if ranges is None:
        raise PtmError(f"--backend q8bert_static needs a quantization-aware run's learned input ranges; {where} is "
                       f"not one (train configs/compress/quantize_qat_bbc.yaml and give its run directory, not an "
                       f"export), or use --backend torch_ao")
    from ptm_app.backbones.delta import transformers_model
    from ptm_app.compression.quantization import quantizable_linears

    names = quantizable_linears(transformers_model(loaded.model))
    found = {name: getattr(ranges, name.replace(".", "__"), None) for name in names}
    return {name: float(value) for name, value in found.items() if value is not None}  # a gap: refused later


def quantize(ckpt_path: str, output_dir: str,
             backend: Literal[COMMAND_BACKENDS] = "torch_ao",
             eval_source: Optional[str] = None, eval_split: str = "test", eval_limit: int = 0, max_length: int = 128,
             repeats: int = 20, overwrite: bool = False, trust_checkpoint: bool = False) -> int:
    """Int8 of a run, export or QAT run, written as a directory predict loads.

    summary.json: size, CPU latency at batch 1 / 32, accuracy before and after.

    Args:
        ckpt_path: a run directory, .ckpt, export directory or prepared model.
        output_dir: where to write the int8 model.
        backend: torch_ao: dynamic int8 kernels; weight_only: int8 storage, fp32 compute (fallback); q8bert_static:
            Q8BERT's static int8 with a QAT run's learned input ranges.
        eval_source: a prepared classification set (e.g. bbc): accuracy before and after.
        eval_split: the split of --eval_source scored.
        eval_limit: only the first N examples (0: all).
        max_length: tokens per text.
        repeats: timed forwards per model and batch size.
        overwrite: replace an existing non-empty --output_dir (never one holding checkpoints or a run).
        trust_checkpoint: read a checkpoint you made yourself even if it holds more than plain data (runs its code).
    """
    from ptm_app.backbones.delta import transformers_model
    from ptm_app.compression.pruning import on_disk_mb
    from ptm_app.compression.quantization import (QUANT_WEIGHTS, disable_fake_quant, load_quantized,
                                                  quantize_dynamic_int8, save_quantized)
    from ptm_app.inference.loading import LoadedModel, load_for_inference

    if repeats < 1:
        raise PtmError("--repeats must be at least 1")
    check_output_dir(output_dir, overwrite, (ckpt_path,))
    loaded = load_for_inference(ckpt_path, trust_checkpoint)
    input_max = qat_input_ranges(loaded, ckpt_path) if backend == STATIC else None
    fp32 = disable_fake_quant(transformers_model(loaded.model)).float().eval()  # a QAT run: its plain weights
    if input_max is not None:
        from ptm_app.compression.quantization import quantize_static_q8bert

        int8 = quantize_static_q8bert(fp32, input_max)
    else:
        int8 = quantize_dynamic_int8(fp32, backend)
    out = save_quantized(int8, backend, Path(output_dir), loaded.head, loaded.tokenizer,
                         {"source": str(ckpt_path)})
    reloaded = load_quantized(out)
    records = eval_records(eval_source, eval_split, eval_limit) if eval_source else []
    texts = [r["text"] for r in records[:32]] or [SENTENCE]
    summary = {"source": str(ckpt_path), "backend": backend, "threads": torch.get_num_threads(),
               "params": sum(p.numel() for p in fp32.parameters()),
               "fp32_mb": on_disk_mb(fp32), "int8_mb": round((out / QUANT_WEIGHTS).stat().st_size / 2**20, 3),
               "latency_ms": latencies({"fp32": fp32, "int8": reloaded}, loaded.tokenizer, texts, max_length,
                                       repeats)}
    lat = summary["latency_ms"]
    summary["speedup"] = {b: round(lat["fp32"][b] / lat["int8"][b], 3) for b in lat["fp32"]}
    if records:
        if loaded.head != "sequence_classification":
            raise PtmError(f"--eval_source measures accuracy of a sequence classifier; {ckpt_path} is a "
                           f"{loaded.head} model: leave --eval_source out")
        plain = LoadedModel(loaded.ref, fp32, loaded.tokenizer, loaded.head)
        quant = LoadedModel(str(out), reloaded, loaded.tokenizer, loaded.head)
        summary["metric"] = {"name": f"{eval_split}_acc", "examples": len(records),
                             "fp32": accuracy(plain, records, max_length),
                             "int8": accuracy(quant, records, max_length)}
    with atomic_file(out / "summary.json", "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=2)
    metric = summary.get("metric")
    print(f"quantized {ckpt_path} -> {out}: {summary['fp32_mb']} MB -> {summary['int8_mb']} MB, batch 1 "
          f"{lat['fp32']['batch_1']} -> {lat['int8']['batch_1']} ms" +
          (f", {metric['name']} {metric['fp32']:.4f} -> {metric['int8']:.4f}" if metric else ""))
    return 0
