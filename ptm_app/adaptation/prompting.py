"""Prompt-based learning (survey §5.7): classification recast as the pre-training task.

* ``PromptClassifierModule``: PET (Schick & Schütze 2021 §3).  A pattern turns an input into a cloze question with
  one [MASK]; a verbalizer maps each label to words; a label's score is the masked LM's logit of its words at the
  mask, and training minimises the cross-entropy of the softmax over the label scores (PET's L_CE).  Evaluated
  without training it is zero-shot; ``fit`` on a few examples is few-shot PET.  Optionally N trainable soft prompt
  vectors go before the input, the masked LM frozen or not: peft's prompt tuning, the ``prompt`` delta of
  ``backbones.delta`` (Lester et al. 2021 §2), the one soft-prompt implementation.
* ``InContextEvalModule``: in-context learning (GPT-3, Brown et al. 2020 §2).  k training examples with their
  labels precede the query; each candidate label is scored by the causal LM's log-likelihood of its words (per
  token by default, §2.4), and no gradient step is ever taken.
"""
from __future__ import annotations

from typing import Literal, Optional, Union

import torch
from lightning.pytorch.utilities import rank_zero_warn

from ptm_app.backbones.build import max_positions
from ptm_app.data.collators import ClozeCollator, InContextCollator
from ptm_app.data.prompt_data import PromptDataset
from ptm_app.data.prompts import PromptEncoder, Template, Verbalizer
from ptm_app.errors import PtmError
from ptm_app.adaptation.policies import Delta
from ptm_app.adaptation.task_module import TaskModule
from ptm_app.backbones.delta import DeltaSpec, transformers_model
from ptm_app.objectives.heads import logits_at
from ptm_app.training.optim import OptimConfig

NO_FIT = ("InContextEvalModule takes no gradient steps (in-context learning, Brown et al. 2020 §2): "
          "run 'main.py validate' or 'main.py test' instead of fit")


def label_scores(mask_logits: torch.Tensor, word_ids: list[list[int]],
                 reduce: Literal["mean", "max"] = "mean") -> torch.Tensor:
    """PET's s(l|x) (§3): a label's score is the mean (PET) or max of its words' MLM logits [B, V]; → [B, C]."""
    width = max(map(len, word_ids))
    ids = torch.tensor([w + [w[0]] * (width - len(w)) for w in word_ids], device=mask_logits.device)
    real = torch.tensor([[i < len(w) for i in range(width)] for w in word_ids], device=mask_logits.device)
    picked = mask_logits[:, ids]  # [B, C, W]
    if reduce == "max":
        return picked.masked_fill(~real, float("-inf")).amax(-1)
    return (picked * real).sum(-1) / real.sum(-1)


class _LabelScoringModule(TaskModule):
    """Shared: the label set, ``val``/``test`` accuracy and macro-F1 over label scores (the ``sequence`` task type,
    as ``SequenceClassificationModule``), cross-entropy as ``*/loss``, predictions with label probabilities."""

    task_kind = "sequence"
    predicts_rows = False  # its predict_step scores verbalizers: predict --config, not predict --text

    def __init__(self, backbone: Optional[str], backbone_config: Optional[dict], optim: OptimConfig = OptimConfig(),
                 gradient_checkpointing: bool = False):
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)

    def can_build(self) -> bool:
        return super().can_build() and (self.hparams.labels is not None or self.hparams.verbalizer is not None)

    @property
    def labels(self) -> list[str]:
        """``labels``; else the data module's label set (then kept in hparams); else the verbalizer's labels."""
        if self.hparams.labels is None:
            labels = self.data_facts.labels() if self.data_facts is not None else None
            if labels is not None:
                self.hparams.labels = labels
            elif self.hparams.verbalizer is not None:
                return list(self.hparams.verbalizer)
            else:
                raise PtmError(f"{type(self).__name__} needs labels: set model.init_args.labels or verbalizer, "
                               f"or use a PromptDataModule")
        return list(self.hparams.labels)

    def task_labels(self) -> list[str]:
        return self.labels

    def predict_step(self, batch: dict, batch_idx: int) -> dict:
        """Every label's probability (``training.callbacks.PredictionWriter`` writes the rows)."""
        return {"keys": batch["keys"], "probs": torch.softmax(self(batch).float(), dim=-1).cpu()}


