"""Task-level helpers shared by the adaptation modules (metrics for tagging and extractive QA)."""
from ptm_app.tasks.metrics import (EntityF1, SquadMetric, entity_f1, entity_spans, is_bio, squad_em, squad_f1,
                                   squad_normalize, token_accuracy)

__all__ = ["EntityF1", "SquadMetric", "entity_f1", "entity_spans", "is_bio", "squad_em", "squad_f1",
           "squad_normalize", "token_accuracy"]
