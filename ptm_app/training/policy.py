"""The base of every backbone policy: a behaviour ``PtmModule`` composes onto a module's freshly built backbone and
its training, instead of a mixin or a subclass (docs/design.md principle 10).

``PtmModule.configure_model`` builds the backbone, then runs each policy's ``apply`` in order; checkpoint save /
load run each policy's ``save`` / ``load``.  A task module (``adaptation.task_module.TaskModule``) also asks its
policies for a training loss that replaces the task's (a teacher's: ``compression.teacher_loss``), calls them before
each training batch and after each optimiser step (pruning's schedule and masks), lets them watch evaluation
batches, tells them when an epoch ends and adds their facts to ``summary.json``.  The policies themselves live with
their concept: ``adaptation.policies`` (delta tuning, frozen features, ``init_from``, L2-SP),
``compression.teacher_loss`` (knowledge distillation), ``compression.fake_quant`` (quantization-aware training) and
``compression.pruning_policy`` (layer, head and magnitude pruning), ``compression.early_exit_policy`` (off-ramps:
DeeBERT, PABEE) and ``compression.theseus_policy`` (BERT-of-Theseus, which builds the backbone itself)."""
from __future__ import annotations

from typing import Any, Optional

import torch


class BackbonePolicy:
    """One behaviour on the backbone; every hook is a no-op unless the policy needs it.  ``model_class``: the
    transformers class the backbone must be built as for this policy (None: the module's own);
    ``backbone_without_grad``: the backbone runs without gradients (the throughput monitor counts no backward pass
    through it)."""

    model_class: Optional[str] = None
    backbone_without_grad: bool = False

    builds = False  # the policy builds the backbone itself (``build``), so the module's settings need not

    def build(self, module, fitting: bool) -> Optional[torch.nn.Module]:
        """The backbone this policy builds in place of the module's own ``build_model`` (a successor from its
        predecessor), or None to leave it to the module."""
        return None

    def apply(self, module, fresh: bool, fitting: bool) -> None:
        """Run on each ``configure_model`` call (``fresh``: the backbone was just built; ``fitting``: by a fit);
        a policy may replace ``module.backbone``."""

    def train_mode(self, module, mode: bool) -> None:
        """After ``module.train(mode)`` (``eval()`` too): a policy may keep parts of the module in another mode."""

    def forward(self, module, batch: dict) -> Any:
        """The task module's outputs for ``batch`` computed by the policy instead of the backbone's head, or None."""
        return None

    def virtual_positions(self) -> int:
        """Positions the policy puts before the input (soft prompts)."""
        return 0

    def style(self) -> Optional[str]:
        """What the run is, for results tables; None leaves it to the module or another policy."""
        return None

    def penalty(self, module) -> Optional[tuple[str, torch.Tensor]]:
        """A ``(name, value)`` term added to the training loss, or None."""
        return None

    def training_loss(self, module, batch: dict) -> Optional[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
        """``(loss, {name: unweighted term})`` replacing the task's training loss (each term is logged as
        ``train/<name>``), or None to keep the task's."""
        return None

    def train_batch_start(self, module) -> None:
        """Before each training batch (at ``module.global_step``)."""

    def optimizer_stepped(self, module) -> None:
        """After each optimiser step."""

    def predict_outputs(self, module, batch: dict) -> Optional[tuple[Any, list[dict]]]:
        """``(outputs, one dict of extra fields per example)`` replacing the module's forward at prediction (an early
        exit's outputs and exit layers), or None."""
        return None

    def eval_step(self, module, stage: str, batch: dict, outputs: Any) -> None:
        """Watch one ``val`` / ``test`` batch (``outputs``: the module's)."""

    def epoch_end(self, module, stage: str) -> None:
        """An epoch of ``stage`` (``train``, ``val``, ``test``) ended (for ``train`` also called when the fit ends)."""

    def summary(self, module) -> dict:
        """Facts for the run's ``summary.json`` (sizes, sparsity ...)."""
        return {}

    def save(self, module, checkpoint: dict) -> None:
        """Write what the policy owns into ``checkpoint`` (plain data only: weights-only loading)."""

    def load(self, module, checkpoint: dict) -> None:
        """Read it back, before Lightning loads ``checkpoint['state_dict']``."""
