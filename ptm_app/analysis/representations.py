"""Every layer's representations of a frozen backbone, computed once and cached.

One forward pass with ``output_hidden_states`` gives all L+1 layers (layer 0 = the embeddings; Tenney et al.
2019 §3 probe each of them), so probing or measuring 30 layers runs the backbone once, not 30 times.  The result
is kept in ``<cache>/representations/<key>.safetensors`` (one ``[N, D]`` tensor per layer), keyed by the model's
files, the data file, the sample and the settings.

What one row is, by level:
- ``token``: a word, represented by its first sub-token (BERT's tagging convention, Devlin et al. 2019 §4.3);
  words cut off by ``max_length`` are dropped and listed in ``Features.sentence`` / ``Features.word``.
- ``sentence``: the mean over the text's real, non-special tokens.
- ``pair``: the same mean over both texts encoded together (``tokenizer(text, text_pair)``).
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

import torch

from ptm_app.errors import PtmError
from ptm_app.paths import atomic_file, cache_root, sha256_file

FORMAT_VERSION = 1
Level = Literal["token", "sentence", "pair"]


@dataclass
class Examples:
    """A sample of one split: ``texts`` are word lists (token level) or strings; ``labels`` one per word or text."""

    level: Level
    texts: list
    labels: list
    pairs: Optional[list[str]] = None
    source: str = ""  # the data file (its digest keys the cache)
    sample: str = ""  # how the sample was drawn (keys the cache)


@dataclass
class Features:
    """``layers[l]``: ``[N, D]`` float32; for token level, row i is word ``word[i]`` of text ``sentence[i]``."""

    layers: list[torch.Tensor]
    sentence: torch.Tensor
    word: torch.Tensor
    extra: dict = field(default_factory=dict)


@dataclass
class Encoder:
    """A frozen backbone and its tokenizer, loaded from any model reference ptm_app knows."""

    name: str
    model: torch.nn.Module
    tokenizer: object
    where: str

    @property
    def num_layers(self) -> int:
        """How many representations one pass gives: the transformer layers + the embeddings (layer 0)."""
        cfg = self.model.config
        count = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "num_layers", None) or getattr(cfg, "n_layer")
        return int(count) + 1

    def check_layers(self, layers: Optional[list[int]]) -> list[int]:
        """``layers`` (all when None), each checked to exist: one line naming the bad index otherwise."""
        every = list(range(self.num_layers))
        if layers is None:
            return every
        for index in layers:
            if index not in every:
                raise PtmError(f"layer {index} is not in {self.name}: it has layers 0..{self.num_layers - 1} "
                               f"(0 = the embeddings); fix 'layers' or leave it out for all")
        return sorted(set(layers))

    def fit_length(self, max_length: int) -> int:
        """``max_length``, shortened to the longest input the backbone's position embeddings allow."""
        from ptm_app.backbones.build import max_positions

        limit = max_positions(self.model)
        return min(max_length, limit) if limit else max_length

    def fingerprint(self) -> str:
        """The model files (config, and every weight file's name, size and time) as a cache key."""
        root = Path(self.where)
        parts = [(root / "config.json").read_text(encoding="utf-8") if (root / "config.json").is_file() else self.where]
        for path in sorted(root.glob("*")):
            if path.suffix in (".safetensors", ".bin", ".json", ".txt", ".model") and path.is_file():
                stat = path.stat()
                parts.append(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}")
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def load_encoder(ref: str, attention: bool = False) -> Encoder:
    """The backbone (``AutoModel``, no head) and tokenizer of ``ref``: a prepared name (``minilm``), a
    ``save_pretrained`` directory, or a ptm_app run directory / ``.ckpt`` (its backbone exported once).
    ``attention``: the model's own attention kernel (``eager``), the one that returns attention weights."""
    import ptm_app.backbones.bilstm  # noqa: F401  (registers the ELMo BiLSTM with AutoModel)
    from transformers import AutoTokenizer

    from ptm_app.backbones.build import build_backbone, model_dir, quiet_transformers
    from ptm_app.data.sources.references import load_error

    where = model_dir(ref)
    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(where, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise load_error(ref, exc) from None
    if not getattr(tokenizer, "is_fast", False):
        raise PtmError(f"{ref}: its tokenizer is not a fast (Rust) tokenizer, which word alignment needs; "
                       f"give a model directory with a tokenizer.json")
    if tokenizer.pad_token_id is None:  # GPT-style: pad with EOS (masked out anyway)
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    with quiet_transformers():
        model = build_backbone("base", where, {"attn_implementation": "eager"} if attention else None).eval()
    model.requires_grad_(False)
    return Encoder(name=Path(ref).name if Path(ref).exists() else ref, model=model, tokenizer=tokenizer, where=where)


def sample_indices(total: int, limit: Optional[int], seed: int) -> list[int]:
    """``limit`` record indices drawn without replacement (all, in order, when ``limit`` is None)."""
    if limit is None or limit >= total:
        return list(range(total))
    return sorted(random.Random(seed).sample(range(total), limit))


def word_spans(words: list[str]) -> tuple[str, list[int]]:
    """The words joined by spaces, and for every character its word index (-1 for the spaces)."""
    text, owner = [], []
    for i, w in enumerate(words):
        if i:
            text.append(" ")
            owner.append(-1)
        text.append(w)
        owner += [i] * len(w)
    return "".join(text), owner


def _batches(order: list[int], size: int):
    for start in range(0, len(order), size):
        yield order[start:start + size]


def token_words(offsets: list[tuple[int, int]], special: list[int], owner: list[int]) -> list[int]:
    """Every token's word index (-1 for special tokens and empty pieces) from a text's token character offsets
    (``owner`` from ``word_spans``)."""
    words = []
    for pos, (start, end) in enumerate(offsets):
        word = -1
        if not special[pos] and end > start:
            word = next((owner[c] for c in range(start, min(end, len(owner))) if owner[c] >= 0), -1)
        words.append(word)
    return words


def first_sub_tokens(offsets: list[tuple[int, int]], special: list[int], owner: list[int]) -> dict[int, int]:
    """``{word: position of its first sub-token}`` (``token_words``); a word cut off by truncation has no entry."""
    first: dict[int, int] = {}
    for pos, word in enumerate(token_words(offsets, special, owner)):
        if word >= 0 and word not in first:
            first[word] = pos
    return first


def _padded(enc, batch: list[int], pad: int, tokenizer) -> tuple[dict, torch.Tensor]:
    """The batch's model inputs, right-padded (the BiLSTM needs right padding), and its attention mask."""
    width = max(len(enc["input_ids"][i]) for i in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    types = torch.zeros_like(ids)
    for row, i in enumerate(batch):
        seq = enc["input_ids"][i]
        ids[row, :len(seq)] = torch.tensor(seq)
        mask[row, :len(seq)] = 1
        if "token_type_ids" in enc:
            types[row, :len(seq)] = torch.tensor(enc["token_type_ids"][i])
    inputs = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in enc and "token_type_ids" in getattr(tokenizer, "model_input_names", ()):
        inputs["token_type_ids"] = types
    return inputs, mask


@torch.no_grad()
def encode_layers(encoder: Encoder, examples: Examples, max_length: int = 128, batch_size: int = 32) -> Features:
    """All layers' representations of ``examples`` in one pass per batch (batches sorted by length)."""
    from ptm_app.data.sources.fetch import progress

    tok = encoder.tokenizer
    token_level = examples.level == "token"
    texts = [word_spans(ws)[0] for ws in examples.texts] if token_level else list(examples.texts)
    options = dict(truncation=True, max_length=encoder.fit_length(max_length), return_offsets_mapping=token_level,
                   return_special_tokens_mask=True, verbose=False)
    enc = tok(texts, examples.pairs, **options) if examples.pairs else tok(texts, **options)
    order = sorted(range(len(texts)), key=lambda i: len(enc["input_ids"][i]))
    chunks: list[list[torch.Tensor]] = []
    sentence_ids, word_ids = [], []
    batches = list(_batches(order, batch_size))
    for batch in progress(batches, f"{encoder.name}: all layers of {examples.level}s ({examples.sample})"):
        inputs, mask = _padded(enc, batch, tok.pad_token_id, tok)
        hidden = encoder.model(**inputs, output_hidden_states=True).hidden_states
        if token_level:
            rows, positions = [], []
            for row, i in enumerate(batch):
                first = first_sub_tokens(enc["offset_mapping"][i], enc["special_tokens_mask"][i],
                                         word_spans(examples.texts[i])[1])
                for word in sorted(first):
                    rows.append(row)
                    positions.append(first[word])
                    sentence_ids.append(i)
                    word_ids.append(word)
            r, c = torch.tensor(rows, dtype=torch.long), torch.tensor(positions, dtype=torch.long)
            chunks.append([h[r, c].float() for h in hidden])
        else:  # the mean over real, non-special tokens
            keep = mask.clone()
            for row, i in enumerate(batch):
                special = torch.tensor(enc["special_tokens_mask"][i], dtype=torch.long)
                keep[row, :len(special)] *= 1 - special
            keep = keep.unsqueeze(-1).float()
            chunks.append([(h.float() * keep).sum(1) / keep.sum(1).clamp(min=1) for h in hidden])
            sentence_ids += batch
            word_ids += [-1] * len(batch)
    layers = [torch.cat([chunk[l] for chunk in chunks]) for l in range(len(chunks[0]))]
    sentence = torch.tensor(sentence_ids, dtype=torch.long)
    word = torch.tensor(word_ids, dtype=torch.long)
    back = torch.argsort(sentence * (1 << 20) + word.clamp(min=0))  # rows in text order, words in order
    return Features(layers=[h[back].contiguous() for h in layers], sentence=sentence[back], word=word[back])


def cached_layers(encoder: Encoder, examples: Examples, max_length: int = 128, batch_size: int = 32,
                  dtype: Literal["float32", "float16"] = "float32") -> Features:
    """``encode_layers``, read from the cache when this model, data file, sample and settings were seen."""
    from safetensors.torch import load_file

    max_length = encoder.fit_length(max_length)
    key = json.dumps([FORMAT_VERSION, encoder.fingerprint(), sha256_file(examples.source) if examples.source else
                      hashlib.sha256(json.dumps([examples.texts, examples.pairs]).encode()).hexdigest(),
                      examples.level, examples.sample, max_length, dtype])
    path = cache_root() / "representations" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.safetensors"
    if path.is_file():
        stored = load_file(str(path))
        count = sum(name.startswith("layer.") for name in stored)
        return Features(layers=[stored[f"layer.{l}"].float() for l in range(count)], sentence=stored["sentence"],
                        word=stored["word"])
    features = encode_layers(encoder, examples, max_length, batch_size)
    tensors = {f"layer.{l}": h.to(getattr(torch, dtype)).contiguous() for l, h in enumerate(features.layers)}
    tensors.update(sentence=features.sentence.contiguous(), word=features.word.contiguous())
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "wb") as fh:
        fh.write(_safetensors_bytes(tensors, {"model": encoder.name, "key": key}))
    if dtype == "float16":  # the caller gets what a later cache hit would give
        features.layers = [h.half().float() for h in features.layers]
    return features


def _safetensors_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    from safetensors.torch import save

    return save(tensors, metadata=metadata)
