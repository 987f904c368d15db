"""Masked language modelling with its targets summed into one loss (``objectives.targets``).

BERT (Devlin et al. 2019 §3.1): 15 %, 80/10/10, + NSP.  RoBERTa (Liu et al. 2019 §4): dynamic
masking, no NSP.  ALBERT (Lan et al. 2020 §4.1): + SOP.  SpanBERT (Joshi et al. 2020 §3): span
masking + span boundary objective.  BERT-wwm: whole-word masking.  ERNIE (Baidu; Sun et al. 2019 §3.2):
knowledge (phrase / entity) masking.  SenseBERT (Levine et al. 2020 §3): + supersense prediction.  These are
recipes of one module: a list of targets.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torchmetrics import MeanMetric

from ptm_app.backbones.sense_input import sense_aware_embeddings, vocabulary_senses
from ptm_app.checkpoint_io.reading import CKPT_KEY
from ptm_app.data.collators import MLMCollator, word_start_table
from ptm_app.data.knowledge_spans import SPAN_FIELDS
from ptm_app.errors import PtmError
from ptm_app.objectives.heads import selected_positions
from ptm_app.objectives.lm_base import LanguageModelModule
from ptm_app.objectives.targets import Target, compose, known_record, target_records
from ptm_app.training.module import weighted_mean_update
from ptm_app.training.optim import OptimConfig


class MaskedLMModule(LanguageModelModule):
    """MLM pre-training on any ``AutoModelForMaskedLM`` backbone, with the targets a recipe lists.

    Args:
        backbone / backbone_config / optim / gradient_checkpointing: see ``PtmModule``.
        targets: the recipe's targets (``objectives.targets``), ``MaskedLM`` once (its settings are the masking
            recipe: ``mlm_probability``, ``masking``, ``static_masking`` ...) plus any of ``NextSentence``,
            ``SentenceOrder``, ``SpanBoundary``, ``Supersense`` (``knowledge.sensebert``), each with its ``weight`` in the summed loss.
            Default: ``[MaskedLM]``.  The data module builds the examples they need (``data.examples``).
    """

    model_class = "masked_lm"

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(), gradient_checkpointing: bool = False,
                 targets: Optional[list[Target]] = None):
        # kept as attributes, not only hparams: a subclass's CLI hparams hold just its own arguments
        self.mlm, self.targets, self.example_format = compose(targets)
        self.supersense_input = any(getattr(t, "sense_input", False) for t in self.targets)
        self.target_layers = None
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)
        self.weights = {t.name: t.weight for t in self.targets}
        self.val_parts = nn.ModuleDict({name: MeanMetric() for t in self.targets for name in t.metrics})

    @property
    def static_copies(self) -> Optional[int]:
        """With static masking, the k fixed draws per example (the data module draws NSP/SOP pairs the same way);
        None when every batch draws anew."""
        return self.mlm.static_copies

    def configure_model(self) -> None:
        super().configure_model()
        if self.target_layers is None:
            layers = {t.name: t.build(self.backbone) for t in self.targets}
            self.target_layers = nn.ModuleDict({name: m for name, m in layers.items() if m is not None})
        if self.supersense_input and not hasattr(self, "word_senses"):  # SenseBERT's M (``vocabulary_senses``)
            vocab = self.backbone.get_input_embeddings().num_embeddings
            self.register_buffer("word_senses", torch.zeros(vocab, dtype=torch.long, device=self.device))

    def make_collator(self, tokenizer, seed: int = 0) -> MLMCollator:
        if tokenizer.mask_token_id is None:
            raise PtmError("MaskedLMModule needs a tokenizer with a [MASK] token; use a BERT-style (wordpiece) tokenizer")
        vocab = min(len(tokenizer), self.backbone.config.vocab_size) if self.backbone is not None else len(tokenizer)
        word_start = word_start_table(tokenizer, vocab) if self.mlm.masking != "token" else None
        common = dict(pad_token_id=tokenizer.pad_token_id, mask_token_id=tokenizer.mask_token_id,
                      special_ids=tuple(i for i in tokenizer.all_special_ids if i < vocab), vocab_size=vocab,
                      seed=seed, word_start=word_start)
        if self.example_format & set(SPAN_FIELDS):  # sentence blocks with spans / senses to pad
            from ptm_app.data.knowledge_spans import KnowledgeMLMCollator

            return self.mlm.collator(KnowledgeMLMCollator, **common, knowledge_levels=self.mlm.knowledge_levels)
        return self.mlm.collator(MLMCollator, **common)

    def knowledge_stage(self) -> int:
        """ERNIE's current stage (0 word, 1 phrase, 2 entity): how many of ``knowledge_stages`` the run's
        progress (global step / total steps) has reached.  A function of the step, so a resumed run agrees."""
        trainer = self._trainer
        if trainer is None:
            return 0
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else trainer.estimated_stepping_batches
        progress = self.global_step / max(total, 1)
        return sum(progress >= f for f in self.mlm.knowledge_stages)

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
        if self.mlm.sparse_prediction and "knowledge_views" not in batch and "mlm_positions" not in batch:
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
                                                         self.target_layers["supersense"].classifier.weight)
        return inputs

    def on_fit_start(self) -> None:
        """SenseBERT's ``M`` from the training corpus's annotation, once (a resumed run restores it)."""
        super().on_fit_start()
        if self.supersense_input and not self.word_senses.any():
            dataset = self.data_facts.train_examples() if self.data_facts is not None else None
            corpus = getattr(dataset, "corpus", None)
            if corpus is None:
                raise PtmError("Supersense with sense_input needs sentence blocks with WordNet senses "
                               "(source: brown_spans), but the data module built other examples; remove "
                               "data.init_args.examples")
            vocab = self.word_senses.numel()
            table = vocabulary_senses(corpus.ids, corpus.senses, corpus.line_offsets,
                                      word_start_table(self.tokenizer, vocab), vocab)
            self.word_senses.copy_(table.to(self.word_senses.device))

    @classmethod
    def upgrade_checkpoint(cls, hparams: dict, state_dict: Optional[dict] = None) -> dict:
        """A checkpoint written before targets (``sentence_objective``, ``loss_weights`` ... and ``heads.*``
        weights): its hyper-parameters as ``targets`` (``legacy_targets``), its head weights renamed to
        ``target_layers.*`` in ``state_dict`` (in place)."""
        if state_dict is not None:
            sentence = hparams.get("sentence_objective") or "nsp"
            for key in [k for k in state_dict if k.startswith("heads.")]:
                part, rest = key[len("heads."):].split(".", 1)
                state_dict[f"target_layers.{sentence if part == 'sentence' else part}.{rest}"] = state_dict.pop(key)
        if "targets" not in _init_arguments(cls):
            return hparams
        hparams = legacy_targets(hparams)
        if isinstance(hparams.get("targets"), (list, tuple)):  # names read from a file: known targets only
            hparams["targets"] = [t if isinstance(t, Target) else known_record(t) for t in hparams["targets"]]
        return hparams

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        type(self).upgrade_checkpoint(checkpoint.get("hyper_parameters", {}), checkpoint.get("state_dict"))
        if self.supersense_input and "word_senses" not in checkpoint.get("state_dict", {}):
            raise PtmError("this SenseBERT checkpoint predates the vocabulary table M (word_senses): its sense-aware "
                           "input was read per word from the corpus; train it again with this version")
        super().on_load_checkpoint(checkpoint)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        hparams = checkpoint["hyper_parameters"]
        if "targets" in hparams:  # plain data (short class names), whatever form the constructor was given
            hparams["targets"] = target_records(self.targets)
        if self.supersense_input:  # export folds (W + S M) into the word table: the plain model needs no M
            checkpoint[CKPT_KEY]["fold_sense_input"] = {"senses": "word_senses",
                                                        "matrix": "target_layers.supersense.classifier.weight"}
            checkpoint[CKPT_KEY]["training_only"] = ["word_senses"]
            if "targets" in hparams:
                checkpoint[CKPT_KEY]["export_hparams"] = {"targets": [
                    {**r, "init_args": {**r["init_args"], "sense_input": False}} if r["class_path"] == "Supersense"
                    else r for r in hparams["targets"]]}

    def _losses(self, batch: dict) -> dict[str, torch.Tensor]:
        out = self.mlm.predict(self.backbone, self.model_inputs(batch), batch, hidden=bool(self.target_layers))
        losses = {}
        for target in self.targets:
            layers = self.target_layers[target.name] if target.name in self.target_layers else None
            losses.update(target.losses(layers, out, batch, self.backbone))
        return losses

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


def _init_arguments(cls) -> set[str]:
    import inspect

    return set(inspect.signature(cls.__init__).parameters)


# MaskedLMModule's arguments before targets (kept by checkpoints written then)
LEGACY_ARGUMENTS = ("mlm_probability", "mask_ratio", "random_ratio", "masking", "static_masking", "span_p",
                    "max_span_length", "sentence_objective", "span_boundary_objective", "loss_weights",
                    "sparse_prediction", "knowledge_levels", "knowledge_stages", "supersense_objective",
                    "supersense_input", "static_copies")
_MASKING = ("mlm_probability", "mask_ratio", "random_ratio", "masking", "span_p", "max_span_length",
            "sparse_prediction", "knowledge_levels", "knowledge_stages")


def legacy_targets(hparams: dict) -> dict:
    """``hparams`` with MaskedLMModule's arguments from before targets mapped onto ``targets`` (as plain records):
    the masking settings to ``MaskedLM``, ``sentence_objective`` to ``NextSentence`` / ``SentenceOrder``,
    ``span_boundary_objective`` to ``SpanBoundary``, ``supersense_objective`` (+ ``supersense_input``) to
    ``Supersense``, ``loss_weights`` to their weights.  Unchanged when it already names its targets."""
    old = {k: hparams[k] for k in LEGACY_ARGUMENTS if k in hparams}
    if not old or "targets" in hparams:
        return hparams
    weights = {"mlm": 1.0, "sentence": 1.0, "sbo": 1.0, "supersense": 1.0, **(old.get("loss_weights") or {})}
    copies = int(old.get("static_copies") or 1)
    mlm = {k: old[k] for k in _MASKING if k in old}
    if "knowledge_stages" in mlm:
        mlm["knowledge_stages"] = [float(f) for f in mlm["knowledge_stages"]]
    mlm["static_masking"] = (True if copies == 1 else copies) if old.get("static_masking") else False
    targets = [{"class_path": "MaskedLM", "init_args": {**mlm, "weight": float(weights["mlm"])}}]
    if old.get("sentence_objective"):
        name = {"nsp": "NextSentence", "sop": "SentenceOrder"}[old["sentence_objective"]]
        targets.append({"class_path": name, "init_args": {"weight": float(weights["sentence"])}})
    if old.get("span_boundary_objective"):
        targets.append({"class_path": "SpanBoundary", "init_args": {"weight": float(weights["sbo"])}})
    if old.get("supersense_objective"):
        targets.append({"class_path": "Supersense", "init_args": {"sense_input": bool(old.get("supersense_input")),
                                                                  "weight": float(weights["supersense"])}})
    return {**{k: v for k, v in hparams.items() if k not in LEGACY_ARGUMENTS}, "targets": targets}
