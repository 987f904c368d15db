"""``python main.py quantize`` and ``prune``: compress a trained run, export or QAT run (``compression.quantize``,
``compression.prune``) into a directory ``predict`` loads, with ``summary.json``: size on disk, CPU latency at batch 1
and 32 (median of repeats, the models before and after timed alternately in one process) and, given
``--eval_source``, the accuracy of both on that prepared set's split (scored as ``predict`` scores)."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Literal, Optional

import torch

from ptm_app.backbones.build import quiet_transformers
from ptm_app.compression.prune import labelled_batches, prune_model, pruning_specs, pruning_summary
from ptm_app.compression.quantize import COMMAND_BACKENDS, SENTENCE, eval_records, latencies, to_int8
from ptm_app.errors import PtmError
from ptm_app.inference.loading import EXPORT_INFO, LoadedModel, load_for_inference
from ptm_app.inference.predict import predict_rows
from ptm_app.paths import atomic_dir, atomic_file, check_output_dir


def accuracy(loaded: LoadedModel, records: list[dict], max_length: int) -> float:
    rows = predict_rows(loaded, [r["text"] for r in records], batch_size=32, max_length=max_length)
    return sum(row["label"] == r["label"] for row, r in zip(rows, records)) / max(len(records), 1)


def before_after(loaded: LoadedModel, name: str, records: list[dict], max_length: int, **models) -> dict:
    """The accuracy of each of ``models`` (``label=(reference, transformers model)``, with ``loaded``'s tokenizer
    and model class) on the same records."""
    scores = {label: accuracy(LoadedModel(ref, model, loaded.tokenizer, loaded.model_class), records, max_length)
              for label, (ref, model) in models.items()}
    return {"name": name, "examples": len(records), **scores}


def write_summary(out: Path, summary: dict) -> None:
    with atomic_file(out / "summary.json", "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=2)


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
    from ptm_app.compression.pruning_policy import on_disk_mb
    from ptm_app.compression.quantization import QUANT_WEIGHTS, load_quantized, save_quantized

    if repeats < 1:
        raise PtmError("--repeats must be at least 1")
    check_output_dir(output_dir, overwrite, (ckpt_path,))
    loaded = load_for_inference(ckpt_path, trust_checkpoint)
    fp32, int8 = to_int8(loaded, backend, ckpt_path)
    out = save_quantized(int8, backend, Path(output_dir), loaded.model_class, loaded.tokenizer,
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
        if loaded.model_class != "sequence_classification":
            raise PtmError(f"--eval_source measures accuracy of a sequence classifier; {ckpt_path} is a "
                           f"{loaded.model_class} model: leave --eval_source out")
        summary["metric"] = before_after(loaded, f"{eval_split}_acc", records, max_length,
                                         fp32=(loaded.ref, fp32), int8=(str(out), reloaded))
    write_summary(out, summary)
    metric = summary.get("metric")
    print(f"quantized {ckpt_path} -> {out}: {summary['fp32_mb']} MB -> {summary['int8_mb']} MB, batch 1 "
          f"{lat['fp32']['batch_1']} -> {lat['int8']['batch_1']} ms" +
          (f", {metric['name']} {metric['fp32']:.4f} -> {metric['int8']:.4f}" if metric else ""))
    return 0


def prune(ckpt_path: str, output_dir: str, drop_layers: Optional[str] = None, heads: float = 0.0, rounds: int = 5,
          score_batches: int = 8, sparsity: float = 0.0, scope: Literal["global", "layer"] = "global",
          eval_source: Optional[str] = None, eval_limit: int = 0, batch_size: int = 16, max_length: int = 128,
          repeats: int = 10, overwrite: bool = False, trust_checkpoint: bool = False) -> int:
    """One-shot pruning of a sequence classifier without fine-tuning (PruningModule prunes while fine-tuning).

    Writes a save_pretrained directory with summary.json: parameters, size, sparsity, latency, accuracy before and
    after.

    Args:
        ckpt_path: a sequence classification run, .ckpt or export directory.
        output_dir: where to write the pruned model.
        drop_layers: top:K, alternate:K or a list of layers (1..L) such as 2,4.
        heads: fraction of all attention heads to remove (scored on --eval_source's validation split).
        rounds: iterative rounds, scores recomputed each round.
        score_batches: validation batches for the head scores.
        sparsity: magnitude sparsity of the blocks' linear weights.
        scope: magnitude threshold over all blocks (global) or per layer.
        eval_source: the prepared set the model was fine-tuned on (e.g. bbc): validation batches score the heads,
            the test split measures accuracy before and after.
        eval_limit: only the first N test examples (0: all).
        batch_size: examples per batch when scoring heads.
        max_length: tokens per text.
        repeats: timed forwards per model and batch size.
        overwrite: replace an existing non-empty --output_dir (never one holding checkpoints or a run).
        trust_checkpoint: read a checkpoint you made yourself even if it holds more than plain data (runs its code).
    """
    from ptm_app.backbones.delta import transformers_model

    specs = pruning_specs(heads, rounds, score_batches, sparsity, scope)
    if heads > 0 and not eval_source:
        raise PtmError("--heads scores heads on held-out data: give --eval_source (the prepared set the model was "
                       "fine-tuned on, e.g. bbc)")
    check_output_dir(output_dir, overwrite, (ckpt_path,))
    loaded = load_for_inference(ckpt_path, trust_checkpoint)
    if loaded.model_class != "sequence_classification":
        raise PtmError(f"prune works on sequence classifiers; {ckpt_path} is a {loaded.kind}")
    before = transformers_model(loaded.model).float().eval()
    model = copy.deepcopy(before)
    batches = None
    if heads > 0:
        valid = eval_records(eval_source, "validation", score_batches * batch_size)
        batches = labelled_batches(loaded, valid, batch_size, max_length)
    prune_model(model, specs, drop_layers, batches)
    out = Path(output_dir)
    with atomic_dir(out) as tmp, quiet_transformers():  # no "Writing model shards" bar
        model.save_pretrained(tmp)
        loaded.tokenizer.save_pretrained(tmp)
        (tmp / EXPORT_INFO).write_text(json.dumps({"model_class": loaded.model_class, "pruned_from": str(ckpt_path)}))
    records = eval_records(eval_source, "test", eval_limit) if eval_source else []
    texts = [r["text"] for r in records[:32]] or [SENTENCE]
    summary = {"source": str(ckpt_path), "threads": torch.get_num_threads(),
               **pruning_summary(before, model, heads > 0),
               "latency_ms": latencies({"before": before, "after": model}, loaded.tokenizer, texts, max_length,
                                       repeats)}
    if records:
        summary["metric"] = before_after(loaded, "test_acc", records, max_length, before=(loaded.ref, before),
                                         after=(str(out), model))
    write_summary(out, summary)
    metric = summary.get("metric")
    print(f"pruned {ckpt_path} -> {out}: {summary['params']['before']} -> {summary['params']['after']} "
          f"parameters, {model.config.num_hidden_layers} layers, sparsity {summary['sparsity']:.3f}" +
          (f", test_acc {metric['before']:.4f} -> {metric['after']:.4f}" if metric else ""))
    return 0
