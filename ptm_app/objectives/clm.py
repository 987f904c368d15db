"""Causal (left-to-right) language modelling (GPT: Radford et al. 2018 §3.1):
``p(x) = Π_t p(x_t | x_<t)``, labels are the inputs shifted inside the model, padding ignored."""
from __future__ import annotations

from ptm_app.data import IGNORE_INDEX
from ptm_app.data.collators import CLMCollator
from ptm_app.objectives.lm_base import LanguageModelModule


class CausalLMModule(LanguageModelModule):
    """CLM pre-training on a decoder (GPT-2, Llama ... any ``AutoModelForCausalLM``)."""

    model_class = "causal_lm"

    def make_collator(self, tokenizer, seed: int = 0) -> CLMCollator:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        return CLMCollator(pad_token_id=pad)

    def count_targets(self, labels) -> int:
        return int((labels[:, 1:] != IGNORE_INDEX).sum())  # the first position predicts nothing
