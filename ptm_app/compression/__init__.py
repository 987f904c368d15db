"""Model compression: knowledge distillation (teachers, students, losses), module replacement, early exit,
pruning, quantization."""
from ptm_app.compression.causal_distillation import CausalDistillationModule
from ptm_app.compression.distillation import DistillationModule, DistillSpec
from ptm_app.compression.early_exit import EarlyExitModule
from ptm_app.compression.pretrain_distillation import PretrainDistillationModule
from ptm_app.compression.pruning import PruneSpec, PruningModule
from ptm_app.compression.quantization import QATSpec, QuantAwareModule
from ptm_app.compression.theseus import TheseusModule

__all__ = ["CausalDistillationModule", "DistillationModule", "DistillSpec", "EarlyExitModule",
           "PretrainDistillationModule", "PruneSpec", "PruningModule", "QATSpec", "QuantAwareModule",
           "TheseusModule"]
