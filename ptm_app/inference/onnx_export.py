"""ONNX export of a fine-tuned run's model with its head, checked against PyTorch with ONNX Runtime:
``python main.py export --format onnx --ckpt_path RUN --output_dir DIR``, then
``python main.py predict --backend onnxruntime --ckpt_path DIR ...``.

The graph is the run's own head computation (``inference.loading.LoadedModel.head_outputs``: the module's ``forward`` with
its deltas, frozen features and virtual tokens dropped; a plain model's logits), traced by ``torch.export`` and
converted by ``torch.onnx.export(dynamo=True)`` with dynamic batch and sequence axes.  Inputs: ``input_ids``,
``attention_mask`` (and ``token_type_ids`` for models that take them), int64 ``[batch, sequence]``.  Outputs:
``logits`` (label scores ``[batch, labels]``, values ``[batch]`` for regression, tag scores
``[batch, sequence, labels]``) or ``start_logits`` / ``end_logits`` ``[batch, sequence]`` for extractive QA.

Before the directory is written, ONNX Runtime runs the graph on inputs of other batch sizes and lengths (with
padding) than the traced ones and its outputs must match PyTorch fp32 within ``TOLERANCE`` (absolute); the
largest difference seen and the tolerance go into ``onnx.json`` beside ``model.onnx``.  Generation models are not
exported (their decoding loop is PyTorch's ``generate``).
"""
from __future__ import annotations

import inspect
import json
import logging
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from ptm_app.backbones.delta import transformers_model
from ptm_app.errors import PtmError
from ptm_app.inference.loading import LoadedModel, session_outputs

ONNX_FILE, ONNX_INFO = "model.onnx", "onnx.json"
TOLERANCE = 1e-4  # largest |ONNX Runtime - PyTorch fp32| allowed on any output value
EXPORTABLE = ("sequence_classification", "token_classification", "question_answering")
CHECK_SHAPES = ((1, 5), (3, 11))  # (batch, sequence) of the check inputs; the trace uses (2, 8)


def takes_token_types(loaded: LoadedModel) -> bool:
    """Whether the backbone reads ``token_type_ids`` (BERT-style segment embeddings)."""
    model = transformers_model(loaded.model)
    return "token_type_ids" in inspect.signature(model.forward).parameters


class HeadGraph(nn.Module):
    """``(input_ids, attention_mask[, token_type_ids]) -> head outputs``: what ``torch.export`` traces."""

    def __init__(self, loaded: LoadedModel, model_class: str):
        super().__init__()
        self.net = loaded.module if loaded.module is not None else loaded.model  # registers the weights
        self.loaded, self.model_class = loaded, model_class

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: Optional[torch.Tensor] = None):
        batch = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            batch["token_type_ids"] = token_type_ids
        return self.loaded.head_outputs(batch, self.model_class)


