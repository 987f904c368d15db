"""An ELMo-style bidirectional LSTM language model (Peters et al. 2018 §3.1–3.2) as a transformers model.

Two independent stacks of ``num_layers`` LSTMs share one token embedding: the forward stack reads
left→right and predicts x_{t+1}, the backward stack reads right→left and predicts x_{t-1}, and one
softmax (tied to the embedding by default) serves both directions (§3.1). The two stacks never
interact; layer j's representation is ``[h→_j ; h←_j]`` and layer 0 is the token embedding repeated
for both directions, so ``hidden_states`` holds the L+1 layers the ELMo scalar mix combines (§3.2).

Importing this module registers ``model_type="ptm_bilstm_lm"`` with ``AutoConfig`` and ``AutoModel``.
Batches must be right-padded (``attention_mask`` a prefix of ones per row).
"""

from dataclasses import dataclass
from typing import Optional, Union

import torch

from ptm_app.data import IGNORE_INDEX
import torch.nn.functional as F
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification, PreTrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils import ModelOutput

MODEL_TYPE = "ptm_bilstm_lm"


@strict
class BiLSTMConfig(PreTrainedConfig):
    """Hyper-parameters of the biLM (Peters et al. 2018 §3.1; ELMo used 2 layers, 4096 cells, 512 projections).

    ``hidden_size`` is the LSTM cell size per direction; every layer's output is projected to
    ``projection_dim`` (default ``embedding_dim``), so the model's features are ``2 * projection_dim`` wide.
    ``residual`` adds a skip connection around every layer but the first (ELMo: layer 1 → 2).
    ``tie_embeddings`` (alias ``tie_word_embeddings``) uses the input embedding as the shared softmax weight.
    """

    model_type = MODEL_TYPE
    attribute_map = {"tie_word_embeddings": "tie_embeddings", "num_hidden_layers": "num_layers"}

    vocab_size: int
    embedding_dim: int = 256
    hidden_size: int = 256
    num_layers: int = 2
    dropout: float | int = 0.1
    projection_dim: int | None = None
    tie_embeddings: bool = True
    pad_token_id: int | None = None
    residual: bool = True
    max_position_embeddings: int | None = None

    def __post_init__(self, **kwargs) -> None:
        if self.projection_dim is None:
            self.projection_dim = self.embedding_dim
        super().__post_init__(**kwargs)  # sets extra kwargs, including the tie_word_embeddings alias
        if self.tie_embeddings and self.projection_dim != self.embedding_dim:
            raise ValueError(f"tie_embeddings needs projection_dim == embedding_dim "
                             f"(got {self.projection_dim} and {self.embedding_dim})")
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1 (got {self.num_layers})")

    @property
    def output_dim(self) -> int:
        """Width of every entry of ``hidden_states`` and of ``last_hidden_state``: ``[h→ ; h←]``."""
        return 2 * self.projection_dim


@dataclass
class BiLMOutput(ModelOutput):
    """Losses and logits of both directions; ``logits`` are the forward LM's (they predict token t+1)."""

    loss: Optional[torch.FloatTensor] = None
    forward_loss: Optional[torch.FloatTensor] = None
    backward_loss: Optional[torch.FloatTensor] = None
    logits: Optional[torch.FloatTensor] = None
    backward_logits: Optional[torch.FloatTensor] = None
    hidden_states: Optional[tuple[torch.FloatTensor, ...]] = None


class DirectionalStack(nn.Module):
    """One direction of the biLM: LSTM → projection per layer, residual from layer 2 on (Peters et al. 2018 §3.1)."""

    def __init__(self, config: BiLSTMConfig):
        super().__init__()
        in_dims = [config.embedding_dim] + [config.projection_dim] * (config.num_layers - 1)
        self.lstms = nn.ModuleList(nn.LSTM(d, config.hidden_size, batch_first=True) for d in in_dims)
        self.projections = nn.ModuleList(nn.Linear(config.hidden_size, config.projection_dim) for _ in in_dims)
        self.dropout = nn.Dropout(config.dropout)
        self.residual = config.residual

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Read ``x`` [B, L, E] left→right; return each layer's output [B, L, P]."""
        outputs = []
        for j, (lstm, projection) in enumerate(zip(self.lstms, self.projections)):
            h = projection(lstm(self.dropout(x))[0])
            if self.residual and j > 0:
                h = h + x
            outputs.append(h)
            x = h
        return outputs


