"""Sentence embeddings from any trained encoder: ``python main.py embed --ckpt_path REF --text ... | --input FILE``.

Pooling of the token states into one vector per text:
- ``mean``: the mean of the top layer over the real tokens (padding excluded): Sentence-BERT's MEAN strategy
  (Reimers & Gurevych 2019 §3), the pooling of sentence-transformers' all-MiniLM-L6-v2;
- ``cls``: the top layer's first token (BERT's [CLS] aggregate, Devlin et al. 2019 §3);
- ``scalar_mix``: a frozen-features run's trained ELMo mix ``γ Σ s_j h_j`` of all layers (Peters et al. 2018
  §3.2, ``backbones.scalar_mix``), then the mean over the real tokens.
By default a directory with sentence-transformers settings (``modules.json`` → its Pooling config, e.g. the
prepared ``minilm``) gets its own pooling and ``max_seq_length``; a run with a trained scalar mix gets
``scalar_mix``; anything else ``mean``.  ``--normalize`` scales each vector to unit length (all-MiniLM-L6-v2's
pipeline ends with that Normalize step).  Encoder–decoders embed with their encoder.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, Optional

import numpy as np
import torch

from ptm_app.backbones.build import max_positions
from ptm_app.backbones.delta import prepended_tokens, transformers_model
from ptm_app.data.tokenizer import check_representable
from ptm_app.errors import PtmError
from ptm_app.task_kinds.inputs import read_texts
from ptm_app.inference.loading import LoadedModel, load_for_inference
from ptm_app.paths import atomic_file

POOLINGS = ("cls", "mean", "scalar_mix")
OUTPUT_SUFFIXES = (".npy", ".jsonl")


def sentence_transformers_settings(directory: Optional[Path]) -> dict:
    """``pooling`` and ``max_length`` from a sentence-transformers directory (``modules.json``), if it is one."""
    if directory is None or not (directory / "modules.json").is_file():
        return {}
    found = {}
    for entry in json.loads((directory / "modules.json").read_text()):
        config = directory / entry.get("path", "") / "config.json"
        if entry.get("type", "").endswith(".Pooling") and config.is_file():
            modes = json.loads(config.read_text())
            if modes.get("pooling_mode_mean_tokens"):
                found["pooling"] = "mean"
            elif modes.get("pooling_mode_cls_token"):
                found["pooling"] = "cls"
            else:  # max / weighted / last-token pooling: not ours to imitate
                found["unsupported"] = [k.removeprefix("pooling_mode_") for k, v in modes.items()
                                        if k.startswith("pooling_mode_") and v is True]
    bert_config = directory / "sentence_bert_config.json"
    if bert_config.is_file() and json.loads(bert_config.read_text()).get("max_seq_length"):
        found["max_length"] = int(json.loads(bert_config.read_text())["max_seq_length"])
    return found


def trained_mix(loaded: LoadedModel):
    """The run's trained scalar mix (a frozen-features module with ``representation: scalar_mix``), or None."""
    return getattr(loaded.module, "mix", None)


def layer_states(loaded: LoadedModel, inputs: dict) -> tuple[torch.Tensor, ...]:
    """Every layer's token states [B, T, D] (layer 0 = embeddings), without peft's virtual prompt positions."""
    model = loaded.model
    if loaded.model_class == "seq2seq_lm":  # an encoder–decoder: the encoder reads the text
        encoder = transformers_model(model).get_encoder()
        out = encoder(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], output_hidden_states=True)
    elif loaded.model_class == "multiple_choice":  # its head reads [batch, choices, tokens]: the encoder alone
        out = transformers_model(model).base_model(**inputs, output_hidden_states=True)
    else:
        out = model(**inputs, output_hidden_states=True)
    states = getattr(out, "hidden_states", None)
    if states is None:
        raise PtmError(f"{loaded.ref} ({loaded.kind}) returns no hidden states to embed with; use an encoder run")
    skip = prepended_tokens(model)
    return tuple(h[:, skip:] for h in states) if skip else tuple(states)


