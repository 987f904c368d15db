"""Knowledge-enhanced pre-training on a knowledge graph: KEPLER (joint MLM + TransE over entity descriptions) and
its link-prediction evaluation (Qiu et al. 2020 §4.1; Wang et al. 2021)."""
from ptm_app.knowledge.data import KeplerDataModule
from ptm_app.knowledge.kepler import KeplerModule

__all__ = ["KeplerDataModule", "KeplerModule"]
