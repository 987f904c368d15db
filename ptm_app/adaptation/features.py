"""Feature extraction: a frozen pre-trained backbone gives off-the-shelf features and only a task model on
top is trained (Qiu et al. 2020 §5.2.2–5.2.3; ELMo, Peters et al. 2018 §3.3).

The features are the embedding layer, the top layer, or ELMo's scalar mix of all layers (§3.2, eq. 1): the
``FrozenFeatures`` policy (``adaptation.policies``).  Three task modules use it with their own task model:
sequence classification (pooled features), tagging and extractive QA (per-token features), the uses
ELMo was evaluated on (Peters et al. 2018 §4: SQuAD, NER, …).  Their metrics, data alignment,
post-processing and ``predict`` writers are those of the fine-tuning modules they extend.
"""
from __future__ import annotations

from typing import Literal, Optional

import torch
from torch import nn

from ptm_app.adaptation.classification import SequenceClassificationModule
from ptm_app.adaptation.policies import FrozenFeatures
from ptm_app.adaptation.qa import QuestionAnsweringModule
from ptm_app.adaptation.token_classification import TokenClassificationModule
from ptm_app.errors import PtmError
from ptm_app.training.optim import OptimConfig

Representation = Literal["embedding", "top", "scalar_mix"]


class FrozenFeaturesTask:
    """What the three feature modules share besides their task module: the ``FrozenFeatures`` policy from their
    settings, the model class ``base`` (the plain encoder), and a ``task_head`` built once the backbone exists.  Listed
    first in their bases; it overrides only these hooks."""

    model_class = "base"
    backbone_runs_without_grad = True  # the throughput monitor counts no backward pass through it

    def make_policies(self) -> list:
        hp = self.hparams
        return [FrozenFeatures(hp.representation, hp.include_layer0, hp.do_layer_norm)]

    @property
    def features_policy(self) -> FrozenFeatures:
        return self.policy(FrozenFeatures)

    def head_outputs(self) -> int:
        """Width of the task head's output (classes, tags, or 2 for start/end)."""
        return len(self.hparams.labels)

    def configure_model(self) -> None:
        self.hparams.setdefault("gradient_checkpointing", False)  # not an argument: no gradients flow in the backbone
        super().configure_model()
        if getattr(self, "task_head", None) is None:
            self.task_head = task_head(FrozenFeatures.width(self.backbone), self.head_outputs(),
                                       self.hparams.head_hidden, self.hparams.dropout)

    def train(self, mode: bool = True):
        """Only the task model switches modes: the frozen backbone stays in eval mode."""
        super().train(mode)
        if self.backbone is not None:
            self.backbone.eval()
        return self

    def token_features(self, batch: dict) -> torch.Tensor:
        return self.features_policy.token_features(self, batch)


def task_head(width: int, outputs: int, hidden: Optional[int], dropout: float) -> nn.Sequential:
    """Linear layer, or a one-hidden-layer ReLU MLP when ``hidden`` is set."""
    if hidden is None:
        return nn.Sequential(nn.Dropout(dropout), nn.Linear(width, outputs))
    return nn.Sequential(nn.Dropout(dropout), nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(hidden, outputs))


class FeatureExtractionModule(FrozenFeaturesTask, SequenceClassificationModule):
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

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 labels: Optional[list[str]] = None, optim: OptimConfig = OptimConfig(lr=1e-3),
                 representation: Representation = "scalar_mix", include_layer0: bool = True,
                 do_layer_norm: bool = False, pooling: Literal["cls", "mean"] = "mean",
                 head_hidden: Optional[int] = None, dropout: float = 0.1, positive_label: Optional[str] = None):
        if pooling not in ("cls", "mean"):
            raise PtmError(f"pooling '{pooling}' is unknown; use cls or mean")
        super().__init__(backbone, backbone_config, labels, optim, positive_label=positive_label)

    def features(self, batch: dict) -> torch.Tensor:
        """Pooled features [B, D] of the chosen representation."""
        states = self.token_features(batch)
        if self.hparams.pooling == "cls":
            return states[:, 0]
        keep = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
        return (states * keep).sum(1) / keep.sum(1).clamp(min=1)

    def forward(self, batch: dict) -> torch.Tensor:
        return self.task_head(self.features(batch))


class TokenFeatureExtractionModule(FrozenFeaturesTask, TokenClassificationModule):
    """Tagging on frozen per-token features (ELMo's NER / chunking use, Peters et al. 2018 §4): a linear layer or
    small MLP per token; each word's tag comes from its first sub-token (BERT §4.3).  Logs ``val/acc`` (and
    ``val/entity_f1`` for BIO tags); ``predict`` writes one tag per word, as ``TokenClassificationModule``.

    Args: ``backbone`` / ``backbone_config`` / ``labels`` / ``optim`` as ``TokenClassificationModule``;
    ``representation``, ``include_layer0``, ``do_layer_norm``, ``head_hidden``, ``dropout`` as
    ``FeatureExtractionModule``.
    """

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 labels: Optional[list[str]] = None, optim: OptimConfig = OptimConfig(lr=1e-3),
                 representation: Representation = "scalar_mix", include_layer0: bool = True,
                 do_layer_norm: bool = False, head_hidden: Optional[int] = None, dropout: float = 0.1):
        super().__init__(backbone, backbone_config, labels, optim)

    def forward(self, batch: dict) -> torch.Tensor:
        """Tag logits [B, T, labels]."""
        return self.task_head(self.token_features(batch))


class QAFeatureExtractionModule(FrozenFeaturesTask, QuestionAnsweringModule):
    """Extractive QA on frozen per-token features (ELMo on SQuAD, Peters et al. 2018 §4): start and end logits
    from one linear layer (BERT §4.2's S and E) or a small MLP; windows, span post-processing, SQuAD EM/F1
    and ``predict`` as ``QuestionAnsweringModule``.

    Args: ``backbone`` / ``backbone_config`` / ``optim`` / ``max_answer_length`` / ``n_best`` as
    ``QuestionAnsweringModule``; ``representation``, ``include_layer0``, ``do_layer_norm``, ``head_hidden``,
    ``dropout`` as ``FeatureExtractionModule``.
    """

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(lr=1e-3), max_answer_length: int = 30, n_best: int = 20,
                 representation: Representation = "scalar_mix", include_layer0: bool = True,
                 do_layer_norm: bool = False, head_hidden: Optional[int] = None, dropout: float = 0.1):
        super().__init__(backbone, backbone_config, optim, max_answer_length=max_answer_length, n_best=n_best)

    def head_outputs(self) -> int:
        return 2

    def forward(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Start and end logits [B, T] each."""
        start, end = self.task_head(self.token_features(batch)).float().unbind(-1)
        return start, end
