"""Feature extraction: a frozen pre-trained backbone gives off-the-shelf features and only a task model on
top is trained (Qiu et al. 2020 §5.2.2–5.2.3; ELMo, Peters et al. 2018 §3.3).

The features are the embedding layer, the top layer, or ELMo's scalar mix of all layers (§3.2, eq. 1),
pooled over the tokens ([CLS] or masked mean) and fed to a linear layer or a small MLP.
"""
from __future__ import annotations

from typing import Literal, Optional

import torch
from torch import nn

from ptm_app.adaptation.classification import SequenceClassificationModule
from ptm_app.backbones.scalar_mix import ScalarMix
from ptm_app.training.optim import OptimConfig


class FeatureExtractionModule(SequenceClassificationModule):
    """Sequence classification on frozen features; logs ``val/acc``, ``val/f1_macro``; ``predict`` as usual.

    The backbone (``.backbone``, a plain transformers base model: BERT-style or the ELMo BiLSTM) never
    trains: ``requires_grad=False``, always in eval mode (no dropout), outside the optimiser, run without
    gradients.  Only the scalar mix (if any) and the task head learn.

    Args:
        backbone / backbone_config / labels / optim: as ``SequenceClassificationModule``.
        representation: ``embedding`` (layer 0), ``top`` (layer L) or ``scalar_mix`` (γ Σ s_j h_j).
        include_layer0: the scalar mix also weights layer 0, as ELMo (L+1 layers); False = layers 1..L (Qiu eq. 6).
        do_layer_norm: layer-normalise each layer before mixing (Peters et al. 2018 §3.2).
        pooling: ``cls`` (first token) or ``mean`` (over the real tokens).
        head_hidden: width of the MLP's hidden layer; None = a linear head.
        dropout: dropout on the pooled features (and the MLP's hidden layer).
        positive_label: the positive class of a two-label task, for ``val/f1`` (default: the second label).
    """

    head = "base"
    backbone_runs_without_grad = True  # the throughput monitor counts no backward pass through it

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 labels: Optional[list[str]] = None, optim: OptimConfig = OptimConfig(lr=1e-3),
                 representation: Literal["embedding", "top", "scalar_mix"] = "scalar_mix",
                 include_layer0: bool = True, do_layer_norm: bool = False, pooling: Literal["cls", "mean"] = "mean",
                 head_hidden: Optional[int] = None, dropout: float = 0.1, positive_label: Optional[str] = None):
        self.representation, self.include_layer0, self.do_layer_norm = representation, include_layer0, do_layer_norm
        self.pooling, self.head_hidden, self.head_dropout = pooling, head_hidden, dropout
        self.mix: Optional[ScalarMix] = None
        self.task_head: Optional[nn.Sequential] = None
        super().__init__(backbone, backbone_config, labels, optim, positive_label=positive_label)

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
            self.task_head = task_head(width, len(self.hparams.labels), self.head_hidden, self.head_dropout)

    def train(self, mode: bool = True) -> "FeatureExtractionModule":
        """Only the task model switches modes: the frozen backbone stays in eval mode."""
        super().train(mode)
        if self.backbone is not None:
            self.backbone.eval()
        return self

    def features(self, batch: dict) -> torch.Tensor:
        """Pooled features [B, D] of the chosen representation."""
        with torch.no_grad():
            out = self.backbone(**self.model_inputs(batch), output_hidden_states=self.representation != "top")
        mask = batch["attention_mask"]
        if self.representation == "embedding":
            states = out.hidden_states[0]
        elif self.representation == "top":
            states = out.last_hidden_state
        else:
            states = self.mix(out.hidden_states, mask)
        if self.pooling == "cls":
            return states[:, 0]
        keep = mask.unsqueeze(-1).to(states.dtype)
        return (states * keep).sum(1) / keep.sum(1).clamp(min=1)

    def forward(self, batch: dict) -> torch.Tensor:
        return self.task_head(self.features(batch))


def task_head(width: int, num_labels: int, hidden: Optional[int], dropout: float) -> nn.Sequential:
    """Linear classifier, or a one-hidden-layer ReLU MLP when ``hidden`` is set."""
    if hidden is None:
        return nn.Sequential(nn.Dropout(dropout), nn.Linear(width, num_labels))
    return nn.Sequential(nn.Dropout(dropout), nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(hidden, num_labels))
