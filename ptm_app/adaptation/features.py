"""Feature extraction: a frozen pre-trained backbone gives off-the-shelf features and only a task model on
top is trained (Qiu et al. 2020 §5.2.2–5.2.3; ELMo, Peters et al. 2018 §3.3).

The features are the embedding layer, the top layer, or ELMo's scalar mix of all layers (§3.2, eq. 1), and the task
model a linear layer or a small MLP: the ``FrozenFeatures`` policy (``adaptation.policies``), which any task module
carries when it takes the ``representation`` settings.  The three modules here are the fine-tuning modules of
sequence classification (pooled features), tagging and extractive QA (per-token features), the uses ELMo was
evaluated on (Peters et al. 2018 §4: SQuAD, NER, …), with those settings and a feature-extraction learning rate:
their metrics, data alignment, post-processing and ``predict`` writers are the fine-tuning modules'.
"""
from __future__ import annotations

from typing import Literal, Optional

from ptm_app.adaptation.classification import SequenceClassificationModule
from ptm_app.adaptation.policies import FrozenFeatures
from ptm_app.adaptation.qa import QuestionAnsweringModule
from ptm_app.adaptation.token_classification import TokenClassificationModule
from ptm_app.training.optim import OptimConfig

Representation = Literal["embedding", "top", "scalar_mix"]


class FeatureExtractionModule(SequenceClassificationModule):
    """Sequence classification on frozen features pooled over the tokens; logs ``val/acc``, ``val/f1_macro``;
    ``predict`` as ``SequenceClassificationModule``.

    Args:
        backbone / backbone_config / labels / optim: as ``SequenceClassificationModule``.
        representation: ``embedding`` (layer 0), ``top`` (layer L) or ``scalar_mix`` (γ Σ s_j h_j).
        include_layer0: the scalar mix also weights layer 0, as ELMo (L+1 layers); False = layers 1..L (Qiu eq. 6).
        do_layer_norm: layer-normalise each layer before mixing (Peters et al. 2018 §3.2).
        pooling: ``cls`` (first token) or ``mean`` (over the real tokens).
        head_hidden: width of the MLP's hidden layer; None = a linear head.
        dropout: dropout on the features (and the MLP's hidden layer).
        positive_label: the positive class of a two-label task, for ``val/f1`` (default: the second label).
    """

    model_class = FrozenFeatures.model_class  # the plain encoder whose layers the policy reads

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 labels: Optional[list[str]] = None, optim: OptimConfig = OptimConfig(lr=1e-3),
                 representation: Representation = "scalar_mix", include_layer0: bool = True,
                 do_layer_norm: bool = False, pooling: Literal["cls", "mean"] = "mean",
                 head_hidden: Optional[int] = None, dropout: float = 0.1, positive_label: Optional[str] = None):
        super().__init__(backbone, backbone_config, labels, optim, positive_label=positive_label)


class TokenFeatureExtractionModule(TokenClassificationModule):
    """Tagging on frozen per-token features (ELMo's NER / chunking use, Peters et al. 2018 §4): a linear layer or
    small MLP per token; each word's tag comes from its first sub-token (BERT §4.3).  Logs ``val/acc`` (and
    ``val/entity_f1`` for BIO tags); ``predict`` writes one tag per word, as ``TokenClassificationModule``.

    Args: ``backbone`` / ``backbone_config`` / ``labels`` / ``optim`` as ``TokenClassificationModule``;
    ``representation``, ``include_layer0``, ``do_layer_norm``, ``head_hidden``, ``dropout`` as
    ``FeatureExtractionModule``.
    """

    model_class = FrozenFeatures.model_class  # the plain encoder whose layers the policy reads

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 labels: Optional[list[str]] = None, optim: OptimConfig = OptimConfig(lr=1e-3),
                 representation: Representation = "scalar_mix", include_layer0: bool = True,
                 do_layer_norm: bool = False, head_hidden: Optional[int] = None, dropout: float = 0.1):
        super().__init__(backbone, backbone_config, labels, optim)


class QAFeatureExtractionModule(QuestionAnsweringModule):
    """Extractive QA on frozen per-token features (ELMo on SQuAD, Peters et al. 2018 §4): start and end logits
    from one linear layer (BERT §4.2's S and E) or a small MLP; windows, span post-processing, SQuAD EM/F1
    and ``predict`` as ``QuestionAnsweringModule``.

    Args: ``backbone`` / ``backbone_config`` / ``optim`` / ``max_answer_length`` / ``n_best`` as
    ``QuestionAnsweringModule``; ``representation``, ``include_layer0``, ``do_layer_norm``, ``head_hidden``,
    ``dropout`` as ``FeatureExtractionModule``.
    """

    model_class = FrozenFeatures.model_class  # the plain encoder whose layers the policy reads

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(lr=1e-3), max_answer_length: int = 30, n_best: int = 20,
                 representation: Representation = "scalar_mix", include_layer0: bool = True,
                 do_layer_norm: bool = False, head_hidden: Optional[int] = None, dropout: float = 0.1):
        super().__init__(backbone, backbone_config, optim, max_answer_length=max_answer_length, n_best=n_best)
