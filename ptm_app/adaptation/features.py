"""Feature extraction: a frozen pre-trained backbone gives off-the-shelf features and only a task model on
top is trained (Qiu et al. 2020 §5.2.2–5.2.3; ELMo, Peters et al. 2018 §3.3).

The features are the embedding layer, the top layer, or ELMo's scalar mix of all layers (§3.2, eq. 1).
``FrozenFeaturesMixin`` holds that part; three task modules reuse it with their own task model:
sequence classification (pooled features), tagging and extractive QA (per-token features), the uses
ELMo was evaluated on (Peters et al. 2018 §4: SQuAD, NER, …).  Their metrics, data alignment,
post-processing and ``predict`` writers are those of the fine-tuning modules they extend.
"""
from __future__ import annotations

from typing import Literal, Optional

import torch
from torch import nn

from ptm_app.adaptation.classification import SequenceClassificationModule
from ptm_app.adaptation.qa import QuestionAnsweringModule
from ptm_app.adaptation.token_classification import TokenClassificationModule
from ptm_app.backbones.scalar_mix import ScalarMix
from ptm_app.errors import PtmError
from ptm_app.checkpoints import restore_frozen_base, strip_frozen_base
from ptm_app.training.optim import OptimConfig

Representation = Literal["embedding", "top", "scalar_mix"]
REPRESENTATIONS = ("embedding", "top", "scalar_mix")


class FrozenFeaturesMixin:
    """A frozen backbone and its representation, mixed in before a task ``PtmModule``.

    The backbone (``.backbone``, a plain transformers base model: BERT-style or the ELMo BiLSTM) never
    trains: ``requires_grad=False``, always in eval mode (no dropout), outside the optimiser, run without
    gradients.  Only the scalar mix (if any) and ``task_head`` learn.  A backbone loaded from a source
    (``backbone: minilm``, a directory, a run) is not stored in checkpoints: it is rebuilt from that source
    on load (as delta-only checkpoints, ``delta_only`` in the checkpoint's ``ptm_app`` block); one built
    from ``backbone_config`` alone (random weights) is kept.

    Subclasses call ``init_features`` before ``super().__init__`` and define ``head_outputs``.
    """

    head = "base"
    backbone_runs_without_grad = True  # the throughput monitor counts no backward pass through it

    def init_features(self, representation: str, include_layer0: bool, do_layer_norm: bool,
                      head_hidden: Optional[int], dropout: float) -> None:
        if representation not in REPRESENTATIONS:
            raise PtmError(f"representation '{representation}' is unknown; use one of {', '.join(REPRESENTATIONS)}")
        self.representation, self.include_layer0, self.do_layer_norm = representation, include_layer0, do_layer_norm
        self.head_hidden, self.head_dropout = head_hidden, dropout
        self.mix: Optional[ScalarMix] = None
        self.task_head: Optional[nn.Sequential] = None

    def head_outputs(self) -> int:
        """Width of the task head's output (classes, tags, or 2 for start/end)."""
        raise NotImplementedError

    def style(self) -> str:
        layer0 = "" if self.representation != "scalar_mix" else (" incl. layer 0" if self.include_layer0 else " excl. layer 0")
        return f"frozen features: {self.representation.replace('_', ' ')}{layer0}"

    def configure_model(self) -> None:
        self.hparams.setdefault("gradient_checkpointing", False)  # not an argument: no gradients flow in the backbone
        super().configure_model()
        self.backbone.requires_grad_(False)
        self.backbone.eval()
        if self.task_head is None:
            config = self.backbone.config
            width = getattr(config, "output_dim", None) or config.hidden_size  # the BiLSTM's [h→; h←]
            if self.representation == "scalar_mix":
                self.mix = ScalarMix(config.num_hidden_layers + 1, self.include_layer0, self.do_layer_norm)
            self.task_head = task_head(width, self.head_outputs(), self.head_hidden, self.head_dropout)

    def train(self, mode: bool = True):
        """Only the task model switches modes: the frozen backbone stays in eval mode."""
        super().train(mode)
        if self.backbone is not None:
            self.backbone.eval()
        return self

    def token_features(self, batch: dict) -> torch.Tensor:
        """Per-token features [B, T, D] of the chosen representation (gradients reach only the mix)."""
        with torch.no_grad():
            out = self.backbone(**self.model_inputs(batch), output_hidden_states=self.representation != "top")
        if self.representation == "embedding":
            return out.hidden_states[0]
        if self.representation == "top":
            return out.last_hidden_state
        return self.mix(out.hidden_states, batch["attention_mask"])

    # -- checkpoints without the frozen backbone ----------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        if not self.hparams.backbone:  # random weights from a config: nothing to rebuild them from
            return
        strip_frozen_base(checkpoint, {}, self.hparams.backbone, self.hparams.backbone_config)  # the trained weights only

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        restore_frozen_base(checkpoint, self.backbone)  # rebuilt frozen base + saved head


def task_head(width: int, outputs: int, hidden: Optional[int], dropout: float) -> nn.Sequential:
    """Linear layer, or a one-hidden-layer ReLU MLP when ``hidden`` is set."""
    if hidden is None:
        return nn.Sequential(nn.Dropout(dropout), nn.Linear(width, outputs))
    return nn.Sequential(nn.Dropout(dropout), nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(hidden, outputs))


class FeatureExtractionModule(FrozenFeaturesMixin, SequenceClassificationModule):
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
        self.pooling = pooling
        self.init_features(representation, include_layer0, do_layer_norm, head_hidden, dropout)
        super().__init__(backbone, backbone_config, labels, optim, positive_label=positive_label)

    def head_outputs(self) -> int:
        return len(self.hparams.labels)

    def features(self, batch: dict) -> torch.Tensor:
        """Pooled features [B, D] of the chosen representation."""
        states = self.token_features(batch)
        if self.pooling == "cls":
            return states[:, 0]
        keep = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
        return (states * keep).sum(1) / keep.sum(1).clamp(min=1)

    def forward(self, batch: dict) -> torch.Tensor:
        return self.task_head(self.features(batch))


class TokenFeatureExtractionModule(FrozenFeaturesMixin, TokenClassificationModule):
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
        self.init_features(representation, include_layer0, do_layer_norm, head_hidden, dropout)
        super().__init__(backbone, backbone_config, labels, optim)

    def head_outputs(self) -> int:
        return len(self.hparams.labels)

    def forward(self, batch: dict) -> torch.Tensor:
        """Tag logits [B, T, labels]."""
        return self.task_head(self.token_features(batch))


class QAFeatureExtractionModule(FrozenFeaturesMixin, QuestionAnsweringModule):
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
        self.init_features(representation, include_layer0, do_layer_norm, head_hidden, dropout)
        super().__init__(backbone, backbone_config, optim, max_answer_length=max_answer_length, n_best=n_best)

    def head_outputs(self) -> int:
        return 2

    def forward(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Start and end logits [B, T] each."""
        start, end = self.task_head(self.token_features(batch)).float().unbind(-1)
        return start, end
