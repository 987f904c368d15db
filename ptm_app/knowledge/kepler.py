"""KEPLER (Wang et al. 2021, TACL §2): one encoder trained jointly on masked language modelling and on a TransE
knowledge-embedding (KE) loss over entity descriptions; evaluated by filtered link prediction (§4.3).

An entity is the encoder's [CLS] vector (<s> for RoBERTa) of its description; relations are learned vectors
(``relation_embeddings``, the width of the encoder).  ``L = L_KE + L_MLM`` (§2.3; ``loss_weights`` may weigh them),
a corpus batch and a triple batch each step (``knowledge.data.KeplerDataModule``).  ``test`` ranks every candidate
entity as head and as tail of each held-out triple (``knowledge.link_prediction``), with the entity vectors computed
once per evaluation (batched, no gradient), and logs ``test/<file>/mrr`` and ``hits@1/3/10`` beside the MLM loss.
"""
from __future__ import annotations

from typing import Literal, Optional

import torch
from torch import nn
from torchmetrics import MeanMetric

from ptm_app.errors import PtmError
from ptm_app.knowledge.link_prediction import rank_triples, ranking_metrics
from ptm_app.knowledge.transe import ke_loss, transe_distance
from ptm_app.objectives.mlm import MaskedLMModule
from ptm_app.objectives.targets import MaskedLM
from ptm_app.training.module import weighted_mean_update
from ptm_app.training.optim import OptimConfig


