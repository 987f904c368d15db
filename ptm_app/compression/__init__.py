"""Model compression: knowledge distillation (teachers, students, losses), module replacement, early exit."""
from ptm_app.compression.causal_distillation import CausalDistillationModule
from ptm_app.compression.distillation import DistillationModule, DistillSpec
from ptm_app.compression.early_exit import EarlyExitModule
from ptm_app.compression.pretrain_distillation import PretrainDistillationModule
from ptm_app.compression.theseus import TheseusModule

__all__ = ["CausalDistillationModule", "DistillationModule", "DistillSpec", "EarlyExitModule",
           "PretrainDistillationModule", "TheseusModule"]
