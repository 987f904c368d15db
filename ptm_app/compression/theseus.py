"""``TheseusModule``: the sequence classifier with the ``theseus`` policy (``compression.theseus_policy``:
BERT-of-Theseus, Xu et al. 2020 §3), the name and flat settings older configs and checkpoints use.  Every task module
whose backbone is an encoder stack takes ``theseus`` the same way."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ptm_app.adaptation.classification import SequenceClassificationModule
from ptm_app.compression.theseus_policy import (Theseus, TheseusSpec, blocks_swapped,  # noqa: F401
                                                draw_replacements, replacement_rate, replacing)
from ptm_app.training.optim import OptimConfig


class TheseusModule(SequenceClassificationModule):
    """Compress a fine-tuned classifier by progressive module replacing; logs ``train/replace_rate`` (p_t) and
    ``train/replaced`` (the fraction of modules replaced at that step) next to ``train/loss``.

    Args: ``predecessor``, ``compress_ratio``, ``successor_init``, ``curriculum_k``, ``curriculum_b``, ``seed``:
    those of ``compression.theseus_policy.TheseusSpec`` (``theseus`` of any task module).  ``backbone`` /
    ``backbone_config``: written by the checkpoint (the successor's config); leave them unset, the successor is built
    from the predecessor.
    """

    def __init__(self, predecessor: str, compress_ratio: int = 2, successor_init: Optional[list[int]] = None,
                 curriculum_k: float = 1e-3, curriculum_b: float = 0.3, labels: Optional[list[str]] = None,
                 optim: OptimConfig = OptimConfig(lr=2e-5), positive_label: Optional[str] = None, seed: int = 0,
                 backbone: Optional[str] = None, backbone_config: Optional[dict] = None):
        super().__init__(None, backbone_config, labels, optim, positive_label=positive_label)

    def make_policies(self) -> list:
        """The ``theseus`` policy from this class's flat settings."""
        hp = self.hparams
        spec = TheseusSpec(hp.predecessor, hp.compress_ratio, hp.successor_init, hp.curriculum_k, hp.curriculum_b,
                           hp.seed)
        return [replacing(spec, hp, self.model_class)]

    @property
    def replacing(self) -> Theseus:
        return self.policy(Theseus)

    @property
    def predecessor(self) -> nn.Module:
        return self.replacing.predecessor

    def predecessor_blocks(self) -> nn.ModuleList:
        return self.replacing.predecessor_blocks()

    def replace_rate(self, step: int) -> float:
        return replacement_rate(step, self.hparams.curriculum_k, self.hparams.curriculum_b)

    def mixed_blocks(self, replaced: torch.Tensor) -> list[nn.Module]:
        return self.replacing.mixed_blocks(self, replaced)

    def mixed_logits(self, batch: dict, replaced: torch.Tensor) -> torch.Tensor:
        return self.replacing.mixed_outputs(self, batch, replaced)
