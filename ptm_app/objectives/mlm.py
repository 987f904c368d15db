"""Masked language modelling and its variants, with optional extra targets summed into one loss.

BERT (Devlin et al. 2019 §3.1): 15 %, 80/10/10, + NSP.  RoBERTa (Liu et al. 2019 §4): dynamic
masking, no NSP.  ALBERT (Lan et al. 2020 §4.1): + SOP.  SpanBERT (Joshi et al. 2020 §3): span
masking + span boundary objective.  BERT-wwm: whole-word masking.  ERNIE (Baidu; Sun et al. 2019 §3.2):
knowledge (phrase / entity) masking.  SenseBERT (Levine et al. 2020 §3): + supersense prediction.  These are
configs of one module.
"""
from __future__ import annotations

from typing import Literal, Optional, Sequence

import torch
from torch import nn
from torchmetrics import MeanMetric

from ptm_app.backbones.build import max_positions
from ptm_app.backbones.sense_input import allowed_from_masks, sense_aware_embeddings
from ptm_app.checkpoints import CKPT_KEY
from ptm_app.constants import IGNORE_INDEX
from ptm_app.data.collators import MLMCollator, word_start_table
from ptm_app.errors import PtmError
from ptm_app.objectives.knowledge import SupersenseHead, allowed_senses_losses, vocabulary_senses
from ptm_app.objectives.heads import SentenceRelationHead, SpanBoundaryHead, masked_lm_forward, selected_positions
from ptm_app.objectives.lm_base import LanguageModelModule
from ptm_app.training.module import weighted_mean_update
from ptm_app.training.optim import OptimConfig


ERNIE_STAGES = (1 / 3, 2 / 3)  # step fractions where phrase-level, then entity-level masking start


