"""Self-attention mask builders (UniLM, Dong et al. 2019 §2.2–2.3).

One shared Transformer becomes a bidirectional, left-to-right or seq2seq LM purely by its self-attention
mask (Han Eq. 1: ``ATT-Mask(x) = −∞`` where q_i must not attend to k_j).  Packed sequences use a
block-diagonal document mask with per-document position ids.

Conventions: boolean masks ``[B, L, L]``, ``True`` = query ``i`` MAY attend to key ``j``.  Padding keys
(``attention_mask == 0``) are never visible; a padded query row sees only itself, so softmax never gets
an all-masked row (no NaN).  Causal means ``j <= i``: Han §3.1's "A_ij = 0, i > j" is reversed
(survey trap T21).

Feeding the masks to transformers v5 (5.23) encoders, as read from ``models/bert/modeling_bert.py`` and
``masking_utils.py``: ``BertModel.forward`` calls ``create_bidirectional_mask``, whose
``_preprocess_mask_arguments`` returns any 4-D ``attention_mask`` unchanged.  What happens next depends
on ``config._attn_implementation``:

* ``"eager"`` adds the mask to the scores (``attn_weights + attention_mask``): a float additive mask is
  honoured, a bool mask is silently WRONG (True/False are added as 1/0, nothing is masked);
* ``"sdpa"`` passes it to ``scaled_dot_product_attention(attn_mask=...)``: bool and float both honoured;
* ``"flash_attention_*"`` only accepts a 2-D padding mask (it unpads by sequence lengths), so an
  arbitrary pattern cannot be expressed; ``"flex_attention"`` is not supported here either;
* a 3-D mask is not accepted at all (it is expanded as a 2-D padding mask and crashes).

``encoder_attention_kwargs`` therefore always passes a 4-D float additive mask, which both eager and
sdpa honour, and rejects other implementations and model families.
"""
from __future__ import annotations

import torch
from torch import nn

# Model types whose v5 forward sends ``attention_mask`` through ``create_bidirectional_mask`` (4-D as-is)
# and whose attention adds it to the scores (eager) or hands it to SDPA.
MASK_AS_IS_MODEL_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "camembert", "electra", "albert", "distilbert"})
MASK_HONOURING_IMPLEMENTATIONS = frozenset({"eager", "sdpa"})
# Decoders whose v5 forward sends ``attention_mask`` through ``create_causal_mask`` (a 4-D mask is returned
# as-is by ``_preprocess_mask_arguments``) and whose eager attention adds it to the scores.
CAUSAL_MASK_AS_IS_MODEL_TYPES = frozenset({"gpt2", "llama", "mistral", "qwen2"})
# RoBERTa-style position ids count from ``config.pad_token_id + 1``.
OFFSET_POSITION_MODEL_TYPES = frozenset({"roberta", "xlm-roberta", "camembert"})