def example_inputs(loaded: LoadedModel, batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    """Random in-vocabulary ids with the last row padded to half its length (and a second segment, if typed)."""
    generator = torch.Generator().manual_seed(seed)
    vocab = transformers_model(loaded.model).config.get_text_config().vocab_size
    ids = torch.randint(min(5, vocab - 1), vocab, (batch, length), generator=generator)
    mask = torch.ones_like(ids)
    if batch > 1:
        mask[-1, length // 2:] = 0
        pad = loaded.tokenizer.pad_token_id
        ids[-1, length // 2:] = 0 if pad is None else pad
    inputs = {"input_ids": ids, "attention_mask": mask}
    if takes_token_types(loaded):
        types = torch.zeros_like(ids)
        types[:, length // 2:] = 1
        inputs["token_type_ids"] = types * mask
    return inputs


@contextmanager
def quiet_logging():
    """The exporter's notices (e.g. "torchvision is not installed", DeepSpeed's accelerator line when tracing
    imports it, with a logger created on the spot) stay off the console; errors still show."""
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(before)


def as_tuple(out) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def output_names(model_class: str) -> list[str]:
    return ["start_logits", "end_logits"] if model_class == "question_answering" else ["logits"]


def write_onnx(loaded: LoadedModel, directory: Path) -> dict:
    """Write ``model.onnx`` and ``onnx.json`` into ``directory`` (inside ``export``'s atomic directory): the
    graph, then the ONNX Runtime check; a difference beyond ``TOLERANCE`` is refused in one line."""
    from ptm_app.task_kinds.registry import kind_of

    kind = kind_of(loaded)
    model_class = kind.model_class if kind is not None else None
    if model_class not in EXPORTABLE:
        raise PtmError(f"export --format onnx covers classification, regression, tagging and extractive QA runs; "
                       f"{loaded.ref} is a {loaded.kind} (model class {loaded.model_class}; language models keep "
                       f"PyTorch's generate loop); export it without --format onnx")
    ort = onnxruntime()
    graph = HeadGraph(loaded, model_class).eval()
    traced = example_inputs(loaded, 2, 8, seed=0)
    names = list(traced)
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    axes = {name: {0: batch, 1: sequence} for name in names}
    path = directory / ONNX_FILE
    with warnings.catch_warnings(), torch.no_grad(), quiet_logging():
        warnings.simplefilter("ignore")
        try:
            program = torch.onnx.export(graph, (), kwargs=traced, dynamo=True, input_names=names,
                                        output_names=output_names(model_class), dynamic_shapes=axes, verbose=False,
                                        report=False)
        except Exception as exc:  # torch.export names the unsupported operation in its first line
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise PtmError(f"export --format onnx: {loaded.kind} cannot be traced ({first[:200]}); export it "
                           f"without --format onnx") from None
        program.save(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for seed, (size, length) in enumerate(CHECK_SHAPES, start=1):
        inputs = example_inputs(loaded, size, length, seed)
        with torch.no_grad():
            expected = as_tuple(graph(**inputs))
        got = session_outputs(session, inputs)
        for want, have in zip(expected, as_tuple(got)):
            worst = max(worst, float((want.float() - have.float()).abs().max()))
    if worst > TOLERANCE:
        raise PtmError(f"export --format onnx: ONNX Runtime differs from PyTorch by {worst:.2e} (> {TOLERANCE:.0e}) "
                       f"on {loaded.kind}; export it without --format onnx")
    import onnx as onnx_package

    info = {"file": ONNX_FILE, "model_class": model_class, "inputs": names, "outputs": output_names(model_class),
            "dynamic_axes": {"0": "batch", "1": "sequence"},
            "opset": max((o.version for o in onnx_package.load(str(path), load_external_data=False).opset_import
                          if o.domain in ("", "ai.onnx")), default=None),
            "check": {"reference": "PyTorch fp32", "tolerance_abs": TOLERANCE, "max_abs_diff": worst,
                      "inputs": [{"batch": b, "sequence": t} for b, t in CHECK_SHAPES]},
            "versions": {"torch": torch.__version__, "onnx": onnx_package.__version__,
                         "onnxruntime": ort.__version__}}
    (directory / ONNX_INFO).write_text(json.dumps(info, indent=2))
    card = directory / "README.md"
    if card.is_file():
        card.write_text(card.read_text(encoding="utf-8") + onnx_card_section(info), encoding="utf-8")
    return info


def onnx_card_section(info: dict) -> str:
    return (f"\n## ONNX\n\n`{info['file']}`: the model with its head (model class {info['model_class']}), inputs "
            f"{', '.join(info['inputs'])} (int64, dynamic batch and sequence axes), outputs "
            f"{', '.join(info['outputs'])}. ONNX Runtime matches PyTorch fp32 within {info['check']['tolerance_abs']} "
            f"(largest difference seen: {info['check']['max_abs_diff']:.1e}). Run it with "
            f"`python main.py predict --backend onnxruntime --ckpt_path <this directory> --text \"...\"`.\n")


def onnxruntime():
    try:
        import onnxruntime as ort
    except ImportError:
        raise PtmError("ONNX needs the onnx extra: pip install -c constraints-cpu.txt -e '.[onnx]'") from None
    return ort


def open_session(loaded: LoadedModel):
    """An ONNX Runtime session over ``<export dir>/model.onnx`` for ``predict --backend onnxruntime``."""
    directory = loaded.directory
    if directory is None or not (directory / ONNX_FILE).is_file():
        raise PtmError(f"--backend onnxruntime: {loaded.ref} holds no {ONNX_FILE}; write one with: python main.py "
                       f"export --format onnx --ckpt_path RUN --output_dir DIR, then pass --ckpt_path DIR")
    options = onnxruntime().SessionOptions()
    options.log_severity_level = 3  # errors only: the console stays quiet
    return onnxruntime().InferenceSession(str(directory / ONNX_FILE), options, providers=["CPUExecutionProvider"])
