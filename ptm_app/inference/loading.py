"""Load a trained model for inference from any reference ``export`` takes (docs/design.md principles 3 and 11).

A reference is a run directory or a ``.ckpt`` (file or sharded directory), an ``export`` directory, a prepared
model name (``minilm``, ``smollm2``) or any ``save_pretrained`` directory.  Checkpoints are rebuilt by the module
class they name (``PtmModule.load_from_checkpoint``, weights-only), exports with module weights by
``inference.export.load_exported_module``, exports with an unmerged delta by ``backbones.delta.load_delta``; nothing loaded is
executed.  Deltas (adapters, LoRA, prompts) stay applied: the model is the one the run evaluated.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from ptm_app.backbones.build import quiet_transformers
from ptm_app.backbones.delta import CONFIG_FILE, load_delta, transformers_model
from ptm_app.backbones.from_checkpoint import is_checkpoint, module_from_checkpoint
from ptm_app.backbones.model_classes import auto_class, model_class_of
from ptm_app.checkpoint_io.reading import read_checkpoint, read_record, trusting
from ptm_app.data.sources.references import REMOTE_CODE, load_error, load_tokenizer_dir, resolve_pretrained
from ptm_app.errors import PtmError
from ptm_app.inference.export import EXPORT_INFO, MODULE_CONFIG, load_exported_module, recorded_data_args



@dataclass
class LoadedModel:
    """A model ready for inference (eval mode, on the CPU).

    ``model`` is the transformers model the run used (a peft wrapper or with adapters when it was delta-tuned),
    ``module`` the LightningModule around it when the reference names one (None for a plain transformers
    directory), ``model_class`` the class it is built as (``backbones.model_classes.MODEL_CLASSES``), ``directory`` the
    ``from_pretrained`` directory when there is one (sentence-transformers settings are read from it)."""

    ref: str
    model: nn.Module
    tokenizer: Any
    model_class: str
    module: Optional[nn.Module] = None
    directory: Optional[Path] = None
    session: Any = None  # an ONNX Runtime session that computes the head instead (predict --backend onnxruntime)

    @property
    def kind(self) -> str:
        """What the model is, for messages: the module class, else the transformers class."""
        return type(self.module).__name__ if self.module is not None else type(self.model).__name__

    def data_args(self, data_class=None) -> dict:
        """The data module's ``init_args`` of the run a checkpoint belongs to (its ``config.yaml``), or those an
        export recorded (``ptm_app_export.json``'s ``data``), over ``data_class``'s own defaults (just the defaults
        for prepared models and other directories)."""
        import inspect

        args = {}
        if data_class is not None:
            args = {name: p.default for name, p in inspect.signature(data_class).parameters.items()
                    if p.default is not inspect.Parameter.empty}
        args.update({k: v for k, v in recorded_data_args(resolve_pretrained(self.ref)).items() if v is not None})
        return args

    def is_regression(self) -> bool:
        from ptm_app.adaptation.classification import SequenceRegressionModule

        if self.module is not None:
            return isinstance(self.module, SequenceRegressionModule)
        config = transformers_model(self.model).config
        return config.problem_type == "regression" or config.num_labels == 1

    def head_outputs(self, batch: dict, model_class: str, regression: Optional[bool] = None):
        """The head's raw outputs for a batch, as the run's module computes them (its ``forward``: deltas, frozen
        features, virtual tokens dropped) or a plain export's model: label scores [B, C] (values [B] for
        regression), tag scores [B, T, C], or (start, end) logits [B, T].  With an ONNX Runtime session attached
        (``predict --backend onnxruntime``) the exported graph computes them instead.  ``predict --text``'s rows
        (``task_kinds.rows``), the ONNX graph and ``compress-report`` all call this one computation."""
        if self.session is not None:
            return session_outputs(self.session, batch)
        if self.module is not None:
            return self.module(batch)
        out = self.model(**plain_inputs(batch))
        if model_class == "question_answering":
            return out.start_logits.float(), out.end_logits.float()
        if regression is None:
            regression = self.is_regression()
        return out.logits.squeeze(-1) if model_class == "sequence_classification" and regression else out.logits

    def predicted_outputs(self, batch: dict, model_class: str) -> tuple[Any, Optional[list[dict]]]:
        """``(head_outputs, per-example extras or None)``: a run's task module predicts through its policies (an
        early-exit tagger's rows gain each sentence's ``exit_layer``); an export or ONNX session has no extras."""
        from ptm_app.adaptation.task_module import TaskModule

        if self.session is None and isinstance(self.module, TaskModule):
            return self.module.predicted_outputs(batch)
        return self.head_outputs(batch, model_class), None


def load_for_inference(ref: str, trust: Optional[bool] = None) -> LoadedModel:
    """The model behind ``ref`` (see the module docstring); unknown or unreadable references raise one line.
    transformers' weight-loading bars and notices stay off the console (the command prints only its results).
    ``trust`` (``--trust_checkpoint``) covers every checkpoint the model loads (``checkpoint_io.reading.trusting``)."""
    with quiet_transformers(), trusting(trust):
        return _load(ref)


def _load(ref: str) -> LoadedModel:
    where = resolve_pretrained(ref)
    if is_checkpoint(where):
        module = module_from_checkpoint(read_checkpoint(where), source=where).eval()
        return _from_module(ref, module, None)
    directory = Path(where)
    if not directory.is_dir():
        raise PtmError(f"--ckpt_path {ref}: not a run directory, checkpoint, export directory or prepared model; "
                       f"pass one of those (a hub id needs a network and is not loaded here)")
    if (directory / MODULE_CONFIG).is_file():
        return _from_module(ref, load_exported_module(directory), directory)
    return _from_directory(ref, directory)


def _from_module(ref: str, module, directory: Optional[Path]) -> LoadedModel:
    if module.tokenizer is None:
        raise PtmError(f"{ref} keeps no tokenizer files; export it again from its run directory")
    module.requires_grad_(False)
    return LoadedModel(ref, module.backbone, module.tokenizer, module.model_class, module, directory)


def _from_directory(ref: str, directory: Path) -> LoadedModel:
    """A ``save_pretrained`` directory: a plain export (its model class in ``ptm_app_export.json``), a prepared
    model or any transformers directory (its model class from the config's architecture); an unmerged delta is
    re-applied."""
    import transformers

    if not (directory / "config.json").is_file():
        raise PtmError(f"{directory} has no config.json: not a save_pretrained directory; pass a run directory, "
                       f"a checkpoint or an export directory")
    from ptm_app.compression.quantization import QUANT_CONFIG, is_quantized, load_quantized

    if is_quantized(directory):  # an int8 directory (python main.py quantize): rebuilt from safetensors + JSON
        model_class = read_record(directory / QUANT_CONFIG)["model_class"]
        model = load_quantized(directory)
        model.requires_grad_(False)
        return LoadedModel(ref, model, load_tokenizer_dir(directory, ref), model_class, None, directory)
    info = directory / EXPORT_INFO
    try:
        config = transformers.AutoConfig.from_pretrained(directory, **REMOTE_CODE)
        model_class = read_record(info)["model_class"] if info.is_file() else model_class_of(config)
        from ptm_app.backbones.model_classes import load_pruned
        from ptm_app.backbones.pruned_heads import is_head_pruned

        pruned = is_head_pruned(directory)  # heads sliced out (backbones.pruned_heads): built to its shapes
        model = (load_pruned(auto_class(model_class), directory) if pruned
                 else auto_class(model_class).from_pretrained(directory, **REMOTE_CODE))
        tokenizer = transformers.AutoTokenizer.from_pretrained(directory, **REMOTE_CODE)
    except (OSError, ValueError) as exc:
        raise load_error(str(directory), exc) from None
    if (directory / CONFIG_FILE).is_file():  # adapters / prompts saved beside the base they were trained on
        model = load_delta(model, directory)
    model.requires_grad_(False)
    return LoadedModel(ref, model.eval(), tokenizer, model_class, None, directory)



def plain_inputs(batch: dict) -> dict:
    return {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}


def session_outputs(session, batch: dict):
    """The graph's outputs for a batch, as torch tensors (a pair for QA); missing segment ids are zeros, as the
    model's own default."""
    feed = {}
    for spec in session.get_inputs():
        value = batch.get(spec.name)
        if value is None and spec.name == "token_type_ids":
            value = torch.zeros_like(batch["input_ids"])
        feed[spec.name] = value.detach().cpu().numpy().astype("int64")
    out = [torch.from_numpy(o) for o in session.run(None, feed)]
    return out[0] if len(out) == 1 else tuple(out)