def _finalize(allowed: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Hide padding keys and rows; a padded query row attends to itself only."""
    valid = attention_mask.bool()
    allowed = allowed & valid[:, None, :] & valid[:, :, None]
    eye = torch.eye(valid.shape[1], dtype=torch.bool, device=valid.device)
    return allowed | (eye & ~valid[:, :, None])


def _lower_triangular(length: int, device: torch.device) -> torch.Tensor:
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()[None]


def bidirectional_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Bidirectional LM / MLM (UniLM §2.2): every token sees every real token."""
    batch, length = attention_mask.shape
    allowed = torch.ones(batch, length, length, dtype=torch.bool, device=attention_mask.device)
    return _finalize(allowed, attention_mask)


def causal_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Left-to-right LM (UniLM §2.2): query ``i`` sees keys ``j <= i`` (lower-triangular, trap T21)."""
    allowed = _lower_triangular(attention_mask.shape[1], attention_mask.device)
    return _finalize(allowed.expand(attention_mask.shape[0], -1, -1), attention_mask)


def seq2seq_mask(attention_mask: torch.Tensor, source_mask: torch.Tensor) -> torch.Tensor:
    """Seq2seq LM (UniLM §2.2, Fig. 1): source sees the whole source, target sees source + target ``<= i``.

    ``source_mask`` [B, L] is True at source tokens; the other real tokens form the target.
    """
    valid = attention_mask.bool()
    source = source_mask.bool() & valid
    target = valid & ~source
    tril = _lower_triangular(attention_mask.shape[1], attention_mask.device)
    allowed = source[:, None, :] | (target[:, :, None] & target[:, None, :] & tril)
    return _finalize(allowed, attention_mask)


def prefix_mask(attention_mask: torch.Tensor, prefix_lengths: torch.Tensor) -> torch.Tensor:
    """Prefix LM: ``seq2seq_mask`` with the first ``prefix_lengths[b]`` tokens as the source."""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    source = positions[None, :] < prefix_lengths.to(attention_mask.device)[:, None]
    return seq2seq_mask(attention_mask, source)


def _document_starts(doc_ids: torch.Tensor) -> torch.Tensor:
    """True where a new run of equal ``doc_ids`` begins (position 0 always starts one)."""
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    return starts


def document_mask(attention_mask: torch.Tensor, doc_ids: torch.Tensor, *, causal: bool = False) -> torch.Tensor:
    """Block-diagonal mask for packed sequences: attention only inside a document (a run of equal ids).

    With ``causal=True`` each block is additionally lower-triangular (packed causal LM).
    """
    segment = _document_starts(doc_ids).long().cumsum(dim=1)
    allowed = segment[:, :, None] == segment[:, None, :]
    if causal:
        allowed = allowed & _lower_triangular(doc_ids.shape[1], doc_ids.device)
    return _finalize(allowed, attention_mask)


def document_position_ids(doc_ids: torch.Tensor, start: int = 0) -> torch.Tensor:
    """Position ids restarting at ``start`` for each packed document.

    ``start`` is 0 for BERT/ALBERT/ELECTRA/DistilBERT; RoBERTa-style models count from
    ``config.pad_token_id + 1``.
    """
    index = torch.arange(doc_ids.shape[1], device=doc_ids.device).expand_as(doc_ids)
    first = torch.where(_document_starts(doc_ids), index, torch.zeros_like(index)).cummax(dim=1).values
    return index - first + start


def to_additive(mask_bool: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Boolean ``[B, L, L]`` → additive float ``[B, 1, L, L]``: 0 where allowed, ``finfo(dtype).min`` elsewhere."""
    additive = torch.zeros(mask_bool.shape, dtype=dtype, device=mask_bool.device)
    additive = additive.masked_fill(~mask_bool.bool(), torch.finfo(dtype).min)
    return additive[:, None]


def _mask_support_problem(config, model_types: frozenset) -> str | None:
    """Why ``config``'s model would ignore or misread a custom 4-D mask, or None if it honours one."""
    if config.model_type not in model_types:
        return (f"custom attention masks are only supported for {sorted(model_types)}, "
                f"not model_type={config.model_type!r}")
    implementation = config._attn_implementation
    if implementation not in MASK_HONOURING_IMPLEMENTATIONS:
        return (f"attn_implementation={implementation!r} cannot apply a custom [B, L, L] mask "
                "(flash attention only takes 2-D padding masks); load the model with "
                "attn_implementation='sdpa' or 'eager', or call model.set_attn_implementation('sdpa')")
    return None


def encoder_attention_kwargs(model: nn.Module, mask_bool: torch.Tensor) -> dict[str, torch.Tensor]:
    """Keyword arguments that make a transformers v5 BERT-family model respect ``mask_bool`` [B, L, L].

    Returns ``{"attention_mask": <[B, 1, L, L] additive mask in the model's dtype and device>}``.
    Raises ``ValueError`` for model types or attention implementations that would ignore or misread it.
    """
    problem = _mask_support_problem(model.config, MASK_AS_IS_MODEL_TYPES)
    if problem:
        raise ValueError(problem)
    if mask_bool.dim() != 3 or mask_bool.shape[1] != mask_bool.shape[2]:
        raise ValueError(f"expected a boolean mask of shape [B, L, L], got {tuple(mask_bool.shape)}")
    return {"attention_mask": to_additive(mask_bool.to(model.device), model.dtype)}


def packed_document_inputs(model: nn.Module, attention_mask: torch.Tensor, doc_ids: torch.Tensor) -> dict:
    """``attention_mask`` and ``position_ids`` that keep packed documents apart inside each block.

    ``doc_ids`` [B, L] names the document of every token (runs of equal ids).  The mask is block-diagonal
    (``document_mask``; lower-triangular blocks for decoders), padding masked, handed over as the 4-D
    additive mask that transformers v5 passes through unchanged; position ids restart at every document
    (``document_position_ids``; from ``pad_token_id + 1`` for RoBERTa-style models).  Packing that does not
    leak attention across documents is what Krell et al. 2021 ("Efficient sequence packing without
    cross-contamination") and Llama 3's pre-training (Dubey et al. 2024 §3.2) use.
    """
    from ptm_app.errors import PtmError

    config = model.config
    causal = config.model_type in CAUSAL_MASK_AS_IS_MODEL_TYPES
    problem = _mask_support_problem(config, MASK_AS_IS_MODEL_TYPES | CAUSAL_MASK_AS_IS_MODEL_TYPES)
    if problem:
        raise PtmError(f"document_attention: {problem}; or set data.init_args.document_attention: false")
    start = config.pad_token_id + 1 if config.model_type in OFFSET_POSITION_MODEL_TYPES else 0
    mask = document_mask(attention_mask, doc_ids, causal=causal)
    return {"attention_mask": to_additive(mask.to(model.device), model.dtype),
            "position_ids": document_position_ids(doc_ids, start).to(model.device)}
