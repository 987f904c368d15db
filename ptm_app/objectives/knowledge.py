"""Knowledge targets on top of MLM: SenseBERT's supersense prediction (Levine et al. 2020 §3).

SenseBERT predicts, at every masked word, its WordNet supersense (one of the 45 lexicographer files).  The
word's sense in context is unknown, only the set ``A(w)`` of supersenses of all its senses, so the loss is
the *allowed-senses* loss ``-log Σ_{s ∈ A(w)} p(s | context)`` plus the regulariser
``-(1/|A(w)|) Σ_{s ∈ A(w)} log p(s | context)`` that spreads probability over the allowed senses (§3.1, eq. 3-4);
words not in WordNet (``A(w)`` empty) take no part.

At the input (§3.2, "supersense aware input embeddings") a word's vector is ``(W + S M) x + p``: ``M`` maps the
word to its allowed supersenses and ``S`` is the supersense embedding matrix, the same one that scores the
supersenses at the output (tied, as BERT ties ``W``).  ``M`` is a table over the vocabulary, as in the paper: a
token that is a whole word maps to its ``A(w)``, word pieces and special tokens (``[MASK]`` included) to nothing;
``vocabulary_senses`` reads it once from the corpus annotation.  The input term is then a function of the token
id, so export folds it into the word-embedding table (``backbones.sense_input.fold_sense_input``) and the
exported model is a plain transformers model with the same inputs as in training.
"""
from __future__ import annotations

import torch
from torch import nn

from ptm_app.backbones.sense_input import NUM_SUPERSENSES


class SupersenseHead(nn.Module):
    """A transform (dense + GELU + LayerNorm, as BERT's MLM head) and a 45-way supersense classifier."""

    def __init__(self, hidden_size: int, num_supersenses: int = NUM_SUPERSENSES):
        super().__init__()
        self.transform = nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.GELU(), nn.LayerNorm(hidden_size))
        self.classifier = nn.Linear(hidden_size, num_supersenses)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.transform(hidden))


def vocabulary_senses(ids, senses, line_offsets, word_start, vocab_size: int) -> torch.Tensor:
    """SenseBERT's ``M`` as ``[vocab_size]`` int64 bit masks: for every token that stands alone as a word of the
    corpus (an annotated first sub-token followed by a word start or the end of its sentence), the ``A(w)`` the
    annotation gives it (the union, should two surface forms normalise to one token); 0 for the rest.

    ``ids``/``senses``: the corpus's tokens and their annotation (``data.knowledge_spans``); ``line_offsets``:
    sentence boundaries; ``word_start``: per vocabulary id, whether the token begins a word."""
    import numpy as np

    ids, senses = np.asarray(ids, np.int64), np.asarray(senses, np.int64)
    next_starts = np.ones(len(ids), bool)
    next_starts[:-1] = np.asarray(word_start, bool)[ids[1:]]
    ends = np.asarray(line_offsets, np.int64)[1:] - 1
    next_starts[ends[(ends >= 0) & (ends < len(ids))]] = True
    alone = (senses != 0) & next_starts
    table = np.zeros(vocab_size, np.int64)
    np.bitwise_or.at(table, ids[alone], senses[alone])
    return torch.from_numpy(table)


def allowed_senses_losses(logits: torch.Tensor, allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SenseBERT's (allowed-senses loss, regulariser), each averaged over the ``N`` words.

    ``logits``: ``[N, S]``; ``allowed``: ``[N, S]`` bool, every row with at least one allowed supersense.
    """
    log_p = torch.log_softmax(logits.float(), dim=-1)
    allowed_loss = -torch.logsumexp(log_p.masked_fill(~allowed, float("-inf")), dim=-1)
    regulariser = -(log_p * allowed).sum(-1) / allowed.sum(-1)
    return allowed_loss.mean(), regulariser.mean()
