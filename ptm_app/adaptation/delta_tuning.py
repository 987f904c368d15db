"""Delta tuning as a setting of any fine-tuning module (Ding et al. 2023, "Parameter-efficient fine-tuning
of large-scale pre-trained language models" §3: addition, specification and reparameterisation methods).

``DeltaTuningMixin`` gives a ``PtmModule`` subclass a ``delta`` spec (``backbones.delta.DeltaSpec``) applied
to its freshly built backbone, and delta-only checkpoints: the frozen base is rebuilt from ``backbone``
when the checkpoint loads, so a checkpoint holds just the delta (+ head) weights.  A backbone built from a
config alone (random weights) has no source to rebuild it from: its checkpoints keep every weight.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Optional

from lightning.pytorch.utilities import rank_zero_info

from ptm_app.backbones.delta import (PROMPT_METHODS, DeltaSpec, apply_delta, as_delta_spec, delta_state_dict,
                                     trainable_report)
from ptm_app.checkpoints import restore_frozen_base, strip_frozen_base


class DeltaTuningMixin:
    """Mix in before ``PtmModule``; call ``init_delta`` in ``__init__`` before ``super().__init__``."""

    head: str

    def init_delta(self, delta: Optional[DeltaSpec], delta_only: bool) -> None:
        self.delta, self.delta_only = as_delta_spec(delta), delta_only

    def virtual_positions(self) -> int:
        """Prefix, prompt and P-tuning put ``num_virtual_tokens`` before the input (Li & Liang 2021 §4.2; Lester et al.
        2021 §2): they take position ids too, so they count against the backbone's limit."""
        return self.delta.num_virtual_tokens if self.delta is not None and self.delta.method in PROMPT_METHODS else 0

    def style(self) -> str:
        return self.delta.method if self.delta is not None else "full fine-tuning"

    def configure_model(self) -> None:
        fresh = self.backbone is None
        super().configure_model()
        if fresh and self.delta is not None:
            self.delta_only = self.delta_only and bool(self.hparams.backbone)  # random weights stay in the checkpoint
            self.backbone = apply_delta(self.backbone, self.delta, self.head)
            report = trainable_report(self.backbone)
            rank_zero_info(f"delta {self.delta.method}: {report['trainable']:,} of {report['total']:,} parameters "
                           f"trainable ({report['percent']:.3f} %)")

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        if self.delta is not None:
            restore_frozen_base(checkpoint, self.backbone)  # frozen base + saved delta

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.delta is None:
            return
        hp = checkpoint["hyper_parameters"]
        hp["delta"] = asdict(self.delta)  # plain data: checkpoints load with weights_only=True
        if self.delta_only:  # the base is rebuilt from its source: keep only the delta (+ head) weights
            strip_frozen_base(checkpoint, delta_state_dict(self.backbone), self.hparams.backbone,
                              self.hparams.backbone_config)
