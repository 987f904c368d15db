"""Knowledge-enhanced pre-training on a knowledge graph: KEPLER (joint MLM + TransE over entity descriptions) and
its link-prediction evaluation, and K-Adapter (knowledge adapters on a frozen backbone) (Qiu et al. 2020 §4.1;
Wang et al. 2021 TACL; Wang et al. 2021 Findings of ACL)."""
from ptm_app.knowledge.data import KeplerDataModule
from ptm_app.knowledge.k_adapter import KAdapterModule
from ptm_app.knowledge.kepler import KeplerModule

__all__ = ["KAdapterModule", "KeplerDataModule", "KeplerModule"]
