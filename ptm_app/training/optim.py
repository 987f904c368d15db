"""AdamW with linear warm-up, then linear / cosine decay (BERT: Devlin et al. 2019 App. A.2;
RoBERTa: Liu et al. 2019 §3.1).  Weight decay skips biases and normalisation weights."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, is_dataclass
from typing import Literal

import torch


@dataclass
class OptimConfig:
    """Optimiser and learning-rate schedule.

    Args:
        lr: peak learning rate.
        weight_decay: decoupled weight decay for matrices (biases and norm weights get none).
        betas / eps: AdamW moments.
        warmup: warm-up length: a fraction of all steps if < 1, else a number of steps.
        schedule: decay after warm-up: ``linear`` to 0, ``cosine`` to ``min_lr_ratio``, or ``constant``.
        min_lr_ratio: floor of the cosine/linear decay as a fraction of ``lr``.
    """

    lr: float = 5e-5
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup: float = 0.06
    schedule: Literal["linear", "cosine", "constant"] = "linear"
    min_lr_ratio: float = 0.0


def as_optim_config(value) -> OptimConfig:
    if isinstance(value, OptimConfig):
        return value
    if is_dataclass(value):
        value = asdict(value)
    return OptimConfig(**(value or {}))


def lr_factor(step: int, total: int, warmup_steps: int, schedule: str, min_ratio: float = 0.0) -> float:
    """Multiplier of the peak LR at optimiser step ``step`` (0-based)."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total - warmup_steps))
    if schedule == "linear":
        return max(min_ratio, 1.0 - progress * (1.0 - min_ratio))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices only: 1-D parameters (biases, LayerNorm weights) get no decay."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, total_steps: int) -> dict:
    """Lightning ``configure_optimizers`` return value: AdamW + a per-step LambdaLR."""
    optimizer = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps)
    total = max(1, int(total_steps))
    warmup = int(cfg.warmup * total) if cfg.warmup < 1 else int(cfg.warmup)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total, warmup, cfg.schedule, cfg.min_lr_ratio)
    )
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1}}