def pool(tokens: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """[B, T, D] token states → [B, D]: the first token, or the mean over the real tokens."""
    if pooling == "cls":
        return tokens[:, 0]
    keep = mask.unsqueeze(-1).to(tokens.dtype)
    return (tokens * keep).sum(1) / keep.sum(1).clamp(min=1e-9)


def default_max_length(loaded: LoadedModel) -> int:
    """The longest input the model's positions allow (its encoder's, for an encoder–decoder), less virtual tokens."""
    model = transformers_model(loaded.model)
    limit = max_positions(model.get_encoder() if loaded.model_class == "seq2seq_lm" else model)
    limit = limit if limit is not None else min(loaded.tokenizer.model_max_length, 512)
    return limit - prepended_tokens(loaded.model)


@torch.no_grad()
def embed_texts(loaded: LoadedModel, texts: list[str], pooling: Optional[str] = None, normalize: bool = False,
                batch_size: int = 32, max_length: Optional[int] = None) -> np.ndarray:
    """One float32 vector per text, [len(texts), D]."""
    settings = sentence_transformers_settings(loaded.directory)
    if pooling is None and settings.get("unsupported"):
        raise PtmError(f"{loaded.ref}'s sentence-transformers pooling ({', '.join(settings['unsupported'])}) is not "
                       f"one of ours; choose --pooling {' or '.join(POOLINGS[:2])} explicitly")
    pooling = pooling or settings.get("pooling") or ("scalar_mix" if trained_mix(loaded) is not None else "mean")
    if pooling not in POOLINGS:
        raise PtmError(f"--pooling {pooling} is unknown; use one of {', '.join(POOLINGS)}")
    mix = trained_mix(loaded)
    if pooling == "scalar_mix" and mix is None:
        raise PtmError(f"--pooling scalar_mix needs a run with a trained scalar mix (FeatureExtractionModule with "
                       f"representation: scalar_mix); {loaded.ref} is a {loaded.kind}; use --pooling mean or cls")
    if batch_size < 1:
        raise PtmError("--batch_size must be at least 1")
    max_length = max_length or settings.get("max_length") or default_max_length(loaded)
    vectors = []
    for start in range(0, len(texts), batch_size):
        enc = loaded.tokenizer(texts[start:start + batch_size], padding=True, truncation=True, max_length=max_length,
                               return_tensors="pt")
        inputs = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc}
        states = layer_states(loaded, inputs)
        tokens = mix(states, inputs["attention_mask"]) if pooling == "scalar_mix" else states[-1]
        pooled = pool(tokens.float(), inputs["attention_mask"], "mean" if pooling == "scalar_mix" else pooling)
        vectors.append(torch.nn.functional.normalize(pooled, dim=-1) if normalize else pooled)
    return torch.cat(vectors).numpy().astype(np.float32)


def cosine_matrix(vectors: np.ndarray) -> np.ndarray:
    unit = vectors / np.clip(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12, None)
    return unit @ unit.T


def write_embeddings(path: Path, texts: list[str], vectors: np.ndarray) -> None:
    """``.npy`` (the [N, D] array) or ``.jsonl`` (``{"text", "embedding"}`` per line), written atomically."""
    if path.suffix == ".npy":
        with atomic_file(path, "wb") as fh:
            np.save(fh, vectors)
        return
    with atomic_file(path, "w", encoding="utf-8") as fh:
        for text, vector in zip(texts, vectors):
            fh.write(json.dumps({"text": text, "embedding": vector.tolist()}, ensure_ascii=False) + "\n")


def dual_encoder(loaded: LoadedModel):
    """The transformers ``VisionTextDualEncoderModel`` of an image–text run or export, else None."""
    model = transformers_model(loaded.model)
    return model if type(model).__name__ == "VisionTextDualEncoderModel" else None


