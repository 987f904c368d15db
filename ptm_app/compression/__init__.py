"""Model compression: knowledge distillation (teachers, students, losses)."""
from ptm_app.compression.distillation import DistillationModule, DistillSpec

__all__ = ["DistillationModule", "DistillSpec"]
