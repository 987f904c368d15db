"""Model compression: knowledge distillation (teachers, students, losses), module replacement, early exit,
pruning, quantization.

Distillation and quantization-aware training are policies any task module carries (``compression.teacher_loss``,
``compression.fake_quant``); the module classes below are the names configs and checkpoints use.  They are imported
when first asked for (PEP 562): the task modules import the policies from this package, and these classes subclass
the task modules."""
import importlib

EXPORTS = {"CausalDistillationModule": "causal_distillation", "DistillationModule": "distillation",
           "DistillSpec": "teacher_loss", "EarlyExitModule": "early_exit",
           "PretrainDistillationModule": "pretrain_distillation", "PruneSpec": "pruning", "PruningModule": "pruning",
           "QATSpec": "fake_quant", "QuantAwareModule": "quantization", "TheseusModule": "theseus"}
__all__ = sorted(EXPORTS)


def __getattr__(name: str):
    if name not in EXPORTS:
        raise AttributeError(f"module 'ptm_app.compression' has no attribute '{name}'")
    return getattr(importlib.import_module(f"ptm_app.compression.{EXPORTS[name]}"), name)
