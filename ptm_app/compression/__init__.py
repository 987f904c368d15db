"""Model compression: knowledge distillation (teachers, students, losses), module replacement, early exit,
pruning, quantization.

Distillation, quantization-aware training, pruning, early exit and module replacing are policies task modules carry
(``compression.teacher_loss``, ``compression.fake_quant``, ``compression.pruning_policy``,
``compression.early_exit_policy``, ``compression.theseus_policy``); the sequence classifiers with one of them preset,
under the names older configs and checkpoints use (``DistillationModule``, ``TheseusModule``, ``EarlyExitModule``,
``PruningModule``, ``QuantAwareModule``), live above, in ``adaptation.compressed``.  This package imports nothing of
``adaptation``: the task modules import its policies.  Its names are imported when first asked for (PEP 562)."""
import importlib

EXPORTS = {"CausalDistillationModule": "causal_distillation", "DistillSpec": "teacher_loss",
           "ExitSpec": "early_exit_policy", "PretrainDistillationModule": "pretrain_distillation",
           "PruneSpec": "pruning_policy", "QATSpec": "fake_quant", "TheseusSpec": "theseus_policy"}
__all__ = sorted(EXPORTS)


def __getattr__(name: str):
    if name not in EXPORTS:
        from ptm_app.checkpoint_io.module_classes import RENAMED_MODULE_CLASSES

        moved = RENAMED_MODULE_CLASSES.get(f"{__name__}.{name}")
        raise AttributeError(f"module '{__name__}' has no attribute '{name}'"
                             + (f"; it moved: import it from {moved.rpartition('.')[0]}" if moved else ""))
    return getattr(importlib.import_module(f"ptm_app.compression.{EXPORTS[name]}"), name)
