"""The transformers class behind each ptm_app head name: ``from_config`` builds one from a transformers config."""
from __future__ import annotations

import transformers

HEADS = {
    "masked_lm": "AutoModelForMaskedLM",
    "causal_lm": "AutoModelForCausalLM",
    "seq2seq_lm": "AutoModelForSeq2SeqLM",
    "sequence_classification": "AutoModelForSequenceClassification",
    "token_classification": "AutoModelForTokenClassification",
    "question_answering": "AutoModelForQuestionAnswering",
    "multiple_choice": "AutoModelForMultipleChoice",
    "base": "AutoModel",
    "rtd": "ElectraForPreTraining",  # ELECTRA's discriminator (Clark et al. 2020 §2)
    "bilm": "BiLSTMForLanguageModeling",  # ptm_app.backbones.bilstm (ELMo, Peters et al. 2018)
}


def auto_class(head: str):
    if head == "bilm":  # ELMo's BiLSTM: ptm_app's own transformers-compatible model
        from ptm_app.backbones.bilstm import HEAD_CLASSES

        return HEAD_CLASSES["bilm"]
    return getattr(transformers, HEADS[head])


def from_config(head, config):
    """Instantiate a head class (a head name or the class) from a config (Auto classes and concrete classes alike;
    never the code a config's ``auto_map`` names)."""
    cls = auto_class(head) if isinstance(head, str) else head
    if hasattr(cls, "from_config"):  # an Auto class
        model = cls.from_config(config, trust_remote_code=False)
    else:
        model = cls._from_config(config)
    if getattr(config, "pruned_heads", None):  # a head-pruned model (backbones.pruned_heads): its smaller shapes
        from ptm_app.backbones.pruned_heads import restructure

        restructure(model)
    return model