class PromptClassifierModule(_LabelScoringModule):
    """PET cloze classification over a masked LM (Schick & Schütze 2021 §3); zero-shot with ``validate``/``test``,
    few-shot with ``fit`` (a ``PromptDataModule`` with ``limit_train``).  Logs ``val/acc``, ``val/f1_macro``.

    Args:
        backbone / backbone_config: the masked LM (``AutoModelForMaskedLM``), pretrained or from a config.
        labels: the label names in order; by default the data module's.
        template: the pattern, with ``{text}`` (optionally ``{text_pair}``) and one ``{mask}``.
        verbalizer: label → one word or a list of words, each one token; None = the labels' own names.
        scoring: a label's score from its words' logits at the mask: ``mean`` (PET) or ``max``.
        soft_prompt_tokens: N trainable prompt vectors, initialised from sampled vocabulary embeddings (prompt
            tuning, Lester et al. 2021 §2, §3.2): the ``prompt`` delta (``delta: {method: prompt,
            num_virtual_tokens: N, prompt_init: sample_vocab}``), peft's, which puts them before the whole input,
            [CLS] included (Lester et al. prepend too); the [MASK] logit is read N positions later.
        freeze_backbone: train the soft prompt only; the masked LM, its head included, stays bit-identical, and
            checkpoints of a pretrained backbone hold just the prompt.  Without it the whole masked LM trains with
            the prompt, and checkpoints and exports keep both.
    """

    model_class = "masked_lm"

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 labels: Optional[list[str]] = None, template: str = "{text} It was {mask}.",
                 verbalizer: Optional[dict[str, Union[str, list[str]]]] = None,
                 scoring: Literal["mean", "max"] = "mean", soft_prompt_tokens: int = 0, freeze_backbone: bool = False,
                 optim: OptimConfig = OptimConfig(lr=1e-5), gradient_checkpointing: bool = False):
        if soft_prompt_tokens < 0:
            raise PtmError(f"soft_prompt_tokens must be >= 0 (got {soft_prompt_tokens})")
        if freeze_backbone and not soft_prompt_tokens:
            raise PtmError("freeze_backbone: true leaves nothing to train; set soft_prompt_tokens > 0 "
                           "(prompt tuning) or freeze_backbone: false")
        pattern = Template(template)
        super().__init__(backbone, backbone_config, optim, gradient_checkpointing)
        self.template = pattern
        self._words: Optional[tuple] = None
        self._fresh_head: list[str] = []  # MLM head weights the backbone's files did not have
        self._restored = self._warned_fresh_head = False

    def make_policies(self) -> list:
        """``soft_prompt_tokens: N`` is the ``prompt`` delta on the masked LM (peft's FEATURE_EXTRACTION wrapper keeps
        its MLM head: logits for the virtual positions and the input)."""
        n = self.hparams.soft_prompt_tokens
        if not n:
            return []
        frozen = self.hparams.freeze_backbone
        spec = DeltaSpec(method="prompt", num_virtual_tokens=n, prompt_init="sample_vocab", train_head=not frozen)
        return [Delta(spec, delta_only=frozen, task_type="FEATURE_EXTRACTION")]

    @property
    def delta(self) -> Optional[DeltaSpec]:
        """The soft prompt's delta spec (None without one)."""
        policy = self.policy(Delta)
        return policy.spec if policy is not None else None

    def style(self) -> str:
        n = self.hparams.soft_prompt_tokens
        return "PET cloze" + (f" + {n} soft prompt tokens" if n else "") + (" (frozen MLM)" if self.hparams.freeze_backbone else "")

    def configure_model(self) -> None:
        built_here = self.backbone is None
        super().configure_model()
        if not built_here:
            return
        model = transformers_model(self.backbone)
        if not self._restored:
            prefix = f"{model.base_model_prefix}."
            self._fresh_head = [k for k in getattr(model, "ptm_missing_keys", ()) if not k.startswith(prefix)]
        if self.hparams.soft_prompt_tokens and not self.hparams.freeze_backbone:
            model.requires_grad_(True)  # the prompt delta froze it: prompt tuning plus fine-tuning of the masked LM

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if self.tokenizer is not None:
            self.label_words()  # a bad verbalizer fails now, not mid-epoch

    # -- a masked LM without a trained head (e.g. a sentence-transformers checkpoint) --------------------
    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "soft_prompt" in checkpoint.get("state_dict", {}):
            raise PtmError("this checkpoint holds PromptClassifierModule's former soft prompt (vectors after [CLS]); "
                           "soft_prompt_tokens is now peft's prompt tuning (vectors before [CLS]), which cannot reuse "
                           "them: train the prompt again (main.py fit with the same config)")
        super().on_load_checkpoint(checkpoint)
        self._restored, self._fresh_head = True, []  # the checkpoint brings its own (trained) head

    def fresh_head_warning(self) -> Optional[str]:
        """Why cloze scores will be near chance, when the MLM head loaded freshly initialised and nothing trains it."""
        fresh = self._fresh_head
        if not fresh:
            return None
        return (f"{type(self).__name__}: backbone {self.hparams.backbone!r} has no trained MLM head "
                f"({len(fresh)} tensors, e.g. {fresh[0]}, were freshly initialised), so its cloze scores are near "
                f"chance; train it (few-shot fit with freeze_backbone: false) or use a masked LM pre-trained "
                f"with its head")

    def on_train_start(self) -> None:
        if not self.hparams.freeze_backbone:
            self._fresh_head = []  # fine-tuning trains the head with the rest
        self._warn_fresh_head()

    def on_validation_start(self) -> None:
        self._warn_fresh_head()

    def on_test_start(self) -> None:
        self._warn_fresh_head()

    def _warn_fresh_head(self) -> None:
        message = self.fresh_head_warning()
        if message is not None and not self._warned_fresh_head:
            self._warned_fresh_head = True
            rank_zero_warn(message)

    def label_words(self) -> list[list[int]]:
        """The verbalizer's token ids per label, for the current labels and tokenizer."""
        if self.tokenizer is None:
            raise PtmError("PromptClassifierModule has no tokenizer; use it with a PromptDataModule")
        key = (id(self.tokenizer), tuple(self.labels))
        if self._words is None or self._words[0] != key:
            verbalizer = Verbalizer.of(self.hparams.verbalizer, self.labels)
            self._words = key, verbalizer.token_ids(self.tokenizer, self.labels, self.template.slot_space)
        return self._words[1]

    def make_collator(self, tokenizer, seed: int = 0) -> ClozeCollator:
        if tokenizer.mask_token_id is None:
            raise PtmError("PromptClassifierModule needs a masked LM's tokenizer (it has no mask token)")
        max_length = ((self.data_facts.max_length if self.data_facts is not None else None)
                      or max_positions(self.backbone) - self.virtual_positions())
        return ClozeCollator(pad_token_id=tokenizer.pad_token_id, encoder=PromptEncoder(self.template, tokenizer),
                             max_length=max_length)

    def model_inputs(self, batch: dict) -> dict:
        """Token inputs; peft's prompt tuning takes no segment ids (it would drop them with a warning per call)."""
        inputs = super().model_inputs(batch)
        if self.virtual_positions():
            inputs.pop("token_type_ids", None)
        return inputs

    def forward(self, batch: dict) -> torch.Tensor:
        """Label scores [B, C] from the MLM logits at each row's mask (after the soft prompt's positions), the
        vocabulary projection computed at the mask only."""
        at = batch["mask_positions"] + self.virtual_positions()
        mask_logits = logits_at(self.backbone, self.model_inputs(batch), at).float()
        return label_scores(mask_logits, self.label_words(), self.hparams.scoring)


