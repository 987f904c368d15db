"""LIBERT (Lauscher et al. 2020, "Specializing unsupervised pretraining models for word-level semantic
similarity", §3): BERT's MLM plus *lexical relation classification* (LRC).

LRC takes a word pair from WordNet's synonymy and hyponymy-hypernymy constraints, or a negative pair, as
``[CLS] w1 [SEP] w2 [SEP]`` and classifies the [CLS] representation (a tanh pooler and a softmax classifier,
like BERT's NSP head) as related or not.  The two objectives share the encoder and are trained on alternating
batches (the paper) or summed in every step (``MLMPairsDataModule.combine``).

Negatives (§3, ``negatives: batch_nearest``): for each positive pair ``(w1, w2)`` of a training batch, two negatives
``(ŵ1, w2)`` and ``(w1, ŵ2)``, where ``ŵ1`` is the word of the batch (other than ``w1`` and ``w2``) most similar to
``w2`` and ``ŵ2`` the one most similar to ``w1``, by the cosine of their embeddings (here the model's current input
embeddings, averaged over a word's sub-tokens): hard negatives that change with the batch and the model.
``negatives: data`` trains on the prepared set's fixed random negatives instead.  Evaluation always scores the
prepared validation / test pairs, so runs of either kind are compared on the same pairs.
"""
from __future__ import annotations

from typing import Literal, Optional

import torch
from torch import nn
from torchmetrics import MeanMetric

from ptm_app.data.collators import PadCollator, pad
from ptm_app.errors import PtmError
from ptm_app.objectives.mlm import MaskedLMModule
from ptm_app.objectives.targets import MaskedLM, SentenceRelationHead
from ptm_app.training.module import weighted_mean_update
from ptm_app.training.optim import OptimConfig


Word = tuple[int, ...]


def batch_nearest_negatives(first: list[Word], second: list[Word], vectors: torch.Tensor) -> list[tuple[Word, Word]]:
    """LIBERT's negatives for the positive pairs ``(first[i], second[i])``: ``(ŵ1, second[i])`` and
    ``(first[i], ŵ2)``, ``ŵ1`` / ``ŵ2`` the batch word most cosine-similar to ``second[i]`` / ``first[i]`` among all
    the batch's words but the pair's own two.  ``vectors``: ``[2k, H]``, the words ``first + second`` in order.
    A pair with no other word in the batch gets no negative."""
    words = list(first) + list(second)
    unit = nn.functional.normalize(vectors.float(), dim=-1)
    similarity = unit @ unit.t()
    k, out = len(first), []
    for i in range(k):
        own = torch.tensor([w in (first[i], second[i]) for w in words])
        if own.all():
            continue
        for anchor, keep_first in ((k + i, False), (i, True)):  # the word nearest w2 replaces w1, and vice versa
            nearest = words[int(similarity[anchor].masked_fill(own, float("-inf")).argmax())]
            out.append((first[i], nearest) if keep_first else (nearest, second[i]))
    return out