class KeplerModule(MaskedLMModule):
    """MLM (``MaskedLMModule``, its masking options) + KEPLER's KE loss on a ``KeplerDataModule``.

    Args:
        backbone / backbone_config / optim / gradient_checkpointing / masking options: see ``MaskedLMModule``.
        gamma: the margin γ of the KE loss; p_norm: the p of ``d = ||h + r - t||_p``.
        relations: the relation names of ``relation_embeddings``, in order; taken from the data when null (and
            written into checkpoints, so an exported run rebuilds without the data).
        loss_weights: weights of ``mlm`` and ``ke`` in the summed loss (1 and 1).
        entity_batch_size: descriptions encoded at once when embedding the candidates for ranking.
    """

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(), gradient_checkpointing: bool = False,
                 mlm_probability: float = 0.15, mask_ratio: float = 0.8, random_ratio: float = 0.1,
                 masking: Literal["token", "whole_word", "span"] = "token", gamma: float = 4.0, p_norm: int = 1,
                 relations: Optional[list[str]] = None, loss_weights: Optional[dict[str, float]] = None,
                 entity_batch_size: int = 128, sparse_prediction: bool = True):
        unknown = sorted(set(loss_weights or {}) - {"mlm", "ke"})
        if unknown:
            raise PtmError(f"loss_weights: {unknown} are not parts of KEPLER's loss (mlm, ke)")
        if p_norm not in (1, 2):
            raise PtmError(f"p_norm must be 1 or 2 (got {p_norm})")
        self.gamma, self.p_norm, self.entity_batch_size = gamma, p_norm, entity_batch_size
        self.relation_names: Optional[list[str]] = list(relations) if relations else None
        self.relation_embeddings: Optional[nn.Embedding] = None
        weights = {"mlm": 1.0, "ke": 1.0, **(loss_weights or {})}
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing,
                         targets=[MaskedLM(mlm_probability, mask_ratio, random_ratio, masking,
                                           sparse_prediction=sparse_prediction, weight=weights["mlm"])])
        self.weights["ke"] = weights["ke"]
        self.val_ke = MeanMetric()
        self._entity_cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._ranks: dict[str, list[torch.Tensor]] = {}

    # -- building ---------------------------------------------------------------------------------------
    def configure_model(self) -> None:
        super().configure_model()
        if self.relation_embeddings is not None:
            return
        graph = self.data_facts.graph() if self.data_facts is not None and hasattr(self.data_facts, "graph") else None
        names = graph.relations if graph is not None else None
        if self.relation_names is not None and names is not None and names != self.relation_names:
            raise PtmError(f"the model's relations {self.relation_names} differ from the data's {names}; use the "
                           f"same data.init_args.graph and relations as the run that trained it")
        self.relation_names = self.relation_names or names
        if self.relation_names is None:
            if self.data_facts is None:
                return  # built before the data was connected: the fit's configure_model adds the table
            raise PtmError("KeplerModule needs a knowledge graph: data.class_path: KeplerDataModule "
                           "(or model.init_args.relations)")
        hidden = self.backbone.config.hidden_size
        self.relation_embeddings = nn.Embedding(len(self.relation_names), hidden)
        nn.init.uniform_(self.relation_embeddings.weight, -6 / hidden ** 0.5, 6 / hidden ** 0.5)  # TransE §2

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["hyper_parameters"]["relations"] = list(self.relation_names)

    # -- the KE loss ------------------------------------------------------------------------------------
    def encode_entities(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The [CLS] (first-token) vectors of entity descriptions (KEPLER §2.1)."""
        return self.backbone.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, 0]

    def ke_losses(self, kg: dict) -> dict[str, torch.Tensor]:
        """KEPLER's KE loss on a triple batch (``knowledge.data.TripleCollator``) and how often the positive is
        closer than its negatives (``ke_acc``)."""
        vectors = self.encode_entities(kg["entity_input_ids"], kg["entity_attention_mask"])
        with torch.autocast(self.device.type, enabled=False):
            vectors = vectors.float()
            r = self.relation_embeddings(kg["relation"]).float()
            positive = transe_distance(vectors[kg["head"]], r, vectors[kg["tail"]], self.p_norm)
            negative = transe_distance(vectors[kg["negative_head"]], r[:, None], vectors[kg["negative_tail"]],
                                       self.p_norm)
            loss = ke_loss(positive, negative, self.gamma)
        return {"ke": loss, "ke_acc": (positive[:, None] < negative).float().mean().detach()}

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        losses = {**self._losses(batch), **self.ke_losses(batch["kg"])}
        return self.log_train_losses(self._total(losses), losses, self.count_targets(batch["labels"]))

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        if dataloader_idx == 0:
            return super().validation_step(batch, batch_idx)
        weighted_mean_update(self.val_ke, self.ke_losses(batch)["ke"], len(batch["head"]))

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        if self.val_ke.update_called:
            self.log("val/ke", self.val_ke.compute())
            self.val_ke.reset()

    # -- link prediction ---------------------------------------------------------------------------------
    @torch.no_grad()
    def entity_vectors(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(candidate entity indices, their vectors) for held-out file ``name``, once per evaluation.  The
        descriptions are encoded shortest first, so each chunk holds descriptions of like length: on WordNet's
        77,642 test candidates, 1.70M tokens with padding instead of 3.63M (``docs/knowledge.md``)."""
        if name not in self._entity_cache:
            from ptm_app.data.collators import pad

            candidates = self.data_facts.candidates(name)
            tokens = self.data_facts.entity_tokens()
            order = torch.argsort(torch.tensor([len(tokens[i]) for i in candidates.tolist()]), stable=True)
            pad_id = self.tokenizer.pad_token_id
            parts = []
            for start in range(0, len(candidates), self.entity_batch_size):
                if self._trainer is not None and self.trainer.received_sigterm:
                    from lightning.pytorch.utilities.exceptions import SIGTERMException

                    raise SIGTERMException  # tens of minutes over every entity: stop now, not after the batch
                ids = [tokens[i] for i in candidates[order[start:start + self.entity_batch_size]].tolist()]
                input_ids = pad(ids, pad_id).to(self.device)
                mask = pad([torch.ones_like(i) for i in ids], 0).to(self.device)
                parts.append(self.encode_entities(input_ids, mask).float())
            encoded = torch.cat(parts)
            vectors = torch.empty_like(encoded)
            vectors[order.to(encoded.device)] = encoded  # back in the candidates' order
            self._entity_cache[name] = (candidates, vectors)
        return self._entity_cache[name]

    def test_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        if dataloader_idx == 0:
            return super().test_step(batch, batch_idx)
        name = self.data_facts.link_prediction[dataloader_idx - 1]
        candidates, vectors = self.entity_vectors(name)
        tails, heads = self.data_facts.graph().known()
        ranks = rank_triples(batch["triples"].cpu(), vectors.cpu(), candidates,
                             self.relation_embeddings.weight.detach().float().cpu(), tails, heads, self.p_norm)
        self._ranks.setdefault(name, []).append(ranks)

    def on_test_epoch_end(self) -> None:
        super().on_test_epoch_end()
        for name, ranks in self._ranks.items():
            for metric, value in ranking_metrics(torch.cat(ranks)).items():
                self.log(f"test/{name}/{metric}", value)
        self._ranks, self._entity_cache = {}, {}
