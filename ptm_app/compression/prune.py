"""One-shot pruning of a trained classifier without fine-tuning (Michel et al. 2019 §4.3: heads removed iteratively
by importance recomputed on held-out data each round; Sajjad et al. 2020: layers dropped; Zhu & Gupta's magnitude
criterion in one shot).  The command (``python main.py prune``, ``inference.compress_commands.prune``) writes the
result as a ``save_pretrained`` directory that ``predict`` and ``quantize`` load, with ``summary.json``.  Pruning
while fine-tuning is ``PruningModule``."""
from __future__ import annotations

from typing import Optional

import torch
from torch.nn import functional as F

from ptm_app.errors import PtmError


def parse_layers(value: str):
    """``top:K``, ``alternate:K`` or a comma-separated list of layers (1..L)."""
    from ptm_app.compression.pruning_policy import LayerDropSpec

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


def pruning_specs(heads: float = 0.0, rounds: int = 5, score_batches: int = 8, sparsity: float = 0.0,
                  scope: str = "global"):
    """The checked settings ``(HeadPruningSpec, MagnitudeSpec)``: a value out of range is one line, before anything
    is loaded."""
    from ptm_app.compression.magnitude import MagnitudeSpec
    from ptm_app.compression.pruning_policy import HeadPruningSpec

    return (HeadPruningSpec(target=heads, rounds=rounds, every=1, score_batches=score_batches),
            MagnitudeSpec(sparsity=sparsity, scope=scope))


def prune_model(model, specs, drop_layers: Optional[str] = None, batches: Optional[list[dict]] = None) -> None:
    """Prune a transformers sequence classifier in place, without training: drop layers (``top:K``, ``alternate:K``
    or a list), remove the fraction ``specs[0].target`` of all attention heads over its rounds, each scoring the
    heads left on ``batches`` (Michel et al. 2019 §4.3), then zero the ``specs[1].sparsity`` smallest block weights
    (Zhu & Gupta).  ``specs``: ``pruning_specs``."""
    from ptm_app.compression import heads as head_pruning
    from ptm_app.compression.magnitude import magnitude_masks, prunable_weights
    from ptm_app.compression.pruning_policy import layers_to_drop
    from ptm_app.compression.pruning_policy import drop_layers as remove_layers  # the parameter is named drop_layers

    heads_spec, magnitude = specs
    if drop_layers:
        remove_layers(model, layers_to_drop(parse_layers(drop_layers), model.config.num_hidden_layers))
    if heads_spec.target > 0:
        total = sum(head_pruning.heads_per_layer(model))
        for r in range(1, heads_spec.rounds + 1):
            gone = total - sum(head_pruning.heads_per_layer(model))
            wanted = round(heads_spec.target * total * r / heads_spec.rounds)
            if wanted > gone:
                scores = head_pruning.michel_scores(model, batches, classification_loss)
                head_pruning.prune_heads(model, head_pruning.heads_to_prune(scores, wanted - gone))
    if magnitude.sparsity > 0:
        weights = prunable_weights(model)
        with torch.no_grad():
            for name, mask in magnitude_masks(weights, magnitude.sparsity, magnitude.scope).items():
                weights[name].mul_(mask)


def pruning_summary(before, after, heads: bool) -> dict:
    """Parameters, non-zero parameters, size on disk, block sparsity and layers of the pruned model (and its heads
    per layer when heads were pruned), beside the model before."""
    from ptm_app.compression import heads as head_pruning
    from ptm_app.compression.magnitude import prunable_weights, sparsity_of
    from ptm_app.compression.pruning_policy import on_disk_mb

    summary = {"params": {"before": sum(p.numel() for p in before.parameters()),
                          "after": sum(p.numel() for p in after.parameters())},
               "nonzero_params": sum(int((p != 0).sum()) for p in after.parameters()),
               "model_mb": {"before": on_disk_mb(before), "after": on_disk_mb(after)},
               "sparsity": round(sparsity_of(prunable_weights(after).values()), 6),
               "num_hidden_layers": after.config.num_hidden_layers}
    if heads:
        summary["heads_per_layer"] = head_pruning.heads_per_layer(after)
        summary["pruned_heads"] = head_pruning.recorded_pruned(after)
    return summary