class LexicalRelationMLMModule(MaskedLMModule):
    """MLM + LIBERT's lexical relation classification, on ``MLMPairsDataModule`` data.

    Args:
        backbone / backbone_config / optim / gradient_checkpointing / mlm_probability / mask_ratio /
            random_ratio / masking / sparse_prediction: as ``MaskedLMModule``.
        loss_weights: weights of ``mlm`` and ``lexrel`` (LRC) in a summed step.
        negatives: ``batch_nearest`` (the paper: two hard negatives per positive pair, drawn from the batch by
            embedding cosine; the prepared negatives of a training batch are left out) or ``data`` (the prepared
            pairs as they are).
    """

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(), gradient_checkpointing: bool = False,
                 mlm_probability: float = 0.15, mask_ratio: float = 0.8, random_ratio: float = 0.1,
                 masking: Literal["token", "whole_word"] = "token",
                 loss_weights: Optional[dict[str, float]] = None, sparse_prediction: bool = True,
                 negatives: Literal["batch_nearest", "data"] = "batch_nearest"):
        self.lexrel_head: Optional[nn.Module] = None  # before super(): a full backbone_config builds at once
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing,
                         targets=[MaskedLM(mlm_probability, mask_ratio, random_ratio, masking,
                                           sparse_prediction=sparse_prediction)])
        self.weights = {"mlm": 1.0, "lexrel": 1.0, **(loss_weights or {})}
        self.negatives = negatives
        self.val_lexrel = nn.ModuleDict({"lexrel": MeanMetric(), "lexrel_acc": MeanMetric()})
        self.test_lexrel = nn.ModuleDict({"lexrel": MeanMetric(), "lexrel_acc": MeanMetric()})

    def configure_model(self) -> None:
        super().configure_model()
        if self.lexrel_head is None:
            labels = self.data_facts.labels() if self.data_facts is not None else None
            if labels is not None and len(labels) != 2:
                raise PtmError(f"LIBERT's lexical relation classification is binary; the pair data has labels "
                               f"{labels}; use wordnet_lexrel (related / unrelated)")
            self.lexrel_head = SentenceRelationHead(self.backbone.config.hidden_size)

    def task_collator(self, kind: str, tokenizer) -> PadCollator:
        """Word pairs are plain padded sequence pairs with a label."""
        return PadCollator(tokenizer.pad_token_id)

    def _label_id(self, name: str) -> int:
        labels = self.data_facts.labels() if self.data_facts is not None else None
        if not labels or name not in labels:
            raise PtmError(f"negatives: batch_nearest needs pair labels 'related' / 'unrelated' (got {labels}); "
                           f"use wordnet_lexrel or set negatives: data")
        return labels.index(name)

    def with_batch_negatives(self, pairs: dict) -> dict:
        """The batch's positive pairs plus their two nearest-in-batch negatives each (LIBERT §3)."""
        related, unrelated = self._label_id("related"), self._label_id("unrelated")
        first, second = [], []
        for ids, n, label in zip(pairs["input_ids"].tolist(), pairs["attention_mask"].sum(-1).tolist(),
                                 pairs["labels"].tolist()):
            sep = ids.index(ids[n - 1])  # [CLS] w1 [SEP] w2 [SEP]
            if label == related and 1 < sep < n - 2:  # both words kept some sub-token
                first.append(tuple(ids[1:sep]))
                second.append(tuple(ids[sep + 1:n - 1]))
        if not first:
            return pairs
        embed = self.backbone.get_input_embeddings()
        with torch.no_grad():
            vectors = torch.stack([embed(torch.tensor(w, device=pairs["input_ids"].device)).mean(0)
                                   for w in first + second])
        rows = [(a, b, related) for a, b in zip(first, second)] + \
            [(a, b, unrelated) for a, b in batch_nearest_negatives(first, second, vectors)]
        cls, sep = int(pairs["input_ids"][0, 0]), int(pairs["input_ids"][0, pairs["attention_mask"][0].sum() - 1])
        pad_id = self.tokenizer.pad_token_id if self.tokenizer is not None else 0
        device = pairs["input_ids"].device
        ids = [torch.tensor([cls, *a, sep, *b, sep], device=device) for a, b, _ in rows]
        types = [torch.tensor([0] * (len(a) + 2) + [1] * (len(b) + 1), device=device) for a, b, _ in rows]
        out = {"input_ids": pad(ids, pad_id), "attention_mask": pad([torch.ones_like(i) for i in ids], 0),
               "labels": torch.tensor([y for *_, y in rows], device=device)}
        if "token_type_ids" in pairs:
            out["token_type_ids"] = pad(types, 0)
        return out

    def _lexrel(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.backbone.base_model(**self.model_inputs(batch))[0]
        logits = self.lexrel_head(hidden).float()
        loss = nn.functional.cross_entropy(logits, batch["labels"])
        return loss, (logits.argmax(-1) == batch["labels"]).float().mean()

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        parts, total = {}, 0.0
        mlm = batch["mlm"] if "mlm" in batch else batch if batch.get("task") == "mlm" else None
        pairs = batch["pairs"] if "pairs" in batch else batch if batch.get("task") == "pairs" else None
        n = 0
        if mlm is not None:
            parts["mlm"] = self._losses(mlm)["mlm"]
            total = total + self.weights["mlm"] * parts["mlm"]
            n = self.count_targets(mlm["labels"])
        if pairs is not None:
            if self.negatives == "batch_nearest":
                pairs = self.with_batch_negatives(pairs)
            parts["lexrel"], parts["lexrel_acc"] = self._lexrel(pairs)
            total = total + self.weights["lexrel"] * parts["lexrel"]
            n = n or len(pairs["labels"])
        for name, value in parts.items():
            self.log(f"train/{name}", value, batch_size=max(n, 1))
        self.log("train/loss", total, prog_bar=True, batch_size=max(n, 1))
        return total

    def _eval(self, batch: dict, loss_metric: MeanMetric, parts: nn.ModuleDict) -> None:
        if batch.get("task") == "pairs":
            loss, acc = self._lexrel(batch)
            weighted_mean_update(parts["lexrel"], loss, len(batch["labels"]))
            weighted_mean_update(parts["lexrel_acc"], acc, len(batch["labels"]))
        else:
            weighted_mean_update(loss_metric, self._losses(batch)["mlm"], self.count_targets(batch["labels"]))

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval(batch, self.val_loss, self.val_lexrel)

    def test_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval(batch, self.test_loss, self.test_lexrel)

    def _log_parts(self, stage: str, parts: nn.ModuleDict) -> None:
        for name, metric in parts.items():
            if metric.update_called:
                self.log(f"{stage}/{name}", metric.compute(), add_dataloader_idx=False)
                metric.reset()

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        self._log_parts("val", self.val_lexrel)

    def on_test_epoch_end(self) -> None:
        super().on_test_epoch_end()
        self._log_parts("test", self.test_lexrel)
