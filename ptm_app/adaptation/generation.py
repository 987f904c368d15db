"""Sequence-to-sequence generation (summarisation, headline generation): fine-tuning with teacher forcing,
evaluation by generating and scoring ROUGE-L and BLEU.

Three ways to get a generator, one setting (``architecture``):

* ``encoder_decoder``: a T5/BART-style ``AutoModelForSeq2SeqLM`` (our own ``Seq2SeqDenoisingModule`` runs, an
  exported directory, or a from-scratch config).  The encoder reads ``source [EOS]`` (the layout our T5/BART
  pre-training used), the decoder is teacher-forced on the target shifted right (``[start] target``) and the
  loss is the cross-entropy of ``target [EOS]`` (Raffel et al. 2020 §2.4; Lewis et al. 2020 §3.4).
* ``decoder``: a GPT-style causal LM "with a prompt": ``[BOS] source prompt target [EOS]`` is one sequence, the
  loss covers only ``target [EOS]`` (the source and prompt positions get -100), and generation continues the
  left-padded ``[BOS] source prompt``.  The default prompt is GPT-2's summarisation cue ``TL;DR:``
  (Radford et al. 2019 §3.6).
* ``bert2bert``: a warm-started ``EncoderDecoderModel`` whose encoder *and* decoder are initialised from the same
  pre-trained BERT-style encoder (e.g. the prepared MiniLM); the decoder gets causal self-attention and new,
  randomly initialised cross-attention layers (Rothe et al. 2020, "Leveraging Pre-trained Checkpoints for
  Sequence Generation Tasks", §2 and §3: BERT2BERT).  Source: ``[CLS] source [SEP]``; decoder: ``[CLS] target``
  → ``target [SEP]``.  With no pre-trained seq2seq model offline, this is the realistic pre-trained generator.

Translation (Qiu et al. 2020 §7.5) is an ``encoder_decoder`` with ``source_language`` / ``target_language``: as
mBART fine-tunes (Liu et al. 2020 §3.1, Fig. 1), the encoder reads ``source [EOS] <src>`` and the decoder starts
from ``<tgt>`` (the language tokens of ``data.language_corpora``), so a model pre-trained by
``configs/pretrain/mbart_dae_bible.yaml`` sees the layout of its pre-training.

By default the architecture follows the backbone: ``encoder_decoder`` if its config is an encoder–decoder, else
``decoder`` (a bidirectional encoder is refused there); ``bert2bert`` is always asked for explicitly.

Delta tuning (``delta:``, the ``Delta`` policy of ``adaptation.policies``) works for all three: LoRA (Hu et al. 2022 §4), IA3, prefix /
prompt / P-tuning through peft's ``SEQ_2_SEQ_LM`` and ``CAUSAL_LM`` models, the hand-written adapters and PALs
(``backbones.adapters``; PALs in a decoder are causal and generate without the KV cache), BitFit.  BERT2BERT's
new cross-attention and LM-head transform train with the delta (``train_head``): they start random.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import torch
from torch import nn

from ptm_app.adaptation.policies import fine_tuning_policies
from ptm_app.backbones.build import build_backbone, max_positions, model_dir
from ptm_app.checkpoint_io.reading import CKPT_KEY
from ptm_app.backbones.delta import DeltaSpec, as_delta_spec, prepended_tokens, transformers_model
from ptm_app.data import IGNORE_INDEX
from ptm_app.data.collators import pad
from ptm_app.data.contract import DataFacts
from ptm_app.data.language_corpora import language_token, language_token_id
from ptm_app.data.sources.references import load_error
from ptm_app.errors import PtmError
from ptm_app.objectives.seq2seq import seq2seq_token_ids
from ptm_app.task_kinds.metrics import GenerationScores
from ptm_app.training.callbacks import write_predictions
from ptm_app.training.module import PtmModule
from ptm_app.training.optim import OptimConfig

Architecture = Literal["encoder_decoder", "decoder", "bert2bert"]
ARCHITECTURE_MODEL_CLASS = {"encoder_decoder": "seq2seq_lm", "bert2bert": "seq2seq_lm", "decoder": "causal_lm"}
STAGES = ("val", "test")


def left_pad(seqs: list[torch.Tensor], value: int) -> torch.Tensor:
    """Pad on the left (batched generation continues every row from its last real token)."""
    return pad([s.flip(0) for s in seqs], value).flip(1)


def _ids(*parts) -> torch.Tensor:
    return torch.cat([torch.as_tensor(p, dtype=torch.long) for p in parts])


@dataclass
class EncoderDecoderCollator:
    """Encoder ``prefix source suffix``; decoder input ``[start] target`` (the labels shifted right); labels
    ``target [EOS]``, padded with -100."""

    pad_token_id: int
    eos_token_id: int
    decoder_start_token_id: int
    source_prefix: tuple[int, ...] = ()
    source_suffix: tuple[int, ...] = ()

    def __call__(self, examples: list[dict]) -> dict:
        sources = [_ids(self.source_prefix, e["source_ids"], self.source_suffix) for e in examples]
        labels = [_ids(e["target_ids"], [self.eos_token_id]) for e in examples]
        decoder = [_ids([self.decoder_start_token_id], e["target_ids"]) for e in examples]
        return {"input_ids": pad(sources, self.pad_token_id),
                "attention_mask": pad([torch.ones_like(s) for s in sources], 0),
                "decoder_input_ids": pad(decoder, self.pad_token_id),
                "decoder_attention_mask": pad([torch.ones_like(d) for d in decoder], 0),
                "labels": pad(labels, IGNORE_INDEX),
                "targets": [e["target"] for e in examples], "keys": [e["key"] for e in examples]}


@dataclass
class PromptCollator:
    """Decoder-only: ``prefix source prompt target [EOS]`` right-padded for teacher forcing, labels -100 on
    everything before the target; ``prompt_input_ids`` = ``prefix source prompt`` left-padded for generation."""

    pad_token_id: int
    eos_token_id: int
    prompt_ids: tuple[int, ...]
    prefix: tuple[int, ...] = ()

    def __call__(self, examples: list[dict]) -> dict:
        contexts = [_ids(self.prefix, e["source_ids"], self.prompt_ids) for e in examples]
        full = [_ids(c, e["target_ids"], [self.eos_token_id]) for c, e in zip(contexts, examples)]
        labels = [torch.cat([torch.full_like(c, IGNORE_INDEX), f[len(c):]]) for c, f in zip(contexts, full)]
        return {"input_ids": pad(full, self.pad_token_id), "attention_mask": pad([torch.ones_like(f) for f in full], 0),
                "labels": pad(labels, IGNORE_INDEX),
                "prompt_input_ids": left_pad(contexts, self.pad_token_id),
                "prompt_attention_mask": left_pad([torch.ones_like(c) for c in contexts], 0),
                "targets": [e["target"] for e in examples], "keys": [e["key"] for e in examples]}


def backbone_model_type(backbone: Optional[str], backbone_config: Optional[dict]) -> str:
    """The ``model_type`` of a pre-trained backbone's config, else of ``backbone_config``."""
    if backbone:
        import transformers

        where = model_dir(backbone)
        try:
            return transformers.AutoConfig.from_pretrained(where, trust_remote_code=False).model_type
        except (OSError, ValueError) as exc:
            raise load_error(backbone, exc) from None
    model_type = (backbone_config or {}).get("model_type")
    if model_type is None:
        raise PtmError("GenerationModule: give 'backbone' (a prepared name or directory) or 'backbone_config' "
                       "with a 'model_type'")
    return model_type