def right_padded_mask(input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """The boolean token mask, checked to be right padding (None means no padding)."""
    if attention_mask is None:
        return torch.ones_like(input_ids, dtype=torch.bool)
    mask = attention_mask.bool()
    prefix = torch.arange(mask.size(1), device=mask.device) < mask.sum(1, keepdim=True)
    if not torch.equal(mask, prefix):
        raise ValueError("BiLSTM LM needs right-padded batches: each attention_mask row must be ones then zeros")
    return mask


def reverse_index(mask: torch.Tensor) -> torch.Tensor:
    """Per-row index that reverses the real tokens and leaves the padding in place (an involution)."""
    lengths = mask.sum(1, keepdim=True)
    positions = torch.arange(mask.size(1), device=mask.device).expand_as(mask)
    return torch.where(positions < lengths, lengths - 1 - positions, positions)


def gather_time(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[b, index[b, t]]`` for x [B, L, D] and index [B, L]."""
    return x.gather(1, index.unsqueeze(-1).expand_as(x))


class BiLSTMPreTrainedModel(PreTrainedModel):
    """Shared transformers plumbing (config class, weight init, the ``bilm`` prefix)."""

    config_class = BiLSTMConfig
    base_model_prefix = "bilm"


class BiLSTMModel(BiLSTMPreTrainedModel):
    """The biLM encoder: token embedding + independent forward and backward LSTM stacks (Peters et al. 2018 §3.1).

    Returns ``last_hidden_state`` = ``[h→_L ; h←_L]`` [B, L, 2P] and, on request, ``hidden_states`` =
    L+1 tensors [B, L, 2P] (layer 0 = the embedding repeated for both directions, §3.2).
    Padding positions are zeroed and never influence real tokens.
    """

    def __init__(self, config: BiLSTMConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.embedding_dim, padding_idx=config.pad_token_id)
        self.forward_stack = DirectionalStack(config)
        self.backward_stack = DirectionalStack(config)
        self.post_init()

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, output_hidden_states: Optional[bool] = None,
                return_dict: bool = True) -> Union[BaseModelOutput, tuple]:
        """``token_type_ids`` is accepted for interface compatibility and ignored (a biLM has no segments)."""
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        mask = right_padded_mask(input_ids, attention_mask)
        embedded = self.embed_tokens(input_ids)
        flip = reverse_index(mask)
        forward_layers = self.forward_stack(embedded)
        backward_layers = [gather_time(h, flip) for h in self.backward_stack(gather_time(embedded, flip))]
        keep = mask.unsqueeze(-1).to(embedded.dtype)
        layers = [torch.cat([embedded, embedded], -1)]
        layers += [torch.cat(pair, -1) for pair in zip(forward_layers, backward_layers)]
        layers = tuple(h * keep for h in layers)
        output = BaseModelOutput(last_hidden_state=layers[-1], hidden_states=layers if output_hidden_states else None)
        return output if return_dict else output.to_tuple()


class BiLSTMForLanguageModeling(BiLSTMPreTrainedModel):
    """The biLM with its shared softmax; the loss is the mean of the forward and backward LM token
    cross-entropies (the joint log likelihood of Peters et al. 2018 §3.1, each direction averaged over its targets)."""

    _tied_weights_keys = {"lm_head.weight": "bilm.embed_tokens.weight"}

    def __init__(self, config: BiLSTMConfig):
        super().__init__(config)
        self.bilm = BiLSTMModel(config)
        self.dropout = nn.Dropout(config.dropout)
        self.lm_head = nn.Linear(config.projection_dim, config.vocab_size)
        self.post_init()

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                labels: Optional[torch.Tensor] = None, output_hidden_states: Optional[bool] = None,
                return_dict: bool = True, token_type_ids: Optional[torch.Tensor] = None) -> Union[BiLMOutput, tuple]:
        """Forward LM: state t predicts target t+1; backward LM: state t predicts target t-1.

        ``labels`` (default ``input_ids``) are the targets of both directions; positions whose target
        or source is padding, or whose target is -100, are ignored.
        """
        mask = right_padded_mask(input_ids, attention_mask)
        encoded = self.bilm(input_ids, attention_mask=mask, output_hidden_states=output_hidden_states)
        forward_top, backward_top = self.dropout(encoded.last_hidden_state).chunk(2, dim=-1)
        logits, backward_logits = self.lm_head(forward_top), self.lm_head(backward_top)
        targets = (input_ids if labels is None else labels).masked_fill(~mask, IGNORE_INDEX)
        forward_targets = targets[:, 1:]  # a real target's left neighbour is real (right padding)
        # the first padding position must not predict the last real token
        backward_targets = targets[:, :-1].masked_fill(~mask[:, 1:], IGNORE_INDEX)
        forward_loss = token_mean_cross_entropy(logits[:, :-1], forward_targets)
        backward_loss = token_mean_cross_entropy(backward_logits[:, 1:], backward_targets)
        output = BiLMOutput(loss=(forward_loss + backward_loss) / 2, forward_loss=forward_loss,
                            backward_loss=backward_loss, logits=logits, backward_logits=backward_logits,
                            hidden_states=encoded.hidden_states)
        return output if return_dict else output.to_tuple()


def token_mean_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the non-ignored targets (0 when there are none, instead of NaN)."""
    total = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1),
                            ignore_index=IGNORE_INDEX, reduction="sum")
    return total / (targets != IGNORE_INDEX).sum().clamp(min=1)


