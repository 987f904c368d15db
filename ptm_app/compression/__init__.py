"""Model compression: knowledge distillation (teachers, students, losses), pruning, quantization."""
from ptm_app.compression.distillation import DistillationModule, DistillSpec
from ptm_app.compression.pruning import PruningModule, PruneSpec
from ptm_app.compression.quantization import QATSpec, QuantAwareModule

__all__ = ["DistillationModule", "DistillSpec", "PruningModule", "PruneSpec", "QATSpec", "QuantAwareModule"]