def resolve_architecture(architecture: Optional[str], backbone: Optional[str], backbone_config: Optional[dict]) -> str:
    """``architecture``, or ``encoder_decoder`` / ``decoder`` from the backbone's config; a bidirectional encoder
    (BERT, RoBERTa ...) is refused as a ``decoder``: it would see the target it has to predict."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES as MASKED
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES as SEQ2SEQ

    if architecture in ("encoder_decoder", "bert2bert"):
        return architecture
    model_type = backbone_model_type(backbone, backbone_config)
    if architecture is None and model_type in SEQ2SEQ:
        return "encoder_decoder"
    if model_type in MASKED and model_type not in SEQ2SEQ:
        raise PtmError(f"the backbone is a bidirectional encoder ({model_type}), not a decoder; warm-start an "
                       f"encoder-decoder from it with model.init_args.architecture: bert2bert")
    return "decoder"


class GenerationModule(PtmModule):
    """Fine-tune a generator on source → target pairs (``data.generation_data.Seq2SeqDataModule``).

    Logs ``train/loss``, ``val/loss`` (teacher-forced cross-entropy of the target tokens), and from generated
    text ``val/rougeL`` (ROUGE-L F-measure), ``val/bleu`` (sacreBLEU corpus BLEU-4) and ``val/chrf`` (sacreBLEU
    chrF2), likewise ``test/*`` (see
    ``task_kinds.metrics.GenerationScores``); the best checkpoint is the one with the highest ``val/rougeL``.
    ``predict`` writes ``predictions.jsonl``: id, source text, reference target and the generated text.

    Args:
        backbone: prepared name / local dir / exported run / ``.ckpt`` of the pre-trained model.
        backbone_config: config overrides, or a from-scratch config (``model_type: t5 | bart | gpt2 ...``).
        architecture: ``encoder_decoder`` | ``decoder`` | ``bert2bert`` (module docstring); default: from the
            backbone's config (``bert2bert`` must be named).
        prompt: text between source and target for a ``decoder`` (GPT-2's ``TL;DR:`` cue by default).
        num_beams: 1 = greedy decoding; more = beam search.
        max_new_tokens: longest generation; default ``data.max_target_length + 1`` (room for EOS).
        length_penalty / no_repeat_ngram_size: beam-search settings of transformers' ``generate``.
        bleu_lowercase: compute BLEU on lowercased text (an uncased tokenizer such as MiniLM's generates
            lowercase; ROUGE-L always lowercases; chrF is always cased).
        source_language / target_language: language codes (``en``, ``es``) of a translation model (both or
            neither; ``encoder_decoder`` only): the source ends with ``[EOS] [<source>]`` and the decoder starts
            from ``[<target>]``; the tokenizer must have both tokens (an mBART pre-training's has).
        delta: parameter-efficient tuning (``backbones.delta.DeltaSpec``): lora, ia3, prefix, prompt, ptuning,
            houlsby, pfeiffer, pals or bitfit; only the delta (+ BERT2BERT's new cross-attention) trains.
        delta_only: checkpoints then hold only the trained tensors; the frozen base is rebuilt from ``backbone``.
    """

    monitor = ("val/rougeL", "max")
    task_kind = "generation"  # its predictions (task_kinds.registry); loss and metrics are its own

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 optim: OptimConfig = OptimConfig(lr=5e-5), gradient_checkpointing: bool = False,
                 architecture: Optional[Architecture] = None, prompt: str = "\nTL;DR:", num_beams: int = 1,
                 max_new_tokens: Optional[int] = None, length_penalty: float = 1.0, no_repeat_ngram_size: int = 0,
                 bleu_lowercase: bool = True, delta: Optional[DeltaSpec] = None, delta_only: bool = True,
                 source_language: Optional[str] = None, target_language: Optional[str] = None):
        if architecture not in (None, *ARCHITECTURE_MODEL_CLASS):
            raise PtmError(f"architecture={architecture!r}: use one of {', '.join(ARCHITECTURE_MODEL_CLASS)}")
        if (source_language is None) != (target_language is None):
            raise PtmError("a translation model needs both model.init_args.source_language and target_language "
                           "(or neither)")
        for code in (source_language, target_language):
            if code is not None:
                language_token(code)
        if num_beams < 1 or (max_new_tokens is not None and max_new_tokens < 1):
            raise PtmError("num_beams and max_new_tokens must be at least 1")
        self.architecture = resolve_architecture(architecture, backbone, backbone_config)
        saved = (backbone_config or {}).get("model_type") == "encoder-decoder"  # a checkpoint's full config
        if self.architecture == "bert2bert" and not backbone and not saved:
            raise PtmError("architecture=bert2bert warm-starts from a pre-trained encoder: "
                           "set model.init_args.backbone (e.g. minilm)")
        self.model_class = ARCHITECTURE_MODEL_CLASS[self.architecture]
        if source_language is not None and self.architecture != "encoder_decoder":
            raise PtmError(f"source_language/target_language take an encoder-decoder (mBART's layout); this "
                           f"model is a {self.architecture}")
        spec = as_delta_spec(delta)
        if self.architecture == "bert2bert" and spec is not None and not spec.train_head:
            raise PtmError("architecture=bert2bert: the decoder's cross-attention and LM head start random and must "
                           "train; set delta.train_head: true")
        self._predicted: list[tuple] = []
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)
        self.scores = nn.ModuleDict({stage: GenerationScores(bleu_lowercase) for stage in STAGES})
        self._scored = dict.fromkeys(STAGES, 0)

    def make_policies(self) -> list:
        return fine_tuning_policies(self.hparams.delta, self.hparams.delta_only)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.hparams.source_language is not None:  # the export keeps the languages (export.save_module_weights)
            checkpoint[CKPT_KEY]["module_settings"] = True

    # -- building -----------------------------------------------------------------------------
    def can_build(self) -> bool:  # a saved EncoderDecoderModel config has no top-level vocab_size
        return super().can_build() or (self.hparams.backbone_config or {}).get("model_type") == "encoder-decoder"

    def config_updates(self) -> dict:
        updates = super().config_updates()
        if self.tokenizer is not None and not self.hparams.backbone and self.architecture == "encoder_decoder":
            updates.update(seq2seq_token_ids(self.tokenizer, self.hparams.backbone_config.get("model_type")))
        return updates

    def build_model(self):
        if self.architecture != "bert2bert" or not self.hparams.backbone:
            return build_backbone(self.model_class, self.hparams.backbone, self.hparams.backbone_config,
                                  **self.config_updates())
        import transformers
        from transformers import EncoderDecoderModel

        where = model_dir(self.hparams.backbone)
        overrides = {f"{side}_{k}": v for k, v in (self.hparams.backbone_config or {}).items() for side in
                     ("encoder", "decoder") if k != "model_type"}
        try:
            if getattr(transformers.AutoConfig.from_pretrained(where, trust_remote_code=False), "auto_map", None):
                raise ValueError("its config names custom code (auto_map; trust_remote_code is off)")
            model = EncoderDecoderModel.from_encoder_decoder_pretrained(where, where, **overrides)
        except (OSError, ValueError) as exc:
            raise load_error(self.hparams.backbone, exc) from None
        tok = self.tokenizer
        if tok is None:  # built before the data module: the encoder's own tokenizer has its special ids
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(where, trust_remote_code=False)
        if tok.cls_token_id is None or tok.sep_token_id is None:
            raise PtmError("architecture=bert2bert needs a BERT-style tokenizer ([CLS]/[SEP]); use the encoder's own "
                           "(data.init_args.tokenizer.pretrained: the same as model.init_args.backbone)")
        ids = seq2seq_token_ids(tok, "bert")  # Rothe et al.: [CLS] starts the decoder, [SEP] ends the target
        for name, value in {**ids, "pad_token_id": tok.pad_token_id}.items():
            setattr(model.config, name, value)
            setattr(model.generation_config, name, value)
        return model

    def token_ids(self) -> dict[str, int]:
        """pad, EOS and decoder start ids from the backbone's config (falling back on the tokenizer's)."""
        cfg, tok = transformers_model(self.backbone).config, self.tokenizer
        decoder_cfg = getattr(cfg, "decoder", cfg)
        pick = lambda *values: next((v for v in values if v is not None), None)  # noqa: E731
        eos = pick(getattr(cfg, "eos_token_id", None), getattr(decoder_cfg, "eos_token_id", None),
                   tok.sep_token_id if self.architecture != "decoder" else None, tok.eos_token_id)
        pad_id = pick(getattr(cfg, "pad_token_id", None), tok.pad_token_id, eos)
        start = pick(getattr(cfg, "decoder_start_token_id", None), getattr(cfg, "bos_token_id", None), tok.cls_token_id,
                     tok.bos_token_id)
        if isinstance(eos, list):
            eos = eos[0]
        if self.hparams.target_language is not None:  # mBART: the decoder starts from the target language's token
            start = language_token_id(tok, self.hparams.target_language)
        if eos is None or (self.architecture != "decoder" and start is None):
            raise PtmError("the backbone and tokenizer define no end-of-sequence / decoder start token; "
                           "use a tokenizer with [SEP] or an EOS token")
        return {"pad_token_id": pad_id, "eos_token_id": eos, "decoder_start_token_id": start}

    def check_lengths(self, facts: DataFacts) -> None:
        """Refuse source/target lengths (+ specials, prompt, generated tokens) the position embeddings cannot hold."""
        src, tgt = facts.max_source_length, facts.max_target_length
        if src is None or tgt is None:
            return
        model = transformers_model(self.backbone)
        limit = max_positions(model.encoder if self.architecture == "bert2bert" else model)
        if limit is None:
            return
        new = self.hparams.max_new_tokens or tgt + 1
        if self.architecture == "decoder":
            prompt = len(self.tokenizer(self.hparams.prompt, add_special_tokens=False)["input_ids"])
            need = 1 + src + prompt + max(tgt + 1, new)
            what = f"1 + max_source_length={src} + {prompt} prompt tokens + max(max_target_length + 1, max_new_tokens)"
        else:
            need, what = max(src + 2, tgt + 1, new + 1), f"max_source_length={src} + 2 / max_target_length={tgt} + 1"
        if self.virtual_positions():
            need, what = need + self.virtual_positions(), f"{what} + {self.virtual_positions()} virtual tokens"
        if need > limit:
            raise PtmError(f"{what} = {need} positions, more than the backbone allows ({limit}); lower "
                           f"data.init_args.max_source_length / max_target_length (or model.init_args.max_new_tokens)")

    def make_collator(self, tokenizer, seed: int = 0):
        ids = self.token_ids()
        if self.architecture == "decoder":
            prompt = tuple(tokenizer(self.hparams.prompt, add_special_tokens=False)["input_ids"])
            bos = tokenizer.bos_token_id
            return PromptCollator(pad_token_id=ids["pad_token_id"], eos_token_id=ids["eos_token_id"], prompt_ids=prompt,
                                  prefix=() if bos is None else (bos,))
        if self.architecture == "bert2bert":
            prefix, suffix = (tokenizer.cls_token_id,), (tokenizer.sep_token_id,)
        else:  # our T5/BART pre-training's layout: content + EOS (+ the source language's token: mBART)
            prefix, suffix = (), (ids["eos_token_id"],)
            if self.hparams.source_language is not None:
                suffix += (language_token_id(tokenizer, self.hparams.source_language),)
        return EncoderDecoderCollator(pad_token_id=ids["pad_token_id"], eos_token_id=ids["eos_token_id"],
                                      decoder_start_token_id=ids["decoder_start_token_id"], source_prefix=prefix,
                                      source_suffix=suffix)

    # -- steps --------------------------------------------------------------------------------
    def forward(self, batch: dict) -> torch.Tensor:
        """Teacher-forced logits, aligned with ``batch["labels"]``."""
        if self.architecture == "decoder":  # without peft's virtual prompt positions
            logits = self.backbone(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            return logits[:, prepended_tokens(self.backbone):]
        return self.backbone(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                             decoder_input_ids=batch["decoder_input_ids"],
                             decoder_attention_mask=batch["decoder_attention_mask"]).logits

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over target tokens; a causal LM predicts position t+1 from position t."""
        if self.architecture == "decoder":
            logits, labels = logits[:, :-1], labels[:, 1:]
        return nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self.loss(self(batch), batch["labels"])
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch["labels"]))
        return loss

    @torch.no_grad()
    def generate(self, batch: dict, target_length: Optional[int] = None) -> list[str]:
        """Greedy or beam-search generations, decoded without special tokens; at most ``max_new_tokens``, else
        the data's ``max_target_length`` + 1 (``target_length`` when no data module is connected)."""
        hp, ids = self.hparams, self.token_ids()
        if self.data_facts is not None:
            target_length = self.data_facts.max_target_length
        new = hp.max_new_tokens or ((target_length or 31) + 1)
        settings = dict(num_beams=hp.num_beams, max_new_tokens=new, do_sample=False, pad_token_id=ids["pad_token_id"],
                        eos_token_id=ids["eos_token_id"])
        if hp.num_beams > 1:
            settings["length_penalty"] = hp.length_penalty
        if hp.no_repeat_ngram_size:
            settings["no_repeat_ngram_size"] = hp.no_repeat_ngram_size
        if self.delta is not None and self.delta.method == "pals":  # causal PALs keep no KV cache
            settings["use_cache"] = False
        if self.architecture == "decoder":
            prompt = batch["prompt_input_ids"]
            out = self.backbone.generate(input_ids=prompt, attention_mask=batch["prompt_attention_mask"], **settings)
            out = out[:, prompt.shape[1]:]
        else:
            out = self.backbone.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                         decoder_start_token_id=ids["decoder_start_token_id"], **settings)
        return [text.strip() for text in self.tokenizer.batch_decode(out, skip_special_tokens=True)]

    def _eval_step(self, stage: str, batch: dict) -> None:
        n = len(batch["labels"])
        self.log(f"{stage}/loss", self.loss(self(batch), batch["labels"]), batch_size=n)
        self.scores[stage].update(self.generate(batch), batch["targets"])
        self._scored[stage] += n

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step("val", batch)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step("test", batch)

    def _log_scores(self, stage: str) -> None:
        if self._scored[stage]:
            scores = self.scores[stage].compute()
            self.log_dict({f"{stage}/{k}": v for k, v in scores.items()}, prog_bar=(stage == "val"))
        self.scores[stage].reset()
        self._scored[stage] = 0

    def on_validation_epoch_end(self) -> None:
        self._log_scores("val")

    def on_test_epoch_end(self) -> None:
        self._log_scores("test")

    def on_predict_epoch_start(self) -> None:
        self._predicted = []

    def predict_step(self, batch: dict, batch_idx: int) -> dict:
        generated = self.generate(batch)
        self._predicted.extend(zip(batch["keys"], generated))
        return {"keys": batch["keys"], "generated": generated}

    def on_predict_epoch_end(self) -> None:
        records = self.data_facts.records("test")
        rows = []
        for key, text in self._predicted:
            i = key[1] if isinstance(key, (tuple, list)) else int(key)
            rows.append({"id": records["ids"][i], "text": records["texts"][i], "target": records["targets"][i],
                         "generated": text})
        write_predictions(self.trainer, rows)
