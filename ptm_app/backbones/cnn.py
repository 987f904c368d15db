"""A convolutional sentence classifier (Kim 2014, "Convolutional neural networks for sentence classification" §2):
word embeddings → parallel 1-D convolutions of several widths (3, 4, 5) with ReLU → max-over-time pooling →
dropout → one linear layer.  The surveys' "distillation to other structures" student (Qiu et al. §4.5).

Importing this module registers ``model_type="ptm_cnn"`` with ``AutoConfig`` and
``AutoModelForSequenceClassification`` (export is ``save_pretrained``, reuse is ``from_pretrained``).
Only windows of real tokens are pooled, so padding (either side) never changes a sentence's features; a sentence
shorter than a filter is zero-padded for it (Kim's own padding).  ``token_type_ids`` is ignored.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification, PreTrainedConfig, PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput

MODEL_TYPE = "ptm_cnn"


@strict
class CNNConfig(PreTrainedConfig):
    """Kim 2014 §3.1: widths 3, 4, 5 with 100 feature maps each, dropout 0.5.  ``hidden_size`` (the pooled
    feature width, ``len(kernel_sizes) · num_filters``) is derived; ``num_hidden_layers`` is 1 (one convolution)."""

    model_type = MODEL_TYPE

    vocab_size: int
    embedding_dim: int = 128
    kernel_sizes: list[int] | tuple[int, ...] = (3, 4, 5)
    num_filters: int = 100
    dropout: float | int = 0.5
    pad_token_id: int | None = None
    max_position_embeddings: int | None = None

    def __post_init__(self, **kwargs) -> None:
        self.kernel_sizes = [int(k) for k in self.kernel_sizes]
        super().__post_init__(**kwargs)
        if not self.kernel_sizes or min(self.kernel_sizes) < 1 or self.num_filters < 1:
            raise ValueError(f"kernel_sizes must be widths >= 1 and num_filters >= 1 "
                             f"(got {self.kernel_sizes} and {self.num_filters})")

    @property
    def hidden_size(self) -> int:
        return len(self.kernel_sizes) * self.num_filters

    @property
    def num_hidden_layers(self) -> int:
        return 1


class CNNForSequenceClassification(PreTrainedModel):
    """Embedding → Conv1d per width (ReLU) → max over real positions → concatenation → dropout → linear.

    ``hidden_states`` (on request) is ``(embeddings [B, T, E],)``: layer 0 for the embedding-layer loss.
    An input shorter than the widest filter is padded on the right (masked out of the pooling)."""

    config_class = CNNConfig
    base_model_prefix = "cnn"
    main_input_name = "input_ids"

    def __init__(self, config: CNNConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.embedding_dim, padding_idx=config.pad_token_id)
        self.convs = nn.ModuleList(nn.Conv1d(config.embedding_dim, config.num_filters, k) for k in config.kernel_sizes)
        self.dropout = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def pooled(self, embedded: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Max-over-time pooling of every width's feature maps [B, F·len(widths)] over windows of real tokens."""
        widest = max(self.config.kernel_sizes)
        if embedded.size(1) < widest:
            extra = widest - embedded.size(1)
            embedded, mask = F.pad(embedded, (0, 0, 0, extra)), F.pad(mask, (0, extra))
        x = (embedded * mask.unsqueeze(-1).to(embedded.dtype)).transpose(1, 2)  # [B, E, T]
        features = []
        for conv, width in zip(self.convs, self.config.kernel_sizes):
            maps = torch.relu(conv(x))  # [B, F, T − w + 1]
            windows = mask.bool().unfold(1, width, 1)  # [B, T − w + 1, w]
            keep = windows.all(-1)  # windows of real tokens only; a sentence shorter than w: those that touch it
            keep = torch.where(keep.any(-1, keepdim=True), keep, windows.any(-1))
            features.append(maps.masked_fill(~keep.unsqueeze(1), float("-inf")).amax(-1))
        return torch.cat(features, dim=-1)

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, labels: Optional[torch.Tensor] = None,
                output_hidden_states: Optional[bool] = None, return_dict: bool = True, **_):
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        embedded = self.embed_tokens(input_ids)
        logits = self.classifier(self.dropout(self.pooled(embedded, mask)))
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        hidden = (embedded,) if output_hidden_states else None
        output = SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=hidden)
        return output if return_dict else output.to_tuple()


AutoConfig.register(MODEL_TYPE, CNNConfig, exist_ok=True)
AutoModelForSequenceClassification.register(CNNConfig, CNNForSequenceClassification, exist_ok=True)