class InContextEvalModule(_LabelScoringModule):
    """In-context learning with a causal LM (GPT-3, Brown et al. 2020 §2): ``validate``/``test`` only, never
    ``fit``.  Logs ``test/acc``, ``test/f1_macro`` (``val/*`` with ``validate``) and ``*/shots`` (demonstrations
    that fit the context).  Use with a ``PromptDataModule``: its training split is the demonstration pool.

    Args:
        backbone / backbone_config: the causal LM (``AutoModelForCausalLM``).
        labels: the label names in order; by default the data module's.
        template: one demonstration, with ``{text}`` (optionally ``{text_pair}``) and one ``{label}``; the query is
            the template up to ``{label}``.
        verbalizer: label → the text that stands for it (any number of tokens); None = the labels' own names.
        instruction: text before the demonstrations (GPT-3's task description; with ``k_shot: 0``, zero-shot).
        k_shot: demonstrations per evaluated example.
        seed: seeds each example's draw of demonstrations.
        length_normalize: score a label by the mean log-probability of its tokens (GPT-3 §2.4), not the sum.
        calibrate: contextual calibration (Zhao et al. 2021 §5): the label distribution after the same
            demonstrations with a content-free query (``content_free`` in every field) estimates the prompt's bias
            towards some labels, and the example's label probabilities are divided by it (W = diag(p_cf)^-1, b = 0).
        content_free: the content-free text ("N/A", Zhao et al. 2021 §5).
    """

    model_class = "causal_lm"

    def __init__(self, backbone: Optional[str] = None, backbone_config: Optional[dict] = None,
                 labels: Optional[list[str]] = None, template: str = "{text}\nLabel: {label}\n\n",
                 verbalizer: Optional[dict[str, str]] = None, instruction: str = "", k_shot: int = 4, seed: int = 0,
                 length_normalize: bool = True, calibrate: bool = False, content_free: str = "N/A"):
        self.template = Template(template, slot="label")
        if k_shot < 0:
            raise PtmError(f"k_shot must be >= 0 (got {k_shot})")
        super().__init__(backbone, backbone_config)

    def style(self) -> str:
        return f"in-context {self.hparams.k_shot}-shot" + (", calibrated" if self.hparams.calibrate else "")

    def configure_model(self) -> None:
        self.hparams.setdefault("gradient_checkpointing", False)  # not an argument: nothing trains
        super().configure_model()

    def setup(self, stage: str) -> None:
        if stage == "fit":
            raise PtmError(NO_FIT)
        super().setup(stage)

    def training_step(self, batch: dict, batch_idx: int) -> None:
        """Lightning requires one for ``fit``, which ``setup`` refuses before any step."""
        raise PtmError(NO_FIT)

    def answer_ids(self, tokenizer) -> list[list[int]]:
        """Each label's verbalised tokens, with the template's space before the slot."""
        words = self.hparams.verbalizer or {label: label for label in self.labels}
        if set(words) != set(self.labels):
            raise PtmError(f"verbalizer labels {sorted(words)} differ from the task's labels {sorted(self.labels)}; "
                           f"give every label its text (model.init_args.verbalizer)")
        answers = [tokenizer(self.template.slot_space + words[label], add_special_tokens=False)["input_ids"]
                   for label in self.labels]
        empty = [label for label, ids in zip(self.labels, answers) if not ids]
        if empty:
            raise PtmError(f"verbalizer: label '{empty[0]}' stands for no tokens; give it a non-empty text")
        return answers

    def build_collator(self, tokenizer, pool: PromptDataset) -> InContextCollator:
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        instruction = tokenizer(self.hparams.instruction, add_special_tokens=False)["input_ids"]
        content_free = None
        if self.hparams.calibrate:
            content_free = tokenizer(self.hparams.content_free, add_special_tokens=False)["input_ids"]
            if not content_free:
                raise PtmError("model.init_args.content_free is empty; give calibration a text such as 'N/A'")
        return InContextCollator(pad_token_id=pad_id, encoder=PromptEncoder(self.template, tokenizer), pool=pool,
                                 answers=self.answer_ids(tokenizer), k_shot=self.hparams.k_shot,
                                 seed=self.hparams.seed, instruction=instruction,
                                 max_length=max_positions(self.backbone), content_free=content_free)

    def make_collator(self, tokenizer, seed: int = 0) -> InContextCollator:
        pool = self.data_facts.train_examples() if self.data_facts is not None else None
        if not isinstance(pool, PromptDataset):
            raise PtmError("InContextEvalModule draws demonstrations from the training split of a PromptDataModule; "
                           "use data.class_path: PromptDataModule")
        return self.build_collator(tokenizer, pool)

    def forward(self, batch: dict) -> torch.Tensor:
        """Label scores [B, C]: the log-likelihood of each label's tokens after the prompt (mean if normalised);
        calibrated, the label log-probabilities minus those after the content-free query."""
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
        if "answer_ids" in batch:  # one-token labels: one row per query, the next-token distribution at the slot
            logits = self.backbone(**inputs, use_cache=False, logits_to_keep=1).logits[:, -1]
            scores = torch.log_softmax(logits.float(), -1)[:, batch["answer_ids"]]
        else:
            lengths = batch["answer_lengths"]
            k = int(lengths.max())
            logits = self.backbone(**inputs, use_cache=False, logits_to_keep=k + 1).logits
            logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, batch["input_ids"][:, -k:, None])
            is_answer = torch.arange(k, device=logp.device) >= (k - lengths)[:, None]
            scores = torch.where(is_answer, logp.squeeze(-1), 0.0).sum(-1)
            if self.hparams.length_normalize:
                scores = scores / lengths
        scores = scores.reshape(len(batch["keys"]), -1, len(self.labels))  # [B, queries, C]
        if scores.shape[1] == 2:  # p / p_cf over the labels, in log space (Zhao et al. 2021 §5)
            return torch.log_softmax(scores[:, 0], -1) - torch.log_softmax(scores[:, 1], -1)
        return scores[:, 0]

    def _eval_step(self, stage: str, batch: dict) -> None:
        super()._eval_step(stage, batch)
        self.log(f"{stage}/shots", batch["shots"].mean(), batch_size=len(batch["keys"]))
