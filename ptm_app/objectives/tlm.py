"""Translation language modelling (XLM, Lample & Conneau 2019 §3.3).

BERT's masked LM (15 %, 80/10/10) over an aligned sentence pair concatenated, masking tokens of
both sentences, so a masked English word can be predicted from its French translation and vice
versa.  Every token carries a language embedding and the second sentence's positions restart at 0
(§3.3).  The backbone is transformers' XLM (``XLMWithLMHeadModel``), which takes ``langs`` and
``position_ids``; its LM-head loss is a plain cross-entropy over the unshifted labels, ignoring -100.

XLM's mix (§3, §5): ``objectives`` alternates CLM (§3.1: next-token prediction over a monolingual stream, the
model's attention made causal for that step, as XLM's ``causal=True`` forward), MLM (§3.2: BERT masking over a
monolingual stream, one language per block) and TLM, one objective per training step (step ``s`` trains
``objectives[s % len]``), in one run and one model with language embeddings.  The data is a
``multilingual.MultilingualDataModule`` with ``pairs``: every batch holds a monolingual part and a pair part.
"""
from __future__ import annotations

from typing import Any, Literal, Optional

import torch
from torchmetrics import MeanMetric

from ptm_app.data import IGNORE_INDEX
from ptm_app.data.collators import MixCollator
from ptm_app.errors import PtmError
from ptm_app.objectives.mlm import MaskedLMModule
from ptm_app.objectives.targets import MaskedLM
from ptm_app.training.module import weighted_mean_update
from ptm_app.training.optim import OptimConfig

Objective = Literal["clm", "mlm", "tlm"]


