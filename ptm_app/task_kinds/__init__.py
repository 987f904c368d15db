"""Task kinds: the registry (``task_kinds.registry.TaskKind``), the parts its entries are made of, their input
forms (``forms``, read by ``inputs``) and prediction rows (``rows``), and the metrics shared by the adaptation modules
(tagging, extractive QA, label scores)."""
from ptm_app.task_kinds.metrics import (EntityF1, SquadMetric, entity_f1, entity_spans, is_bio, squad_em, squad_f1,
                                   squad_normalize, token_accuracy)

__all__ = ["EntityF1", "SquadMetric", "entity_f1", "entity_spans", "is_bio", "squad_em", "squad_f1",
           "squad_normalize", "token_accuracy"]
