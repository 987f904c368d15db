"""Translation language modelling (XLM, Lample & Conneau 2019 §3.3).

BERT's masked LM (15 %, 80/10/10) over an aligned sentence pair concatenated, masking tokens of
both sentences, so a masked English word can be predicted from its French translation and vice
versa.  Every token carries a language embedding and the second sentence's positions restart at 0
(§3.3).  The backbone is transformers' XLM (``XLMWithLMHeadModel``), which takes ``langs`` and
``position_ids``; its LM-head loss is a plain cross-entropy over the unshifted labels, ignoring -100.
"""
from __future__ import annotations

from typing import Any, Optional

from ptm_app.data.collators import TLMCollator
from ptm_app.errors import PtmError
from ptm_app.objectives.mlm import MaskedLMModule
from ptm_app.objectives.targets import MaskedLM
from ptm_app.training.optim import OptimConfig


class TranslationLMModule(MaskedLMModule):
    """TLM pre-training on an XLM backbone (``model_type: xlm``) with a ``ParallelDataModule``.

    Args:
        backbone / backbone_config / optim / gradient_checkpointing: see ``PtmModule``.  From scratch,
            ``n_langs`` and ``lang2id``/``id2lang`` come from the data's languages and XLM's special-token
            indices (``pad``/``unk``/``mask``/``bos``/``eos``) from the tokenizer, unless ``backbone_config`` sets them.
        mlm_probability / mask_ratio / random_ratio: the masking recipe over both sentences (0.15 / 0.8 / 0.1).
        sparse_prediction: vocabulary logits only at the masked positions (default; see ``MaskedLMModule``).
    """

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(), gradient_checkpointing: bool = False,
                 mlm_probability: float = 0.15, mask_ratio: float = 0.8, random_ratio: float = 0.1,
                 sparse_prediction: bool = True):
        self.language_ids: Optional[list[int]] = None  # data language index -> the backbone's language id
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing,
                         targets=[MaskedLM(mlm_probability, mask_ratio, random_ratio,
                                           sparse_prediction=sparse_prediction)])

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
                           "data.class_path: ptm_app.data.parallel.ParallelDataModule")
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

    def make_collator(self, tokenizer, seed: int = 0) -> TLMCollator:
        base = super().make_collator(tokenizer, seed)
        return TLMCollator(**{f: getattr(base, f) for f in base.__dataclass_fields__})

    def model_inputs(self, batch: dict) -> dict:
        inputs = super().model_inputs(batch)
        if "langs" in batch:
            langs = batch["langs"]
            if self.language_ids is not None:
                langs = langs.new_tensor(self.language_ids)[langs]
            inputs.update(langs=langs, position_ids=batch["position_ids"])
        return inputs