@torch.no_grad()
def embed_pairs(loaded: LoadedModel, texts: list[str], images: list[str], normalize: bool = False,
                max_length: Optional[int] = None, too_long: str = "truncate") -> tuple[np.ndarray, np.ndarray]:
    """An image–text model's projected features (CLIP §2.3's shared space): ``(text vectors, image vectors)``.
    Pictures are read by ``data.images.load_image`` (SVG rendered, alpha on white, resized to the ViT's side);
    captions longer than the run's ``max_length`` (else the text tower's limit) are truncated with a warning, or
    refused (``too_long``)."""
    from ptm_app.data.image_text import normalise
    from ptm_app.data.images import load_image
    from ptm_app.task_kinds.rows import Settings, check_lengths

    model = dual_encoder(loaded)
    if model is None:
        raise PtmError(f"--image needs an image-text model (a DualEncoderModule run or its export); {loaded.ref} is "
                       f"a {loaded.kind}")
    limit = max_length or loaded.data_args().get("max_length") or max_positions(model.text_model) or 512
    text_vectors = torch.zeros(0, model.config.projection_dim)
    if texts:
        check_lengths([len(ids) for ids in loaded.tokenizer(texts)["input_ids"]], limit, Settings(too_long=too_long),
                      "the text tower's max_length")
        enc = loaded.tokenizer(texts, padding=True, truncation=True, max_length=limit, return_tensors="pt")
        text_vectors = model.get_text_features(input_ids=enc["input_ids"],
                                               attention_mask=enc["attention_mask"]).pooler_output.float()
    image_vectors = torch.zeros(0, model.config.projection_dim)
    if images:
        size = model.config.vision_config.image_size
        pixels = normalise(torch.from_numpy(np.stack([load_image(path, size) for path in images])))
        image_vectors = model.get_image_features(pixel_values=pixels).pooler_output.float()
    if normalize:
        text_vectors = torch.nn.functional.normalize(text_vectors, dim=-1)
        image_vectors = torch.nn.functional.normalize(image_vectors, dim=-1)
    return text_vectors.numpy(), image_vectors.numpy()


def embed(ckpt_path: str, text: Optional[list[str]] = None, input: Optional[str] = None, text_field: str = "text",
          pooling: Optional[Literal[POOLINGS]] = None, normalize: bool = False, batch_size: int = 32,
          max_length: Optional[int] = None, output: Optional[str] = None, similarity: bool = False,
          trust_checkpoint: bool = False, image: Optional[list[str]] = None) -> np.ndarray:
    """Sentence embeddings from a run, checkpoint, export or prepared model (minilm).

    Writes them to ``output``, prints the cosine matrix (``similarity``) or prints JSONL rows.

    Args:
        ckpt_path: a run directory, .ckpt, export directory or prepared model (minilm).
        text: a text to embed (repeatable, or several after one --text).
        input: a .txt (one text per line), .jsonl or .csv file; - reads standard input.
        text_field: the text field of .jsonl / .csv records.
        pooling: default: the model's sentence-transformers pooling, a run's trained scalar mix, else mean.
        normalize: scale every vector to unit length.
        batch_size: texts per forward.
        max_length: truncate texts to this many tokens (default: the model's).
        output: FILE.npy or FILE.jsonl (default: JSONL rows on the console).
        similarity: print the cosine similarity matrix of the texts.
        trust_checkpoint: read a checkpoint you made yourself even if it holds more than plain data (runs its code).
        image: an image-text model (a DualEncoderModule run or its export): a picture to embed (PNG, JPEG, SVG ...;
            repeatable); texts and pictures land in one space (rows: texts first, then pictures).
    """
    texts = text
    if output is not None and Path(output).suffix not in OUTPUT_SUFFIXES:
        raise PtmError(f"--output {output}: use a .npy (array) or .jsonl (text + embedding per line) file")
    given = bool(texts)
    texts = read_texts(texts, input, text_field) if (texts or input or not image) else []
    loaded = load_for_inference(ckpt_path, trust_checkpoint)
    if given:
        check_representable(loaded.tokenizer, texts)
    if image or dual_encoder(loaded) is not None:
        text_vectors, image_vectors = embed_pairs(loaded, texts, list(image or []), normalize, max_length)
        vectors, texts = np.concatenate([text_vectors, image_vectors]), [*texts, *(f"image:{p}" for p in image or [])]
    else:
        vectors = embed_texts(loaded, texts, pooling, normalize, batch_size, max_length)
    if output is not None:
        write_embeddings(Path(output), texts, vectors)
        print(f"wrote {len(texts)} embeddings of dimension {vectors.shape[1]} to {output}")
    if similarity:
        print_similarity(texts, cosine_matrix(vectors))
    if output is None and not similarity:
        for text, vector in zip(texts, vectors):
            print(json.dumps({"text": text, "embedding": [round(float(v), 6) for v in vector]}, ensure_ascii=False))
    return vectors


def print_similarity(texts: list[str], matrix: np.ndarray) -> None:
    for i, text in enumerate(texts, 1):
        print(f"[{i}] {text if len(text) <= 70 else text[:67] + '...'}")
    print("     " + "".join(f"{f'[{j}]':>8}" for j in range(1, len(texts) + 1)))
    for i, row in enumerate(matrix, 1):
        print(f"{f'[{i}]':<5}" + "".join(f"{v:8.3f}" for v in row))
