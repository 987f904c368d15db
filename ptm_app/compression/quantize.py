"""Post-training int8 of a trained model (``compression.quantization``: dynamic int8, or Q8BERT's static int8 with a
QAT run's learned input ranges), and the measurements ``quantize``, ``prune`` and ``compress-report`` report: CPU
latency at batch 1 and 32 (median of repeats, the models timed alternately in one process) on a prepared set's texts.
The command (``python main.py quantize``) is ``inference.compress_commands.quantize``: it loads and scores models."""
from __future__ import annotations

import functools
import statistics
import time
from pathlib import Path
from typing import Literal, Optional

import torch

from ptm_app.compression.quantization import BACKENDS, STATIC
from ptm_app.errors import PtmError

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
                       f"not one (train configs/compress/minilm_qat_bbc.yaml and give its run directory, not an "
                       f"export), or use --backend torch_ao")
    from ptm_app.backbones.delta import transformers_model
    from ptm_app.compression.quantization import quantizable_linears

    names = quantizable_linears(transformers_model(loaded.model))
    found = {name: getattr(ranges, name.replace(".", "__"), None) for name in names}
    return {name: float(value) for name, value in found.items() if value is not None}  # a gap: refused later


def to_int8(loaded, backend: str, where: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """``(fp32, int8)`` of a loaded model (``inference.loading.LoadedModel``: its transformers model and module): a
    QAT run's plain weights, then dynamic int8 (``backend`` of ``BACKENDS``) or, for ``STATIC``, Q8BERT's static
    int8 with the run's learned input ranges."""
    from ptm_app.backbones.delta import transformers_model
    from ptm_app.compression.quantization import disable_fake_quant, quantize_dynamic_int8, quantize_static_q8bert

    input_max = qat_input_ranges(loaded, where) if backend == STATIC else None
    fp32 = disable_fake_quant(transformers_model(loaded.model)).float().eval()  # a QAT run: its plain weights
    if input_max is not None:
        return fp32, quantize_static_q8bert(fp32, input_max)
    return fp32, quantize_dynamic_int8(fp32, backend)