class TranslationLMModule(MaskedLMModule):
    """TLM pre-training on an XLM backbone (``model_type: xlm``) with a ``ParallelDataModule``.

    Args:
        backbone / backbone_config / optim / gradient_checkpointing: see ``PtmModule``.  From scratch,
            ``n_langs`` and ``lang2id``/``id2lang`` come from the data's languages and XLM's special-token
            indices (``pad``/``unk``/``mask``/``bos``/``eos``) from the tokenizer, unless ``backbone_config`` sets them.
        mlm_probability / mask_ratio / random_ratio: the masking recipe over both sentences (0.15 / 0.8 / 0.1).
        sparse_prediction: vocabulary logits only at the masked positions (default; see ``MaskedLMModule``).
        objectives: the objectives alternated step by step (XLM's mix: ``[clm, mlm, tlm]``; MLM+TLM: ``[mlm, tlm]``);
            ``[tlm]`` (default) trains TLM alone on a ``ParallelDataModule``; any other needs a
            ``MultilingualDataModule`` (with ``pairs`` when it lists ``tlm``).  Validation logs ``val/<objective>``
            for each and ``val/loss`` = the first masked objective's loss.
    """

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(), gradient_checkpointing: bool = False,
                 mlm_probability: float = 0.15, mask_ratio: float = 0.8, random_ratio: float = 0.1,
                 sparse_prediction: bool = True, objectives: Optional[list[Objective]] = None):
        self.language_ids: Optional[list[int]] = None  # data language index -> the backbone's language id
        self.objectives = list(objectives or ["tlm"])
        bad = [o for o in self.objectives if o not in ("clm", "mlm", "tlm")]
        if bad or len(set(self.objectives)) != len(self.objectives):
            raise PtmError(f"model.init_args.objectives={self.objectives}: list each of clm, mlm, tlm at most once")
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing,
                         targets=[MaskedLM(mlm_probability, mask_ratio, random_ratio,
                                           sparse_prediction=sparse_prediction)])
        if self.objectives != ["tlm"]:
            self.val_parts.update({f"val_{o}": MeanMetric() for o in self.objectives})

    def config_updates(self) -> dict[str, Any]:
        updates = super().config_updates()
        tok, config = self.tokenizer, self.hparams.backbone_config or {}
        if tok is None or self.hparams.backbone or config.get("model_type") != "xlm":
            return updates
        xlm = {"unk_index": tok.unk_token_id, "mask_index": tok.mask_token_id, "mask_token_id": tok.mask_token_id,
               "bos_token_id": tok.cls_token_id, "eos_token_id": tok.sep_token_id}
        languages = self.data_facts.languages if self.data_facts is not None else None
        if languages:
            xlm.update(n_langs=len(languages), lang2id={lang: i for i, lang in enumerate(languages)},
                       id2lang=dict(enumerate(languages)))
        return {**updates, **{k: v for k, v in xlm.items() if k not in config}}

    def configure_model(self) -> None:
        super().configure_model()
        if self.data_facts is not None:
            self.language_ids = self._language_ids(self.data_facts.languages)

    def _language_ids(self, languages: Optional[list[str]]) -> list[int]:
        """The backbone's language id (``config.lang2id``) of each data language, checked against ``n_langs``."""
        if not languages:
            raise PtmError("TranslationLMModule needs parallel sentence pairs; use "
                           "data.class_path: ParallelDataModule")
        config = self.backbone.config
        if config.model_type != "xlm":
            raise PtmError(f"TranslationLMModule needs an XLM backbone (backbone_config.model_type: xlm) for its "
                           f"language embeddings, not '{config.model_type}'")
        lang2id = getattr(config, "lang2id", None) or {lang: i for i, lang in enumerate(languages)}
        missing = [lang for lang in languages if lang not in lang2id]
        if missing:
            raise PtmError(f"the backbone has no language id for {missing} (it knows {sorted(lang2id)}); "
                           f"set data.init_args.source_lang / target_lang to those")
        ids = [int(lang2id[lang]) for lang in languages]
        if config.use_lang_emb and config.n_langs <= max(ids):
            raise PtmError(f"backbone_config.n_langs={config.n_langs} has no language embedding for {languages}; "
                           f"set n_langs: {max(ids) + 1}, or leave it out to take it from the data")
        return ids

    def make_collator(self, tokenizer, seed: int = 0) -> MixCollator:
        base = super().make_collator(tokenizer, seed)
        return MixCollator(**{f: getattr(base, f) for f in base.__dataclass_fields__})

    # -- XLM's mix of objectives -----------------------------------------------------------------------------
    def objective(self) -> str:
        """The objective of this training step (``objectives[global_step % len]``: a resumed run agrees)."""
        return self.objectives[self.global_step % len(self.objectives)]

    def _part(self, batch: dict, objective: str) -> dict:
        if "mono" not in batch:
            if objective != "tlm":
                raise PtmError(f"objective {objective} needs monolingual text: use data.class_path: "
                               f"MultilingualDataModule (with pairs for tlm)")
            return batch
        return batch["para" if objective == "tlm" else "mono"]

    def _objective_loss(self, batch: dict, objective: str) -> tuple[torch.Tensor, int]:
        """The loss of one objective on its part of the batch, and its number of predicted tokens."""
        part = self._part(batch, objective)
        if objective != "clm":
            return self._losses(part)["mlm"], self.count_targets(part["labels"])
        # CLM (§3.1): the unmasked stream (masked positions restored from the labels), each token predicting the
        # next; XLM's LM head takes unshifted labels, so they are shifted here; attention is causal for this call
        ids = torch.where(part["labels"] != IGNORE_INDEX, part["labels"], part["input_ids"])
        labels = torch.full_like(ids, IGNORE_INDEX)
        labels[:, :-1] = ids[:, 1:].masked_fill(part["attention_mask"][:, 1:] == 0, IGNORE_INDEX)
        inputs = {**self.model_inputs({**part, "input_ids": ids}), "attention_mask": part["attention_mask"]}
        transformer = self.backbone.transformer
        causal, transformer.causal = transformer.causal, True
        try:
            out = self.backbone(**inputs, labels=labels)
        finally:
            transformer.causal = causal
        return out.loss, int((labels != IGNORE_INDEX).sum())

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        if isinstance(batch, dict) and "mono" in batch:
            return {**batch, "mono": super().on_before_batch_transfer(batch["mono"], dataloader_idx),
                    "para": super().on_before_batch_transfer(batch["para"], dataloader_idx)}
        return super().on_before_batch_transfer(batch, dataloader_idx)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        if self.objectives == ["tlm"] and "mono" not in batch:
            return super().training_step(batch, batch_idx)
        objective = self.objective()
        loss, _ = self._objective_loss(batch, objective)
        rows = len(self._part(batch, objective)["input_ids"])
        # train/<objective> keeps its last value in later rows of the log: train/objective names this step's
        self.log("train/objective", float(self.objectives.index(objective)), batch_size=max(rows, 1))
        return self.log_train_losses(loss, {objective: loss}, rows)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        if self.objectives == ["tlm"] and "mono" not in batch:
            return super().validation_step(batch, batch_idx)
        first = next((o for o in self.objectives if o != "clm"), self.objectives[0])
        for objective in self.objectives:
            loss, n = self._objective_loss(batch, objective)
            weighted_mean_update(self.val_parts[f"val_{objective}"], loss, n)
            if objective == first:
                weighted_mean_update(self.val_loss, loss, n)

    def on_validation_epoch_end(self) -> None:
        if self.objectives == ["tlm"]:
            return super().on_validation_epoch_end()
        self._log_epoch("val", self.val_loss)
        for name, metric in self.val_parts.items():
            if metric.update_called:
                self.log(name.replace("val_", "val/", 1), metric.compute())
                metric.reset()

    def test_step(self, batch: dict, batch_idx: int) -> None:
        first = next((o for o in self.objectives if o != "clm"), self.objectives[0])
        loss, n = self._objective_loss(batch, first)
        weighted_mean_update(self.test_loss, loss, n)

    def model_inputs(self, batch: dict) -> dict:
        inputs = super().model_inputs(batch)
        if "langs" in batch:
            langs = batch["langs"]
            if self.language_ids is not None:
                langs = langs.new_tensor(self.language_ids)[langs]
            inputs.update(langs=langs, position_ids=batch["position_ids"])
        return inputs
