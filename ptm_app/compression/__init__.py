"""Model compression: knowledge distillation (teachers, students, losses), pruning."""
from ptm_app.compression.distillation import DistillationModule, DistillSpec
from ptm_app.compression.pruning import PruningModule, PruneSpec

__all__ = ["DistillationModule", "DistillSpec", "PruningModule", "PruneSpec"]
