"""Model compression: knowledge distillation (teachers, students, losses)."""
from ptm_app.compression.causal_distillation import CausalDistillationModule
from ptm_app.compression.distillation import DistillationModule, DistillSpec
from ptm_app.compression.pretrain_distillation import PretrainDistillationModule

__all__ = ["CausalDistillationModule", "DistillationModule", "DistillSpec", "PretrainDistillationModule"]