class MaskedLMModule(LanguageModelModule):
    """MLM pre-training on any ``AutoModelForMaskedLM`` backbone, plus optional targets.

    Args:
        backbone / backbone_config / optim / gradient_checkpointing: see ``PtmModule``.
        mlm_probability / mask_ratio / random_ratio: the masking recipe (0.15 / 0.8 / 0.1).
        masking: ``token``, ``whole_word``, ``span`` (SpanBERT geometric spans, ``span_p``, ``max_span_length``) or
            ``knowledge`` (ERNIE: words, phrases and entities masked as whole units; needs a span-annotated corpus
            such as ``brown_spans``, see ``data.knowledge_spans``).
        knowledge_levels: ``staged`` (ERNIE's three stages: basic word masking, then phrase-level from
            ``knowledge_stages[0]`` of the run's steps, then entity-level from ``knowledge_stages[1]``) or
            ``mixed`` (entities, phrases and words are units of one draw throughout).
        supersense_objective: add SenseBERT's supersense target at the masked words that are in WordNet
            (allowed-senses loss + regulariser, ``objectives.knowledge``); needs a corpus with ``senses``.
        supersense_input: SenseBERT's sense-aware input embedding (§3.2): the input vector of a word is
            ``(W + S M) x``, its word embedding plus the sum of the supersense embeddings of its allowed senses, with
            ``S`` the supersense head's output matrix (tied, as the paper ties input and output); a masked word
            (input ``[MASK]``) gets none.  Needs ``supersense_objective``.
        static_masking: BERT's static masking (RoBERTa §4.1): each example's mask (and, with NSP/SOP, its sentence
            pair) drawn once from the example's own key, the same in every batch and epoch, instead of a fresh one
            every batch (dynamic, the default).
        static_copies: with ``static_masking``, each example gets one of this many fixed masks (copy ``epoch % k``;
            BERT's ``dupe_factor``, 10 in RoBERTa's static baseline); 1: one mask for the whole run.
        sentence_objective: ``nsp`` (random next segment from another document) or ``sop`` (swapped order);
            the data module then builds sentence-pair examples from document boundaries.
        span_boundary_objective: add SpanBERT's SBO target (needs ``masking: span``).
        loss_weights: weights of ``mlm``, ``sentence``, ``sbo`` and ``supersense`` in the summed loss.
        sparse_prediction: compute vocabulary logits only at the masked positions (the default; same loss,
            see ``heads.masked_lm_forward``); ``false`` projects every position, as ``*ForMaskedLM`` does.
    """

    head = "masked_lm"

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(), gradient_checkpointing: bool = False,
                 mlm_probability: float = 0.15, mask_ratio: float = 0.8, random_ratio: float = 0.1,
                 masking: Literal["token", "whole_word", "span", "knowledge"] = "token", static_masking: bool = False,
                 span_p: float = 0.2, max_span_length: int = 10,
                 sentence_objective: Optional[Literal["nsp", "sop"]] = None, span_boundary_objective: bool = False,
                 loss_weights: Optional[dict[str, float]] = None, sparse_prediction: bool = True,
                 knowledge_levels: Literal["staged", "mixed"] = "staged",
                 knowledge_stages: Sequence[float] = ERNIE_STAGES, supersense_objective: bool = False,
                 supersense_input: bool = False, static_copies: int = 1):
        if static_copies < 1 or (static_copies != 1 and not static_masking):
            raise PtmError(f"static_copies={static_copies} needs static_masking: true and a count >= 1 "
                           f"(dynamic masks are drawn anew every batch)")
        if span_boundary_objective and masking != "span":
            raise PtmError("span_boundary_objective needs masking: span (SpanBERT §3.2)")
        if len(knowledge_stages) != 2 or not 0.0 <= knowledge_stages[0] <= knowledge_stages[1] <= 1.0:
            raise PtmError(f"knowledge_stages must be two step fractions 0 <= phrase <= entity <= 1 "
                           f"(got {list(knowledge_stages)})")
        staged_default = knowledge_levels == "staged" and tuple(knowledge_stages) == ERNIE_STAGES
        if masking != "knowledge" and not staged_default:
            raise PtmError(f"knowledge_levels and knowledge_stages apply to masking: knowledge only (got masking: "
                           f"{masking}); remove them or set masking: knowledge")
        if knowledge_levels == "mixed" and tuple(knowledge_stages) != ERNIE_STAGES:
            raise PtmError("knowledge_stages schedule knowledge_levels: staged; with mixed every level is drawn "
                           "from the first step: remove knowledge_stages")
        if sentence_objective and (masking == "knowledge" or supersense_objective):
            raise PtmError("knowledge masking and the supersense objective train on sentence blocks; "
                           "remove sentence_objective")
        if supersense_input and not supersense_objective:
            raise PtmError("supersense_input embeds the supersenses with the supersense head's matrix (SenseBERT §3.2); "
                           "set supersense_objective: true")
        self.knowledge_levels, self.knowledge_stages = knowledge_levels, tuple(knowledge_stages)
        self.supersense_objective, self.supersense_input = supersense_objective, supersense_input
        self.heads = None
        # kept as attributes, not only hparams: a subclass's CLI hparams hold just its own arguments
        self.masking_cfg = dict(mlm_probability=mlm_probability, mask_ratio=mask_ratio, random_ratio=random_ratio,
                                masking=masking, static=static_masking, span_p=span_p, max_span_length=max_span_length,
                                static_copies=static_copies)
        self.sentence_objective, self.span_boundary_objective = sentence_objective, span_boundary_objective
        self.sparse_prediction = sparse_prediction
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)
        self.weights = {"mlm": 1.0, "sentence": 1.0, "sbo": 1.0, "supersense": 1.0, **(loss_weights or {})}
        self.val_parts = nn.ModuleDict({"sentence": MeanMetric(), "sentence_acc": MeanMetric(), "sbo": MeanMetric(),
                                        "supersense": MeanMetric(), "supersense_acc": MeanMetric()})

    @property
    def example_format(self) -> str:
        """What the data module must build: token blocks, NSP/SOP sentence pairs, or sentence blocks with
        knowledge spans and / or supersenses (``data.knowledge_spans``)."""
        spans = (["knowledge_spans"] if self.masking_cfg["masking"] == "knowledge" else []) + \
            (["supersenses"] if self.supersense_objective else [])
        return "+".join(spans) or self.sentence_objective or "blocks"

    @property
    def static_copies(self) -> Optional[int]:
        """With static masking, the k fixed draws per example (the data module draws NSP/SOP pairs the same way);
        None when every batch draws anew."""
        return self.masking_cfg["static_copies"] if self.masking_cfg["static"] else None

    def configure_model(self) -> None:
        super().configure_model()
        if self.heads is None:
            hidden = self.backbone.config.hidden_size
            heads = {}
            if self.sentence_objective:
                heads["sentence"] = SentenceRelationHead(hidden)
            if self.span_boundary_objective:
                offsets = max_positions(self.backbone)  # a span's token offsets stay inside the row
                if offsets is None:
                    raise PtmError("span_boundary_objective sizes its position table by the backbone's positions; "
                                   "use a backbone with max_position_embeddings (model_type: bert ...)")
                heads["sbo"] = SpanBoundaryHead(hidden, offsets)
            if self.supersense_objective:
                heads["supersense"] = SupersenseHead(hidden)
            self.heads = nn.ModuleDict(heads)
        if self.supersense_input and not hasattr(self, "word_senses"):  # SenseBERT's M (``vocabulary_senses``)
            vocab = self.backbone.get_input_embeddings().num_embeddings
            self.register_buffer("word_senses", torch.zeros(vocab, dtype=torch.long, device=self.device))

    def make_collator(self, tokenizer, seed: int = 0) -> MLMCollator:
        if tokenizer.mask_token_id is None:
            raise PtmError("MaskedLMModule needs a tokenizer with a [MASK] token; use a BERT-style (wordpiece) tokenizer")
        vocab = min(len(tokenizer), self.backbone.config.vocab_size) if self.backbone is not None else len(tokenizer)
        cfg = self.masking_cfg
        common = dict(pad_token_id=tokenizer.pad_token_id, mask_token_id=tokenizer.mask_token_id,
                      special_ids=tuple(i for i in tokenizer.all_special_ids if i < vocab), vocab_size=vocab,
                      seed=seed, word_start=word_start_table(tokenizer, vocab) if cfg["masking"] != "token" else None,
                      **cfg)
        if "+" in self.example_format or self.example_format in ("knowledge_spans", "supersenses"):
            from ptm_app.data.knowledge_spans import KnowledgeMLMCollator

            return KnowledgeMLMCollator(**common, knowledge_levels=self.knowledge_levels)
        return MLMCollator(**common)

    def knowledge_stage(self) -> int:
        """ERNIE's current stage (0 word, 1 phrase, 2 entity): how many of ``knowledge_stages`` the run's
        progress (global step / total steps) has reached.  A function of the step, so a resumed run agrees."""
        trainer = self._trainer
        if trainer is None:
            return 0
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else trainer.estimated_stepping_batches
        progress = self.global_step / max(total, 1)
        return sum(progress >= f for f in self.knowledge_stages)

    def _stage_view(self, batch: dict) -> dict:
        """Staged knowledge masking: the batch's inputs and labels of the current stage's level."""
        views = batch.get("knowledge_views")
        if views is None:
            return batch
        from ptm_app.data.corruption.knowledge import LEVELS

        return {**batch, **views[LEVELS[self.knowledge_stage()]]}

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        """Facts read from the batch while it is still on the CPU, so the step need not read them back from a GPU
        (each read there is a host sync that stalls the queue of kernels):

        - ``mlm_positions``: the predicted positions as flat indices (``heads.selected_positions``), for the sparse
          head's gather (not with staged knowledge masking, whose labels change with the stage);
        - ``attention_all_ones``: the attention mask has no padding, so the model gets none (``model_inputs``), as
          transformers itself decides for SDPA after reading the mask back (``padding_mask.all()``), which also lets
          SDPA pick its flash kernel.
        """
        batch = super().on_before_batch_transfer(batch, dataloader_idx)
        if not isinstance(batch, dict) or "labels" not in batch:
            return batch
        pin = self.device.type == "cuda"
        if self.sparse_prediction and "knowledge_views" not in batch and "mlm_positions" not in batch:
            positions = selected_positions(batch["labels"])
            batch["mlm_positions"] = positions.pin_memory() if pin else positions
        mask = batch.get("attention_mask")
        if mask is not None and mask.device.type == "cpu" and not {"document_ids", "knowledge_views", "attention_3d"} & set(batch):
            batch["attention_all_ones"] = bool(mask.all())
        return batch

    def model_inputs(self, batch: dict) -> dict:
        """With ``supersense_input``, the sense-aware input embeddings ``(W + S M) x`` in place of the token ids.
        Without the attention mask when it is all ones (``on_before_batch_transfer``): the same attention."""
        inputs = super().model_inputs(batch)
        if batch.get("attention_all_ones"):
            inputs.pop("attention_mask", None)
        if not self.supersense_input:
            return inputs
        ids = inputs.pop("input_ids")
        word = self.backbone.get_input_embeddings()(ids)
        inputs["inputs_embeds"] = sense_aware_embeddings(word, self.word_senses[ids],
                                                         self.heads["supersense"].classifier.weight)
        return inputs

    def on_fit_start(self) -> None:
        """SenseBERT's ``M`` from the training corpus's annotation, once (a resumed run restores it)."""
        super().on_fit_start()
        if self.supersense_input and not self.word_senses.any():
            dataset = self.data_facts.train_examples() if self.data_facts is not None else None
            corpus = getattr(dataset, "corpus", None)
            if corpus is None:
                raise PtmError("supersense_objective with supersense_input needs sentence blocks with WordNet senses "
                               "(source: brown_spans), but the data module built other examples; remove "
                               "data.init_args.examples")
            vocab = self.word_senses.numel()
            table = vocabulary_senses(corpus.ids, corpus.senses, corpus.line_offsets,
                                      word_start_table(self.tokenizer, vocab), vocab)
            self.word_senses.copy_(table.to(self.word_senses.device))

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if self.supersense_input and "word_senses" not in checkpoint.get("state_dict", {}):
            raise PtmError("this SenseBERT checkpoint predates the vocabulary table M (word_senses): its sense-aware "
                           "input was read per word from the corpus; train it again with this version")
        super().on_load_checkpoint(checkpoint)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.supersense_input:  # export folds (W + S M) into the word table: the plain model needs no M
            checkpoint[CKPT_KEY]["fold_sense_input"] = {"senses": "word_senses",
                                                        "matrix": "heads.supersense.classifier.weight"}
            checkpoint[CKPT_KEY]["training_only"] = ["word_senses"]
            checkpoint[CKPT_KEY]["export_hparams"] = {"supersense_input": False}

    def _losses(self, batch: dict) -> dict[str, torch.Tensor]:
        out = masked_lm_forward(self.backbone, self.model_inputs(batch), batch["labels"],
                                sparse=self.sparse_prediction, hidden=bool(self.heads),
                                positions=batch.get("mlm_positions"))
        losses = {"mlm": out.loss}
        if "sentence" in self.heads:
            logits = self.heads["sentence"](out.hidden).float()
            losses["sentence"] = nn.functional.cross_entropy(logits, batch["sentence_labels"])
            losses["sentence_acc"] = (logits.argmax(-1) == batch["sentence_labels"]).float().mean()
        if "sbo" in self.heads:
            sbo = batch["sbo"]
            target = batch["labels"][sbo["rows"], sbo["pos"]]
            decoder = self.backbone.get_output_embeddings().weight
            logits = self.heads["sbo"](out.hidden, sbo["rows"], sbo["left"], sbo["right"], sbo["offset"],
                                       decoder).float()
            losses["sbo"] = nn.functional.cross_entropy(logits, target, ignore_index=IGNORE_INDEX)
        if "supersense" in self.heads:
            losses.update(self._supersense_losses(out.hidden, batch))
        return losses

    def _supersense_losses(self, hidden: torch.Tensor, batch: dict) -> dict[str, torch.Tensor]:
        """SenseBERT at the masked words that are in WordNet (their first sub-token carries A(w))."""
        if "senses" not in batch:
            raise PtmError("supersense_objective needs sentence blocks with WordNet senses (source: brown_spans), "
                           "but the data module built other examples; remove data.init_args.examples")
        where = (batch["labels"] != IGNORE_INDEX) & (batch["senses"] != 0)
        if not where.any():  # no masked WordNet word in the batch: a zero that keeps the graph
            zero = hidden.sum() * 0.0
            return {"supersense": zero}
        allowed = allowed_from_masks(batch["senses"][where])
        logits = self.heads["supersense"](hidden[where]).float()
        allowed_loss, regulariser = allowed_senses_losses(logits, allowed)
        correct = allowed.gather(1, logits.argmax(-1, keepdim=True)).float().mean()
        return {"supersense": allowed_loss + regulariser, "supersense_allowed": allowed_loss,
                "supersense_reg": regulariser, "supersense_acc": correct}

    def _total(self, losses: dict[str, torch.Tensor]) -> torch.Tensor:
        return sum(self.weights[k] * v for k, v in losses.items() if k in self.weights)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        batch = self._stage_view(batch)
        if "knowledge_views" in batch:
            self.log("train/knowledge_stage", float(self.knowledge_stage()), batch_size=len(batch["input_ids"]))
        losses = self._losses(batch)
        # train/* are logged per step, where Lightning does not weight by batch_size: the rows, not the targets
        # (counting those would read a GPU tensor back every step)
        rows = len(batch["input_ids"])
        return self.log_train_losses(self._total(losses), losses if len(losses) > 1 else {}, rows)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        batch = self._stage_view(batch)
        losses = self._losses(batch)
        weighted_mean_update(self.val_loss, losses["mlm"], self.count_targets(batch["labels"]))
        for name, value in losses.items():
            if name in self.val_parts:
                weighted_mean_update(self.val_parts[name], value, len(batch["input_ids"]))

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()  # val/loss = the MLM loss, val/ppl
        for name, metric in self.val_parts.items():
            if metric.update_called:
                self.log(f"val/{name}", metric.compute())
                metric.reset()

    def test_step(self, batch: dict, batch_idx: int) -> None:
        batch = self._stage_view(batch)
        weighted_mean_update(self.test_loss, self._losses(batch)["mlm"], self.count_targets(batch["labels"]))
