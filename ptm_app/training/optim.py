"""AdamW with linear warm-up, then linear / cosine decay (BERT: Devlin et al. 2019 App. A.2;
RoBERTa: Liu et al. 2019 §3.1).  Weight decay skips biases and normalisation weights.

The optimisers of large-batch pre-training are settings of the same config (``name``): LAMB (You et al. 2020,
``training/lamb.py``) and Adafactor (Shazeer & Stern 2018, torch's ``torch.optim.Adafactor``: factored second
moments, relative step size ``min(lr, 1/√t)·max(ε2, RMS(x))``, update clipping at ``clip_threshold``).

ULMFiT (Howard & Ruder 2018 §3.2): discriminative fine-tuning (``layer_decay``: each layer's LR is the
next higher layer's divided by the decay) and slanted triangular learning rates (``schedule: stlr``)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, is_dataclass
from typing import Literal, Optional

import torch

from ptm_app.errors import PtmError


@dataclass
class OptimConfig:
    """Optimiser and learning-rate schedule.

    Args:
        name: ``adamw`` (default), ``lamb`` (layer-wise trust ratio ‖x‖/‖u‖ on every matrix; biases and norm
            weights take a plain step, as the reference BERT LAMB) or ``adafactor`` (T5's optimiser: ``lr`` caps the
            relative step ``min(lr, 1/√t)``, so T5's schedule is ``lr: 0.01, schedule: constant, warmup: 0``;
            ``betas`` and ``eps`` do not apply).
        lr: peak learning rate.
        weight_decay: decoupled weight decay for matrices (biases and norm weights get none).
        betas / eps: AdamW moments.
        warmup: warm-up length: a fraction of all steps if < 1, else a number of steps.
        schedule: decay after warm-up: ``linear`` to 0, ``cosine`` to ``min_lr_ratio``, or ``constant``;
            or ``stlr``, ULMFiT's slanted triangle (eq. 3; it has its own rise, so ``warmup`` is ignored).
        min_lr_ratio: floor of the cosine/linear decay as a fraction of ``lr``.
        layer_decay: discriminative fine-tuning (ULMFiT §3.2, 2.6 there): the top encoder layer and the
            head get ``lr``, every layer below gets the LR of the one above divided by ``layer_decay``,
            so the embeddings get ``lr / layer_decay**L``.  1.0 = one LR for all.
        cut_frac / ratio: STLR's rising fraction of all steps and its lowest/peak LR ratio (0.1 and 32).
        beta2_decay / clip_threshold: Adafactor's τ in ``β2_t = 1 - t^τ`` (-0.8, paper §7.2) and update clipping
            threshold d (1.0, §6; torch requires d >= 1); adafactor only.
        fused: torch's fused AdamW (one kernel over all parameters: ``fused_if_possible``).  None (default): fused
            wherever it can run, on a CPU and on a GPU; true: fused or a one-line error saying why it cannot be;
            false: torch's default (``foreach`` on a GPU, a loop over the tensors on a CPU).
    """

    name: Literal["adamw", "lamb", "adafactor"] = "adamw"
    lr: float = 5e-5
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup: float = 0.06
    schedule: Literal["linear", "cosine", "constant", "stlr"] = "linear"
    min_lr_ratio: float = 0.0
    layer_decay: float = 1.0
    cut_frac: float = 0.1
    ratio: float = 32.0
    fused: Optional[bool] = None
    beta2_decay: float = -0.8
    clip_threshold: float = 1.0

    def __post_init__(self) -> None:
        if self.name not in ("adamw", "lamb", "adafactor"):
            raise PtmError(f"optim.name '{self.name}' is not an optimiser here; use adamw, lamb or adafactor")
        if self.fused and self.name != "adamw":
            raise PtmError(f"optim.fused applies to adamw only (name: {self.name}); remove it")
        if self.name != "adafactor" and (self.beta2_decay != -0.8 or self.clip_threshold != 1.0):
            raise PtmError(f"optim.beta2_decay and optim.clip_threshold are Adafactor's (name: {self.name}); "
                           f"remove them or set name: adafactor")
        if not self.beta2_decay <= 0 or self.clip_threshold < 1:
            raise PtmError(f"optim.beta2_decay must be <= 0 and optim.clip_threshold >= 1 (got {self.beta2_decay}, "
                           f"{self.clip_threshold})")
        if self.layer_decay <= 0:
            raise PtmError(f"optim.layer_decay must be > 0 (got {self.layer_decay}); 1.0 turns it off")
        if not 0 < self.cut_frac < 1 or self.ratio < 1:
            raise PtmError(f"optim.cut_frac must be in (0, 1) and optim.ratio >= 1 (got {self.cut_frac}, {self.ratio})")


def as_optim_config(value) -> OptimConfig:
    if isinstance(value, OptimConfig):
        return value
    if is_dataclass(value):
        value = asdict(value)
    return OptimConfig(**(value or {}))


def stlr_factor(step: int, total: int, cut_frac: float = 0.1, ratio: float = 32.0) -> float:
    """ULMFiT eq. 3 (Howard & Ruder 2018 §3.2): rise linearly for ``cut = floor(T·cut_frac)`` steps from
    ``1/ratio`` to 1, then fall linearly back to ``1/ratio`` at step T."""
    cut = max(1, math.floor(total * cut_frac))
    p = step / cut if step < cut else 1 - (step - cut) / (cut * (1 / cut_frac - 1))
    return (1 + max(0.0, p) * (ratio - 1)) / ratio


def lr_factor(step: int, total: int, warmup_steps: int, schedule: str, min_ratio: float = 0.0,
              cut_frac: float = 0.1, ratio: float = 32.0) -> float:
    """Multiplier of the peak LR at optimiser step ``step`` (0-based)."""
    if schedule == "stlr":
        return stlr_factor(step, total, cut_frac, ratio)
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total - warmup_steps))
    if schedule == "linear":
        return max(min_ratio, 1.0 - progress * (1.0 - min_ratio))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def param_groups(model: torch.nn.Module, weight_decay: float, layer_decay: float = 1.0) -> list[dict]:
    """Decay matrices only: 1-D parameters (biases, LayerNorm weights) get no decay.

    With ``layer_decay != 1`` there is one pair of groups per layer (``backbones.layers.layer_ids``),
    each with its ``layer`` index and ``lr_scale = layer_decay ** -(L - layer)`` (1 for the top layer and the head).
    """
    if layer_decay != 1.0:
        return _layer_groups(model, weight_decay, layer_decay)
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def _layer_groups(model: torch.nn.Module, weight_decay: float, layer_decay: float) -> list[dict]:
    from ptm_app.backbones.layers import layer_ids, num_layers

    ids, top = layer_ids(model), num_layers(model)
    groups: dict[tuple[int, bool], list] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            groups.setdefault((ids[name], p.ndim < 2), []).append(p)
    return [{"params": params, "weight_decay": 0.0 if no_decay else weight_decay, "layer": layer,
             "lr_scale": layer_decay ** -max(0, top - layer)}
            for (layer, no_decay), params in sorted(groups.items())]


def fused_if_possible(model: torch.nn.Module, groups: list[dict], wanted: Optional[bool] = None) -> dict:
    """``{"fused": True}`` when every parameter is a plain floating-point ``nn.Parameter`` on a CPU or CUDA device
    (``wanted``: ``OptimConfig.fused``; None = wherever possible, False = never, True = or a ``PtmError``).

    The fused AdamW is one kernel over all parameters instead of a Python loop over each tensor: 80 → 16 ms a
    step for MiniLM's 23M parameters on 2 CPU cores (benchmarks/README.md), and the transformers ``Trainer``'s
    default since torch 2.8.  Sharded parameters (FSDP2's DTensor, DeepSpeed's) keep torch's default, and so do
    runs that clip gradients under fp16 loss scaling (``16-mixed``), where Lightning refuses to clip for an optimizer
    that unscales inside its step.  ``bf16-mixed`` has no loss scale: ``PtmModule.configure_gradient_clipping``
    clips there as in full precision, so a ``PtmModule`` keeps the fused step (other modules keep Lightning's rule).
    """
    if wanted is False:
        return {}
    why = _unfused_reason(model, groups)
    if why and wanted:
        raise PtmError(f"optim.fused: true, but {why}; set model.init_args.optim.fused: null (fused where possible)")
    return {} if why else {"fused": True}


def _unfused_reason(model: torch.nn.Module, groups: list[dict]) -> Optional[str]:
    """Why the fused AdamW cannot run for ``model``'s ``groups`` (None if it can)."""
    trainer = getattr(model, "_trainer", None)
    if trainer is not None and trainer.gradient_clip_val:
        from lightning.pytorch.plugins.precision import MixedPrecision

        plugin = trainer.precision_plugin
        clips_itself = (type(plugin) is MixedPrecision and plugin.scaler is None  # bf16-mixed, a PtmModule
                        and getattr(model, "clips_without_unscaling", False))
        if isinstance(plugin, MixedPrecision) and not clips_itself:
            return (f"Lightning cannot clip gradients (gradient_clip_val={trainer.gradient_clip_val}) for a fused "
                    f"optimizer under precision {plugin.precision}")
    params = [p for group in groups for p in group["params"]]
    if not params:
        return "there are no trainable parameters"
    for p in params:
        if type(p) is not torch.nn.Parameter or hasattr(p, "ds_id"):
            return f"a parameter is a {type(p).__name__} (sharded: FSDP or DeepSpeed)"
        if not p.is_floating_point() or p.device.type not in ("cpu", "cuda"):
            return f"a parameter is {p.dtype} on {p.device.type}"
    return None


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, total_steps: int) -> dict:
    """Lightning ``configure_optimizers`` return value: the optimiser ``cfg.name`` + a per-step LambdaLR."""
    groups = param_groups(model, cfg.weight_decay, cfg.layer_decay)
    for group in groups:
        if "lr_scale" in group:
            group["lr"] = cfg.lr * group["lr_scale"]
    optimizer = make_optimizer(model, groups, cfg)
    total = max(1, int(total_steps))
    warmup = int(cfg.warmup * total) if cfg.warmup < 1 else int(cfg.warmup)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total, warmup, cfg.schedule, cfg.min_lr_ratio, cfg.cut_frac, cfg.ratio)
    )
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1}}


def make_optimizer(model: torch.nn.Module, groups: list[dict], cfg: OptimConfig) -> torch.optim.Optimizer:
    """The optimiser named by ``cfg.name`` over ``groups`` (``param_groups``)."""
    if cfg.name == "lamb":
        from ptm_app.training.lamb import Lamb

        for group in groups:  # the trust ratio on matrices; biases and norm weights take a plain step
            group["adapt"] = all(p.ndim > 1 for p in group["params"])
        return Lamb(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps)
    if cfg.name == "adafactor":
        return torch.optim.Adafactor(groups, lr=cfg.lr, beta2_decay=cfg.beta2_decay, d=cfg.clip_threshold)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                             **fused_if_possible(model, groups, cfg.fused))
