"""Freezing schedules for fine-tuning, as Lightning callbacks (``trainer.callbacks`` in YAML).

Layers are numbered by ``backbones.layers.layer_ids``: 0 = embeddings, 1..L = encoder blocks, L+1 = the
rest (pooler and task head).  Before every training batch the stage is derived from
``trainer.current_epoch`` (or ``trainer.global_step``) alone, so a resumed run (``--ckpt_path last``)
freezes exactly what the uninterrupted run froze.  Only parameters the optimiser holds are switched:
weights frozen for the whole run (``init_from.freeze``, a feature extractor's backbone) stay frozen.
A frozen parameter gets no gradient, so AdamW skips it; its moments wait until it is unfrozen.
With DDP, use ``strategy: ddp_find_unused_parameters_true``.
"""
from __future__ import annotations

from typing import Literal

from lightning.pytorch.callbacks import Callback

from ptm_app.backbones.layers import layer_ids, num_layers
from ptm_app.errors import PtmError


class _Unfreezing(Callback):
    """Base: ``trainable(stage, top)`` names the layers that train at a stage; ``top`` = L+1."""

    def __init__(self, interval: Literal["epoch", "step"] = "epoch"):
        self.interval = interval

    def count(self, trainer) -> int:
        """Epochs (or optimiser steps) done so far."""
        return trainer.current_epoch if self.interval == "epoch" else trainer.global_step

    def stage(self, trainer) -> int:
        raise NotImplementedError

    def trainable(self, stage: int, top: int) -> set[int]:
        raise NotImplementedError

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        """Set ``requires_grad`` of the optimiser's parameters for the current stage."""
        owned = {id(p) for opt in trainer.optimizers for group in opt.param_groups for p in group["params"]}
        layers = self.trainable(self.stage(trainer), num_layers(pl_module) + 1)
        ids = layer_ids(pl_module)
        for name, p in pl_module.named_parameters():
            if id(p) in owned:
                p.requires_grad_(ids[name] in layers)


class _Periodic(_Unfreezing):
    """A new stage every ``every`` epochs (or optimiser steps)."""

    def __init__(self, every: int = 1, interval: Literal["epoch", "step"] = "epoch"):
        if every < 1:
            raise PtmError(f"{type(self).__name__}: every must be >= 1 (got {every})")
        super().__init__(interval)
        self.every = every

    def stage(self, trainer) -> int:
        return self.count(trainer) // self.every


class GradualUnfreezing(_Periodic):
    """ULMFiT §3.3 (Howard & Ruder 2018): train only the head first, then unfreeze one more layer from the
    top every ``every`` epochs (or steps): stage s trains layers ≥ L+1−s; from stage L+1 on, everything."""

    def trainable(self, stage: int, top: int) -> set[int]:
        return set(range(max(0, top - stage), top + 1))


class SequentialUnfreezing(_Unfreezing):
    """Sequential unfreezing (Chronopoulou et al. 2019, SiATL): the task head alone, then also the encoder
    layers (all but the embeddings), then everything; ``milestones`` are the epochs (or steps) at which
    stages 2 and 3 start."""

    def __init__(self, milestones: tuple[int, int] = (1, 2), interval: Literal["epoch", "step"] = "epoch"):
        super().__init__(interval)
        self.milestones = tuple(milestones)

    def stage(self, trainer) -> int:
        return sum(self.count(trainer) >= m for m in self.milestones)

    def trainable(self, stage: int, top: int) -> set[int]:
        return [{top}, set(range(1, top + 1)), set(range(top + 1))][min(stage, 2)]


class ChainThaw(_Periodic):
    """Chain-thaw (Felbo et al. 2017, DeepMoji): the new head alone, then each layer on its own from the
    first (embeddings) up to layer L, then all layers; every stage lasts ``every`` epochs (or steps)."""

    def trainable(self, stage: int, top: int) -> set[int]:
        if stage == 0:
            return {top}
        return {stage - 1} if stage < top + 1 else set(range(top + 1))
