"""``EarlyExitModule``: the sequence classifier with the ``early_exit`` policy (``compression.early_exit_policy``:
DeeBERT, Xin et al. 2020 §3; PABEE, Zhou et al. 2020 §3), the name and flat settings older configs and checkpoints
use (its off-ramps are still ``exits.*``).  Every classifier and tagger takes ``early_exit`` the same way."""
from __future__ import annotations

from typing import Literal, Optional

import torch

from ptm_app.adaptation.classification import SequenceClassificationModule
from ptm_app.compression.early_exit_policy import (EarlyExit, ExitSpec, OffRamp, TokenRamp,  # noqa: F401
                                                   entropy, entropy_exit_layers, exit_predictions, exit_table,
                                                   parse_exit_rule, pabee_loss, patience_exit_layers, unit_facts)
from ptm_app.training.optim import OptimConfig


class EarlyExitModule(SequenceClassificationModule):
    """A BERT-style classifier with an off-ramp after each of its first L−1 layers (layer L is its own head).

    Logs the final layer's ``val/acc`` … as usual and, for every entropy threshold S and patience t,
    ``val/entropy_S/acc``, ``val/entropy_S/exit_layer``, ``val/entropy_S/speedup`` and ``val/patience_t/...``
    (and ``test/...``); ``summary.json`` gets the table as ``early_exit``.

    Args: ``method``, ``final_steps``, ``entropy_thresholds``, ``patiences``, ``predict_exit``: those of
    ``compression.early_exit_policy.ExitSpec`` (``early_exit`` of a ``SequenceClassificationModule``).
    """

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 labels: Optional[list[str]] = None, optim: OptimConfig = OptimConfig(lr=3e-5),
                 method: Literal["deebert", "pabee"] = "pabee", final_steps: int = 0,
                 entropy_thresholds: list[float] = (0.1, 0.3, 0.6), patiences: list[int] = (1, 2, 3),
                 positive_label: Optional[str] = None, predict_exit: Optional[str] = None):
        super().__init__(backbone, backbone_config, labels, optim, positive_label=positive_label)

    def make_policies(self) -> list:
        """The ``early_exit`` policy from this class's flat settings."""
        hp = self.hparams
        spec = ExitSpec(method=hp.method, final_steps=hp.final_steps, entropy_thresholds=list(hp.entropy_thresholds),
                        patiences=list(hp.patiences), predict_exit=hp.predict_exit)
        return [EarlyExit(spec, self.kind_name())]

    @property
    def exiting(self) -> EarlyExit:
        return self.policy(EarlyExit)

    def layer_logits(self, batch: dict, backbone_grad: bool = True) -> list[torch.Tensor]:
        """Logits of the classifier after every layer 1..L (layer L: the model's own pooler and head)."""
        return self.exiting.layer_logits(self, batch, backbone_grad)

    def exit_table(self, layer_logits: torch.Tensor, labels: torch.Tensor) -> list[dict]:
        """One row per criterion: accuracy at the exit, mean exit layer, layer speed-up."""
        spec = self.exiting.spec
        return exit_table(unit_facts(layer_logits, labels), spec.entropy_thresholds, spec.patiences)

    def exit_forward(self, batch: dict, rule: Optional[tuple[str, float]] = None):
        """``EarlyExit.exit_forward``: the forward that stops once every example has exited."""
        return self.exiting.exit_forward(self, batch, rule)
