"""Model compression: knowledge distillation (teachers, students, losses), module replacement, early exit,
pruning, quantization.

Distillation, quantization-aware training, pruning, early exit and module replacing are policies task modules carry
(``compression.teacher_loss``, ``compression.fake_quant``, ``compression.pruning_policy``,
``compression.early_exit_policy``, ``compression.theseus_policy``); the module classes below are the names older
configs and checkpoints use.  They are imported
when first asked for (PEP 562): the task modules import the policies from this package, and these classes subclass
the task modules."""
import importlib

EXPORTS = {"CausalDistillationModule": "causal_distillation", "DistillationModule": "distillation",
           "DistillSpec": "teacher_loss", "EarlyExitModule": "early_exit", "ExitSpec": "early_exit_policy",
           "PretrainDistillationModule": "pretrain_distillation", "PruneSpec": "pruning", "PruningModule": "pruning",
           "QATSpec": "fake_quant", "QuantAwareModule": "quantization", "TheseusModule": "theseus",
           "TheseusSpec": "theseus_policy"}
__all__ = sorted(EXPORTS)


def __getattr__(name: str):
    if name not in EXPORTS:
        raise AttributeError(f"module 'ptm_app.compression' has no attribute '{name}'")
    return getattr(importlib.import_module(f"ptm_app.compression.{EXPORTS[name]}"), name)
