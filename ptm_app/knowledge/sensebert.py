"""SenseBERT's supersense prediction, a target of ``MaskedLMModule`` (Levine et al. 2020 §3).

SenseBERT predicts, at every masked word, its WordNet supersense (one of the 45 lexicographer files).  The
word's sense in context is unknown, only the set ``A(w)`` of supersenses of all its senses, so the loss is
the *allowed-senses* loss ``-log Σ_{s ∈ A(w)} p(s | context)`` plus the regulariser
``-(1/|A(w)|) Σ_{s ∈ A(w)} log p(s | context)`` that spreads probability over the allowed senses (§3.1, eq. 3-4);
words not in WordNet (``A(w)`` empty) take no part.

At the input (§3.2, "supersense aware input embeddings") a word's vector is ``(W + S M) x + p``: ``M`` maps the
word to its allowed supersenses and ``S`` is the supersense embedding matrix, the same one that scores the
supersenses at the output (tied, as BERT ties ``W``).  ``M`` is a table over the vocabulary, as in the paper: a
token that is a whole word maps to its ``A(w)``, word pieces and special tokens (``[MASK]`` included) to nothing;
``backbones.sense_input.vocabulary_senses`` reads it once from the corpus annotation.  The input term is then a function of the token
id, so export folds it into the word-embedding table (``backbones.sense_input.fold_sense_input``) and the
exported model is a plain transformers model with the same inputs as in training.
"""
from __future__ import annotations

import torch
from torch import nn

from ptm_app.backbones.sense_input import NUM_SUPERSENSES, allowed_from_masks
from ptm_app.data import IGNORE_INDEX
from ptm_app.errors import PtmError
from ptm_app.objectives.heads import MaskedLMOutput
from ptm_app.objectives.targets import Target


class SupersenseHead(nn.Module):
    """A transform (dense + GELU + LayerNorm, as BERT's MLM head) and a 45-way supersense classifier."""

    def __init__(self, hidden_size: int, num_supersenses: int = NUM_SUPERSENSES):
        super().__init__()
        self.transform = nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.GELU(), nn.LayerNorm(hidden_size))
        self.classifier = nn.Linear(hidden_size, num_supersenses)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.transform(hidden))


def allowed_senses_losses(logits: torch.Tensor, allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SenseBERT's (allowed-senses loss, regulariser), each averaged over the ``N`` words.

    ``logits``: ``[N, S]``; ``allowed``: ``[N, S]`` bool, every row with at least one allowed supersense.
    """
    log_p = torch.log_softmax(logits.float(), dim=-1)
    allowed_loss = -torch.logsumexp(log_p.masked_fill(~allowed, float("-inf")), dim=-1)
    regulariser = -(log_p * allowed).sum(-1) / allowed.sum(-1)
    return allowed_loss.mean(), regulariser.mean()


class Supersense(Target):
    """SenseBERT's supersense prediction (Levine et al. 2020 §3.1) at the masked words that are in WordNet (their
    first sub-token carries ``A(w)``): the allowed-senses loss plus its regulariser (``allowed_senses_losses``).

    Args:
        sense_input: SenseBERT's sense-aware input embedding (§3.2): the input vector of a word is ``(W + S M) x``,
            its word embedding plus the sum of the supersense embeddings of its allowed senses, with ``S`` this
            target's output matrix (tied, as the paper ties input and output); a masked word (input ``[MASK]``)
            gets none.
        weight: its weight in the summed loss.
    """

    name, examples, metrics = "supersense", "supersenses", ("supersense", "supersense_acc")

    def __init__(self, sense_input: bool = False, weight: float = 1.0):
        super().__init__(weight)
        self.sense_input = sense_input

    def build(self, backbone) -> nn.Module:
        return SupersenseHead(backbone.config.hidden_size)

    def losses(self, layers, out: MaskedLMOutput, batch: dict, backbone) -> dict[str, torch.Tensor]:
        if "senses" not in batch:
            raise PtmError("the Supersense target needs sentence blocks with WordNet senses (source: brown_spans), "
                           "but the data module built other examples; remove data.init_args.examples")
        hidden = out.hidden
        where = (batch["labels"] != IGNORE_INDEX) & (batch["senses"] != 0)
        if not where.any():  # no masked WordNet word in the batch: a zero that keeps the graph
            return {"supersense": hidden.sum() * 0.0}
        allowed = allowed_from_masks(batch["senses"][where])
        logits = layers(hidden[where]).float()
        allowed_loss, regulariser = allowed_senses_losses(logits, allowed)
        correct = allowed.gather(1, logits.argmax(-1, keepdim=True)).float().mean()
        return {"supersense": allowed_loss + regulariser, "supersense_allowed": allowed_loss,
                "supersense_reg": regulariser, "supersense_acc": correct}

    def settings(self) -> dict:
        return {"sense_input": self.sense_input, "weight": self.weight}
