"""``python main.py prune``: one-shot pruning of a trained classifier without fine-tuning (Michel et al. 2019 §4.3:
heads removed iteratively by importance recomputed on held-out data each round; Sajjad et al. 2020: layers dropped;
Zhu & Gupta's magnitude criterion in one shot), written as a ``save_pretrained`` directory that ``predict`` and
``quantize`` load, with ``summary.json``: parameters, size on disk, sparsity, heads per layer, CPU latency and, on
``--eval_source``'s test split, the accuracy before and after.  Pruning while fine-tuning is ``PruningModule``."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Literal, Optional

import torch
from torch.nn import functional as F

from ptm_app.backbones.build import quiet_transformers
from ptm_app.errors import PtmError
from ptm_app.paths import atomic_dir, atomic_file, check_output_dir


def parse_layers(value: str):
    """``top:K``, ``alternate:K`` or a comma-separated list of layers (1..L)."""
    from ptm_app.compression.pruning import LayerDropSpec

    kind, _, k = value.partition(":")
    try:
        if kind in ("top", "alternate"):
            return LayerDropSpec(kind, int(k))
        return LayerDropSpec([int(x) for x in value.split(",")])
    except ValueError:
        raise PtmError(f"--drop_layers {value}: use top:K, alternate:K or a list of layers such as 2,4") from None


def labelled_batches(loaded, records: list[dict], batch_size: int, max_length: int) -> list[dict]:
    """Tokenised batches with label ids (the model's ``label2id``) for the importance scores."""
    config = loaded.model.config
    label2id = {str(k): int(v) for k, v in (config.label2id or {}).items()}
    unknown = sorted({r["label"] for r in records} - set(label2id))
    if unknown:
        raise PtmError(f"--eval_source labels {unknown[:3]} are not the model's labels ({sorted(label2id)[:5]}); "
                       f"give the prepared set the model was fine-tuned on")
    batches = []
    for start in range(0, len(records), batch_size):
        chunk = records[start:start + batch_size]
        enc = loaded.tokenizer([r["text"] for r in chunk], truncation=True, max_length=max_length, padding=True,
                               return_tensors="pt")
        batches.append({**enc, "labels": torch.tensor([label2id[r["label"]] for r in chunk])})
    return batches


def classification_loss(model, batch: dict) -> torch.Tensor:
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    return F.cross_entropy(model(**inputs).logits.float(), batch["labels"])


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
    from ptm_app.compression import heads as head_pruning
    from ptm_app.compression.magnitude import MagnitudeSpec, magnitude_masks, prunable_weights, sparsity_of
    from ptm_app.compression.pruning import HeadPruningSpec, layers_to_drop, on_disk_mb
    from ptm_app.compression.pruning import drop_layers as remove_layers  # the parameter is named drop_layers
    from ptm_app.compression.quantize import SENTENCE, accuracy, eval_records, latencies
    from ptm_app.inference.loading import EXPORT_INFO, LoadedModel, load_for_inference

    heads_spec = HeadPruningSpec(target=heads, rounds=rounds, every=1, score_batches=score_batches)
    magnitude = MagnitudeSpec(sparsity=sparsity, scope=scope)
    if heads > 0 and not eval_source:
        raise PtmError("--heads scores heads on held-out data: give --eval_source (the prepared set the model was "
                       "fine-tuned on, e.g. bbc)")
    check_output_dir(output_dir, overwrite, (ckpt_path,))
    loaded = load_for_inference(ckpt_path, trust_checkpoint)
    if loaded.head != "sequence_classification":
        raise PtmError(f"prune works on sequence classifiers; {ckpt_path} is a {loaded.kind}")
    before = transformers_model(loaded.model).float().eval()
    model = copy.deepcopy(before)
    if drop_layers:
        remove_layers(model, layers_to_drop(parse_layers(drop_layers), model.config.num_hidden_layers))
    if heads > 0:
        valid = eval_records(eval_source, "validation", score_batches * batch_size)
        batches = labelled_batches(loaded, valid, batch_size, max_length)
        total = sum(head_pruning.heads_per_layer(model))
        for r in range(1, heads_spec.rounds + 1):
            gone = total - sum(head_pruning.heads_per_layer(model))
            wanted = round(heads_spec.target * total * r / heads_spec.rounds)
            if wanted > gone:
                scores = head_pruning.michel_scores(model, batches, classification_loss)
                head_pruning.prune_heads(model, head_pruning.heads_to_prune(scores, wanted - gone))
    if sparsity > 0:
        weights = prunable_weights(model)
        with torch.no_grad():
            for name, mask in magnitude_masks(weights, magnitude.sparsity, magnitude.scope).items():
                weights[name].mul_(mask)
    out = Path(output_dir)
    with atomic_dir(out) as tmp, quiet_transformers():  # no "Writing model shards" bar
        model.save_pretrained(tmp)
        loaded.tokenizer.save_pretrained(tmp)
        (tmp / EXPORT_INFO).write_text(json.dumps({"head": loaded.head, "pruned_from": str(ckpt_path)}))
    records = eval_records(eval_source, "test", eval_limit) if eval_source else []
    texts = [r["text"] for r in records[:32]] or [SENTENCE]
    summary = {"source": str(ckpt_path), "threads": torch.get_num_threads(),
               "params": {"before": sum(p.numel() for p in before.parameters()),
                          "after": sum(p.numel() for p in model.parameters())},
               "nonzero_params": sum(int((p != 0).sum()) for p in model.parameters()),
               "model_mb": {"before": on_disk_mb(before), "after": on_disk_mb(model)},
               "sparsity": round(sparsity_of(prunable_weights(model).values()), 6),
               "num_hidden_layers": model.config.num_hidden_layers,
               "latency_ms": latencies({"before": before, "after": model}, loaded.tokenizer, texts, max_length,
                                       repeats)}
    if heads > 0:
        summary["heads_per_layer"] = head_pruning.heads_per_layer(model)
        summary["pruned_heads"] = head_pruning.recorded_pruned(model)
    if records:
        summary["metric"] = {"name": "test_acc", "examples": len(records),
                             "before": accuracy(LoadedModel(loaded.ref, before, loaded.tokenizer, loaded.head),
                                                records, max_length),
                             "after": accuracy(LoadedModel(str(out), model, loaded.tokenizer, loaded.head),
                                               records, max_length)}
    with atomic_file(out / "summary.json", "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=2)
    metric = summary.get("metric")
    print(f"pruned {ckpt_path} -> {out}: {summary['params']['before']} -> {summary['params']['after']} "
          f"parameters, {model.config.num_hidden_layers} layers, sparsity {summary['sparsity']:.3f}" +
          (f", test_acc {metric['before']:.4f} -> {metric['after']:.4f}" if metric else ""))
    return 0
