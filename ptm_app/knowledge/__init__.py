"""Knowledge-enhanced pre-training (Qiu et al. 2020 §4.1): KEPLER (joint MLM + TransE over entity descriptions) and
its link-prediction evaluation, K-Adapter (knowledge adapters on a frozen backbone), SenseBERT's supersense target and
LIBERT's lexical relation classification (Wang et al. 2021 TACL; Wang et al. 2021 Findings of ACL; Levine et al. 2020;
Lauscher et al. 2020).  ERNIE's knowledge masking stays a masking of ``objectives.targets.MaskedLM`` (docs/knowledge.md)."""
from ptm_app.knowledge.data import KeplerDataModule
from ptm_app.knowledge.k_adapter import KAdapterModule
from ptm_app.knowledge.kepler import KeplerModule
from ptm_app.knowledge.libert import LexicalRelationMLMModule
from ptm_app.knowledge.libert_data import MLMPairsDataModule
from ptm_app.knowledge.sensebert import Supersense

__all__ = ["KAdapterModule", "KeplerDataModule", "KeplerModule", "LexicalRelationMLMModule", "MLMPairsDataModule",
           "Supersense"]