class BiLSTMForSequenceClassification(BiLSTMPreTrainedModel):
    """A BiLSTM sentence classifier, the distillation student of Tang et al. 2019 §3.1: the last forward state
    and the last backward state (at the first token) are concatenated and fed through a fully connected layer with
    ReLU and the output layer.  ``token_type_ids`` is accepted and ignored."""

    def __init__(self, config: BiLSTMConfig):
        super().__init__(config)
        self.bilm = BiLSTMModel(config)
        self.dropout = nn.Dropout(config.dropout)
        self.pre_classifier = nn.Linear(config.output_dim, config.output_dim)
        self.classifier = nn.Linear(config.output_dim, config.num_labels)
        self.post_init()

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, labels: Optional[torch.Tensor] = None,
                output_hidden_states: Optional[bool] = None, return_dict: bool = True):
        from transformers.modeling_outputs import SequenceClassifierOutput

        mask = right_padded_mask(input_ids, attention_mask)
        encoded = self.bilm(input_ids, attention_mask=mask, output_hidden_states=output_hidden_states)
        forward_top, backward_top = encoded.last_hidden_state.chunk(2, dim=-1)
        last = mask.sum(1) - 1
        rows = torch.arange(input_ids.size(0), device=input_ids.device)
        sentence = torch.cat([forward_top[rows, last], backward_top[:, 0]], dim=-1)
        logits = self.classifier(self.dropout(torch.relu(self.pre_classifier(self.dropout(sentence)))))
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        output = SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=encoded.hidden_states)
        return output if return_dict else output.to_tuple()


# the BiLSTM class of each ptm_app model class (backbones.model_classes.auto_class)
BILSTM_CLASSES: dict[str, type[BiLSTMPreTrainedModel]] = {"bilm": BiLSTMForLanguageModeling, "base": BiLSTMModel}

AutoConfig.register(MODEL_TYPE, BiLSTMConfig, exist_ok=True)
AutoModel.register(BiLSTMConfig, BiLSTMModel, exist_ok=True)
AutoModelForSequenceClassification.register(BiLSTMConfig, BiLSTMForSequenceClassification, exist_ok=True)
