"""A masked LM's vocabulary prediction head, applied only where it predicts (``masked_lm_forward``, ``logits_at``).

The targets that sit on a backbone's hidden states (NSP, SOP, SBO, supersenses) are in ``objectives.targets``.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import torch

from ptm_app.data import IGNORE_INDEX
from torch import nn


class MaskedLMOutput(NamedTuple):
    """``loss``: mean cross-entropy over the selected positions; ``logits``: ``[N, V]`` at those positions
    (``labels != IGNORE_INDEX``, row-major order); ``hidden``: the last hidden state ``[B, L, H]`` (when asked for)."""

    loss: torch.Tensor
    logits: torch.Tensor
    hidden: Optional[torch.Tensor]


def _xlm_head(model) -> Optional[Callable]:
    return None if model.pred_layer.asm else model.pred_layer.proj  # adaptive softmax: dense path only


# The output layer of each transformers v5 masked-LM class, as a function of hidden states (read from
# ``models/*/modeling_*.py``: what ``forward`` applies to ``outputs[0]`` before its loss).
PREDICTION_HEADS: dict[str, Callable] = {
    "BertForMaskedLM": lambda m: m.cls,
    "RobertaForMaskedLM": lambda m: m.lm_head,
    "XLMRobertaForMaskedLM": lambda m: m.lm_head,
    "CamembertForMaskedLM": lambda m: m.lm_head,
    "AlbertForMaskedLM": lambda m: m.predictions,
    "ElectraForMaskedLM": lambda m: lambda h: m.generator_lm_head(m.generator_predictions(h)),
    "DistilBertForMaskedLM": lambda m: lambda h: m.vocab_projector(
        m.vocab_layer_norm(m.activation(m.vocab_transform(h)))),
    "XLMWithLMHeadModel": _xlm_head,
}


def prediction_head(model) -> Optional[Callable]:
    """``model``'s vocabulary prediction head as a function ``[N, H] -> [N, V]``, or None if unknown."""
    make = PREDICTION_HEADS.get(type(model).__name__)
    return make(model) if make is not None else None


def masked_lm_forward(model, inputs: dict, labels: torch.Tensor, *, sparse: bool = True,
                      hidden: bool = False, positions: Optional[torch.Tensor] = None) -> MaskedLMOutput:
    """Masked-LM loss of a transformers ``*ForMaskedLM`` model, with vocabulary logits only where predicted.

    transformers' ``*ForMaskedLM.forward`` projects every position onto the vocabulary, though only the
    ~15 % selected ones (``labels != IGNORE_INDEX``) enter the loss; for a small model with a 16–30k vocabulary
    that projection dominates the cost.  The sparse path calls the base model (``model.base_model``),
    gathers the hidden states at the selected positions and applies the model's own prediction head
    (``cls``, ``lm_head``, ``predictions``, ``generator_lm_head`` ...) to those rows only, then the same mean
    cross-entropy: the loss equals the dense one (tests/objectives/test_sparse_heads.py) and the weights and
    their names are untouched, so checkpoints and exports do not change.  Google's original BERT does the
    same (``run_pretraining.py``: ``get_masked_lm_output`` gathers ``masked_lm_positions`` before the output
    layer).  Models without a
    known head (see ``PREDICTION_HEADS``), or ``sparse=False``, take the dense path.

    ``positions``: the selected positions as flat indices into ``labels.flatten()`` in row-major order
    (``selected_positions``), computed where the labels are made, on the CPU.  Their count is then known to the
    host, so the gather needs no host sync; selecting with the boolean mask on a GPU waits for the forward pass to
    finish (its output size depends on the data) before the rest of the step can be queued.
    """
    head = prediction_head(model) if sparse else None
    if head is None:
        selected = labels != IGNORE_INDEX
        out = model(**inputs, labels=labels, **({"output_hidden_states": True} if hidden else {}))
        return MaskedLMOutput(out.loss, out.logits[selected], out.hidden_states[-1] if hidden else None)
    sequence = model.base_model(**inputs)[0]
    if positions is None:
        selected = labels != IGNORE_INDEX
        rows, targets = sequence[selected], labels[selected]
    else:
        rows = sequence.reshape(-1, sequence.shape[-1]).index_select(0, positions)
        targets = labels.reshape(-1).index_select(0, positions)
    logits = head(rows)
    loss = nn.functional.cross_entropy(logits.float(), targets)
    return MaskedLMOutput(loss, logits, sequence)


def selected_positions(labels: torch.Tensor) -> torch.Tensor:
    """The positions ``masked_lm_forward`` predicts (``labels != IGNORE_INDEX``) as flat row-major indices."""
    return (labels.reshape(-1) != IGNORE_INDEX).nonzero().squeeze(1)


def logits_at(model, inputs: dict, positions: torch.Tensor) -> torch.Tensor:
    """``[B, V]`` vocabulary logits of a masked LM at one position per row (PET's ``[MASK]``, Schick & Schütze
    2021 §3), projecting only those rows onto the vocabulary.

    A forward pre-hook on the model's output embeddings (the ``[H, V]`` decoder, where the cost is) gathers the
    rows it is given, so the model's own forward runs unchanged, inside a peft wrapper too (prompt tuning's
    virtual tokens are before the input: ``positions`` count them).  Equal to the dense logits at ``positions``
    (tests/adaptation/test_prompting.py); a model without output embeddings takes the dense path."""
    from ptm_app.backbones.delta import transformers_model

    rows = torch.arange(len(positions), device=positions.device)
    decoder = transformers_model(model).get_output_embeddings()
    if decoder is None:
        return model(**inputs).logits[rows, positions]

    def gather(_module, args):
        return (args[0][rows, positions].unsqueeze(1), *args[1:])

    handle = decoder.register_forward_pre_hook(gather)
    try:
        return model(**inputs).logits[:, 0]
    finally:
        handle.remove()
