"""``PruningModule``: the sequence classifier with the ``pruning`` policy (``compression.pruning_policy``: layer
dropping, Sajjad et al. 2020 §3; iterative head pruning, Michel et al. 2019 §4.3; magnitude pruning, Zhu & Gupta
2017), the name older configs and checkpoints use.  Every task module takes ``pruning`` the same way."""
from __future__ import annotations

from typing import Optional

import torch

from ptm_app.adaptation.classification import SequenceClassificationModule
from ptm_app.compression.pruning_policy import (HeadPruningSpec, LayerDropSpec, PruneSpec, Pruning,  # noqa: F401
                                                as_prune_spec, drop_layers, layers_to_drop, on_disk_mb)
from ptm_app.training.optim import OptimConfig


class PruningModule(SequenceClassificationModule):
    """Fine-tuning with pruning; every ``SequenceClassificationModule`` setting applies, and ``backbone`` may name a
    run (looked up under the runs directory, like a teacher).

    Args:
        pruning: ``layers`` (``LayerDropSpec``), ``heads`` (``HeadPruningSpec``), ``magnitude``
            (``compression.magnitude.MagnitudeSpec``); each optional.
    """

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 labels: Optional[list[str]] = None, optim: OptimConfig = OptimConfig(lr=3e-5),
                 gradient_checkpointing: bool = False, pruning: PruneSpec = PruneSpec(),
                 positive_label: Optional[str] = None):
        super().__init__(backbone, backbone_config, labels, optim, gradient_checkpointing,
                         positive_label=positive_label)

    @property
    def spec(self) -> PruneSpec:
        return self.policy(Pruning).spec

    def build_model(self):
        if not self.hparams.backbone:
            return super().build_model()
        from ptm_app.backbones.build import build_backbone
        from ptm_app.compression.teacher import resolve_teacher

        # the RNG is left as it was: the first run from a checkpoint exports it (a random init, then its weights)
        with torch.random.fork_rng(devices=[]):
            return build_backbone(self.model_class, resolve_teacher(self.hparams.backbone), self.hparams.backbone_config,
                                  **self.config_updates())
