"""SenseBERT's supersense-aware input embeddings (Levine et al. 2020 §3.2): a token's vector is ``(W + S M) x``,
with ``M`` its allowed supersenses as a bit mask and ``S`` the supersense embedding matrix (the ``Supersense`` target of
``knowledge.sensebert`` trains them; export folds the term into the word-embedding table).  ``M`` is built here
(``vocabulary_senses``): ``MaskedLMModule`` applies the input term and export folds it, both below ``knowledge/``."""
from __future__ import annotations

import torch
from torch import nn

from ptm_app.data.sources.wordnet import LEXNAMES

NUM_SUPERSENSES = len(LEXNAMES)  # 45: 26 noun, 15 verb, 3 adjective and 1 adverb files


def allowed_from_masks(masks: torch.Tensor, num_supersenses: int = NUM_SUPERSENSES) -> torch.Tensor:
    """``[N]`` int64 bit masks (bit k = supersense k) -> ``[N, num_supersenses]`` bool."""
    bits = torch.arange(num_supersenses, device=masks.device)
    return ((masks.unsqueeze(-1) >> bits) & 1).bool()


def sense_aware_embeddings(word_embeddings: torch.Tensor, senses: torch.Tensor,
                           supersense_matrix: torch.Tensor) -> torch.Tensor:
    """SenseBERT's ``(W + S M) x``: ``word_embeddings`` ``[..., H]`` (``W x``) plus, per token, the sum of the rows
    of ``supersense_matrix`` ``[S, H]`` (the columns of ``S``) at the bits set in ``senses`` ``[...]``."""
    allowed = allowed_from_masks(senses, supersense_matrix.shape[0]).to(supersense_matrix.dtype)
    return word_embeddings + (allowed @ supersense_matrix).to(word_embeddings.dtype)


def fold_sense_input(model: nn.Module, word_senses: torch.Tensor, supersense_matrix: torch.Tensor) -> None:
    """The input term into ``model``'s word-embedding table: row ``v`` becomes ``W_v + S A(v)`` (``word_senses``:
    ``[V]`` bit masks of ``A(v)``; ``supersense_matrix``: ``S``, ``[45, H]``), so the plain model given token ids
    sees what training gave it.  The MLM decoder, tied to
    ``W`` in training, keeps ``W`` and its bias: the ties are cut (``tie_word_embeddings: false``) first."""
    embeddings, decoder = model.get_input_embeddings(), model.get_output_embeddings()
    with torch.no_grad():
        if decoder is not None and decoder.weight is embeddings.weight:
            decoder.weight = nn.Parameter(embeddings.weight.detach().clone())
            if decoder.bias is not None:  # BERT ties it to cls.predictions.bias: untied, it is saved on its own
                decoder.bias = nn.Parameter(decoder.bias.detach().clone())
            model.config.tie_word_embeddings = False
        embeddings.weight.copy_(sense_aware_embeddings(embeddings.weight, word_senses.long(), supersense_matrix))


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
