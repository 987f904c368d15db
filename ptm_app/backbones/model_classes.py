"""The model classes a backbone is built as (a module's ``model_class``, a checkpoint's and an export's
``model_class``), in one table: each ``ModelClass`` names its transformers Auto class (``from_config`` builds one from
a transformers config), its peft task type (delta tuning, ``backbones.delta``) and transformers' table of the
architectures that are of this class (``model_class_of`` reads a config's).  A task kind
(``task_kinds.registry.TaskKind``) names the model class it trains and adds its own intended use and pipeline tag;
the classes no task kind trains (language models, encoders) carry theirs here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import transformers


@dataclass(frozen=True)
class ModelClass:
    """``auto_class``: the transformers class; ``peft_task_type``: peft's ``TaskType`` value (None: peft has none);
    ``architectures``: the name of transformers' ``MODEL_FOR_*_MAPPING_NAMES`` listing this class's architectures;
    ``use`` / ``pipeline_tag``: the model card's intended use and the Hub pipeline, for classes no task kind trains."""

    auto_class: str
    peft_task_type: Optional[str] = None
    architectures: Optional[str] = None
    use: Optional[str] = None
    pipeline_tag: Optional[str] = None


# most specific first: ``model_class_of`` takes the first class whose architectures name the config's
MODEL_CLASSES: dict[str, ModelClass] = {
    "causal_lm": ModelClass("AutoModelForCausalLM", "CAUSAL_LM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
                            "continuing text left to right (main.py generate)", "text-generation"),
    "seq2seq_lm": ModelClass("AutoModelForSeq2SeqLM", "SEQ_2_SEQ_LM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
                             "rewriting an input text into an output text (main.py generate)", "text2text-generation"),
    "sequence_classification": ModelClass("AutoModelForSequenceClassification", "SEQ_CLS",
                                          "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
    "token_classification": ModelClass("AutoModelForTokenClassification", "TOKEN_CLS",
                                       "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"),
    "question_answering": ModelClass("AutoModelForQuestionAnswering", "QUESTION_ANS",
                                     "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES"),
    "multiple_choice": ModelClass("AutoModelForMultipleChoice", None, "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES"),
    "masked_lm": ModelClass("AutoModelForMaskedLM", None, "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
                            "filling in masked tokens, and as an encoder to fine-tune or embed with", "fill-mask"),
    "base": ModelClass("AutoModel", "FEATURE_EXTRACTION", None,
                       "sentence and token embeddings (main.py embed), and as an encoder to fine-tune",
                       "feature-extraction"),
    # ELECTRA's discriminator (Clark et al. 2020 §2)
    "rtd": ModelClass("ElectraForPreTraining", None, None,
                      "detecting replaced tokens (ELECTRA's discriminator), and as an encoder to fine-tune"),
    # ptm_app.backbones.bilstm (ELMo, Peters et al. 2018)
    "bilm": ModelClass("BiLSTMForLanguageModeling", None, None,
                       "contextual word representations (ELMo's BiLSTM language model)"),
    # VisualBERT (Li et al. 2019): one BERT over caption tokens and picture patches, MLM + image-text matching heads
    "visual_bert": ModelClass("VisualBertForPreTraining", None, None,
                              "joint picture and caption representations (VisualBERT's single stream)"),
}


def auto_class(model_class: str):
    if model_class == "bilm":  # ELMo's BiLSTM: ptm_app's own transformers-compatible model
        from ptm_app.backbones.bilstm import BILSTM_CLASSES

        return BILSTM_CLASSES["bilm"]
    return getattr(transformers, MODEL_CLASSES[model_class].auto_class)


def auto_class_name(model_class: str, default: str = "AutoModel") -> str:
    """The transformers class name of a model class (``default`` for an unknown one), for messages and model cards."""
    return MODEL_CLASSES[model_class].auto_class if model_class in MODEL_CLASSES else default


def model_class_of(config) -> str:
    """The ptm_app model class of a transformers config, from its first architecture name (``base`` if none
    matches)."""
    from transformers.models.auto import modeling_auto

    arch = (getattr(config, "architectures", None) or [None])[0]
    for name, model_class in MODEL_CLASSES.items():
        if arch is None or model_class.architectures is None:
            continue
        names = getattr(modeling_auto, model_class.architectures, {}).get(config.model_type)
        if arch in ((names,) if isinstance(names, str) else tuple(names or ())):
            return name
    return "base"


def from_config(model_class, config):
    """Instantiate a model class (its ptm_app name or the class itself) from a config (Auto classes and concrete
    classes alike; never the code a config's ``auto_map`` names)."""
    cls = auto_class(model_class) if isinstance(model_class, str) else model_class
    if hasattr(cls, "from_config"):  # an Auto class
        model = cls.from_config(config, trust_remote_code=False)
    else:
        model = cls._from_config(config)
    if getattr(config, "pruned_heads", None):  # a head-pruned model (backbones.pruned_heads): its smaller shapes
        from ptm_app.backbones.pruned_heads import restructure

        restructure(model)
    return model


def load_pruned(auto, directory, **kwargs) -> transformers.PreTrainedModel:
    """``auto.from_pretrained(directory)`` for a head-pruned ``save_pretrained`` directory: the model is built from
    its config, restructured to the pruned shapes, and its safetensors weights loaded strictly."""
    from pathlib import Path

    from safetensors.torch import load_file

    from ptm_app.data.sources.references import REMOTE_CODE
    from ptm_app.errors import PtmError

    config = transformers.AutoConfig.from_pretrained(directory, **REMOTE_CODE, **kwargs)
    model = from_config(auto, config)  # restructured to the pruned shapes the config records
    state = {}
    for file in sorted(Path(directory).glob("*.safetensors")):
        if file.name.startswith("model"):
            state.update(load_file(str(file)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise PtmError(f"{directory}: weights do not fit the pruned config (missing {missing[:3]}, "
                       f"unexpected {unexpected[:3]}); export the run again")
    return model.eval()
