"""Distillation losses, pure functions on model outputs (each weighted and logged on its own by the ``distill``
policy, ``compression.teacher_loss.TeacherLoss``).

* ``soft_target_loss``: Hinton et al. 2015 §2, ``T² · KL(p_T ‖ p_S)`` between the softmaxes at temperature T.
  The surveys print the soft cross-entropy without its minus sign; this is the correct, non-negative form, and
  the ``T²`` keeps its gradient ``T·(q_i − p_i)`` on the same scale as the hard-label loss when T changes.
* ``logit_mse``: Tang et al. 2019 §3.2, ``‖z_T − z_S‖²`` between the logits (the BiLSTM student's loss).
* ``hidden_mse`` / ``embedding`` loss: TinyBERT (Jiao et al. 2020 §3.1), ``MSE(H_S W_h, H_T)`` with a learned
  projection ``W_h`` where the widths differ; the mean runs over real (non-padding) token positions only.
* ``patient_loss``: PKD (Sun et al. 2019 §3.2), ``‖h_S/‖h_S‖ − h_T/‖h_T‖‖²`` of the normalised [CLS] states
  of the mapped layers.
* ``attention_score_mse``: TinyBERT §3.1, ``1/h Σ_i MSE(A_i^S, A_i^T)`` per head on the attention *scores*
  ``QKᵀ/√d`` (before the softmax), over real query and key positions.
* ``cosine_loss``: DistilBERT (Sanh et al. 2019 §3), ``1 − cos(h_S, h_T)`` of the last hidden states per token.
* ``relation_kl``: MiniLM's deep self-attention distillation (Wang et al. 2020 §3.1–3.2): the KL between the
  teacher's and the student's last-layer attention distributions ``softmax(QKᵀ/√d)`` and value relations
  ``softmax(VVᵀ/√d)``, per head and real query position (relations are T×T: the widths may differ).
"""
from __future__ import annotations

import math

import torch
from torch.nn import functional as F


def soft_target_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``T² · mean_batch KL(softmax(z_T/T) ‖ softmax(z_S/T))``: 0 when the logits are equal, never negative."""
    t = float(temperature)
    log_q = F.log_softmax(student_logits.float() / t, dim=-1)
    log_p = F.log_softmax(teacher_logits.float() / t, dim=-1)
    return F.kl_div(log_q, log_p, log_target=True, reduction="batchmean") * t * t


def logit_mse(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Squared error between the logits, summed over classes and averaged over the batch."""
    return ((student_logits.float() - teacher_logits.float()) ** 2).sum(-1).mean()


def _token_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``per_token`` [B, T] over the positions where ``mask`` [B, T] is 1."""
    mask = mask.to(per_token.dtype)
    return (per_token * mask).sum() / mask.sum().clamp_min(1.0)


def hidden_mse(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error per hidden unit of [B, T, D] states (already projected to the teacher's width)."""
    return _token_mean(((student.float() - teacher.float()) ** 2).mean(-1), mask)


def cosine_loss(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``1 − cos(h_S, h_T)`` averaged over real tokens (DistilBERT's cosine embedding loss, target +1)."""
    return _token_mean(1.0 - F.cosine_similarity(student.float(), teacher.float(), dim=-1), mask)


def patient_loss(student_cls: torch.Tensor, teacher_cls: torch.Tensor) -> torch.Tensor:
    """Squared distance between the L2-normalised [B, D] [CLS] states, averaged over the batch."""
    diff = F.normalize(student_cls.float(), dim=-1) - F.normalize(teacher_cls.float(), dim=-1)
    return (diff ** 2).sum(-1).mean()


def attention_scores(layer_input: torch.Tensor, query: torch.nn.Module, key: torch.nn.Module,
                     heads: int) -> torch.Tensor:
    """A BERT-style layer's attention scores ``QKᵀ/√d_head`` [B, H, T, T] before the softmax and mask, from
    the layer's input (its previous hidden state) and its own query / key projections."""
    b, n, _ = layer_input.shape
    q = query(layer_input).view(b, n, heads, -1).transpose(1, 2)
    k = key(layer_input).view(b, n, heads, -1).transpose(1, 2)
    return q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])


def attention_score_mse(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``1/h Σ_i MSE(A_i^S, A_i^T)`` over [B, H, T, T] scores, real query × key positions only."""
    pair = (mask[:, :, None] * mask[:, None, :]).to(torch.float32)  # [B, T, T]
    per_head = (((student.float() - teacher.float()) ** 2) * pair[:, None]).sum((0, 2, 3)) / pair.sum().clamp_min(1.0)
    return per_head.mean()


def next_token_kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor,
                       temperature: float, ignore_index: int = -100) -> torch.Tensor:
    """Word-level distillation of a causal LM (Kim & Rush 2016 §3; Hinton §2): ``T²·KL(p_T ‖ p_S)`` over the
    vocabulary at every position t that predicts a real token ``labels[t+1]`` (logits [B, T, V], labels [B, T]),
    averaged over those positions; 0 when the logits are equal."""
    keep = labels[:, 1:] != ignore_index
    return soft_target_loss(student_logits[:, :-1][keep], teacher_logits[:, :-1][keep], temperature)


def value_relations(layer_input: torch.Tensor, value: torch.nn.Module, heads: int) -> torch.Tensor:
    """MiniLM's value relation scores ``VVᵀ/√d_head`` [B, H, T, T] (before the softmax) of a BERT-style layer."""
    b, n, _ = layer_input.shape
    v = value(layer_input).view(b, n, heads, -1).transpose(1, 2)
    return v @ v.transpose(-1, -2) / math.sqrt(v.shape[-1])


def relation_kl(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``1/(H·|x|) Σ_heads Σ_queries KL(softmax(teacher row) ‖ softmax(student row))`` over [B, H, T, T] scores;
    padding keys are left out of both softmaxes and padding queries out of the mean.  0 when the scores are equal."""
    keys = ~mask[:, None, None, :].bool()
    log_p = F.log_softmax(teacher.float().masked_fill(keys, float("-inf")), dim=-1)
    log_q = F.log_softmax(student.float().masked_fill(keys, float("-inf")), dim=-1)
    per_row = (log_p.exp() * (log_p - log_q)).masked_fill(keys, 0.0).sum(-1)  # [B, H, T]
    return _token_mean(per_row.mean(1), mask)
