"""The teacher-logits cache on disk (``distill.cache_teacher_logits``, ``compression.teacher_loss``): the teacher
runs once per training example, and later epochs, a resumed run, a second run or another student of the same teacher read its
logits instead (the soft targets of Hinton et al. 2015 §2 depend only on the teacher and the example).

Keyed like the tokenize-once cache (``data/cache.py``: by the content that determines the result, so a changed input
is a new entry and nothing is ever stale): the file by the teacher's identity (its resolved path, a sha256 of its
weights as loaded, and the autocast precision it computes in), each entry by a sha256 of the example's tokens as the
teacher reads them (``input_ids`` and ``token_type_ids`` under the attention mask, so the data file, its fields,
the tokenizer and ``max_length`` are all in it).  One safetensors file per teacher (``digests`` [N, 32] uint8,
``logits`` [N, C] float32) under ``<cache>/teacher_logits/``, written atomically, merged with what other runs added.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from ptm_app.paths import atomic_file, cache_root

FORMAT_VERSION = 1


def weights_digest(model: nn.Module) -> str:
    """sha256 over the model's tensors (names, dtypes, shapes, bytes), in name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def example_digests(inputs: dict) -> list[bytes]:
    """One 32-byte sha256 per example of a batch: its token ids (and segment ids) where the attention mask is 1."""
    ids = inputs["input_ids"].detach().cpu()
    mask = inputs.get("attention_mask")
    mask = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.detach().cpu().bool()
    segments = inputs.get("token_type_ids")
    out = []
    for row in range(ids.shape[0]):
        digest = hashlib.sha256(ids[row][mask[row]].to(torch.int64).numpy().tobytes())
        if segments is not None:
            digest.update(b"|" + segments[row].cpu()[mask[row]].to(torch.int64).numpy().tobytes())
        out.append(digest.digest())
    return out


class TeacherLogitCache:
    """The raw logits of one teacher, by example digest; ``save`` writes what is new (merged with the file)."""

    def __init__(self, teacher_ref: str, teacher: nn.Module, precision: str):
        key = [FORMAT_VERSION, str(teacher_ref), weights_digest(teacher), precision]
        name = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:20]
        self.path: Path = cache_root() / "teacher_logits" / f"{name}.safetensors"
        self.logits: dict[bytes, torch.Tensor] = self.read()
        self.unsaved = 0

    def read(self) -> dict[bytes, torch.Tensor]:
        from safetensors.torch import load_file

        if not self.path.is_file():
            return {}
        stored = load_file(str(self.path))
        return {bytes(d.tolist()): z for d, z in zip(stored["digests"], stored["logits"])}

    def get(self, digest: bytes) -> Optional[torch.Tensor]:
        return self.logits.get(digest)

    def put(self, digest: bytes, logits: torch.Tensor) -> None:
        if digest not in self.logits:
            self.logits[digest] = logits.detach().float().cpu()
            self.unsaved += 1

    def save(self) -> None:
        """Write the cache if anything is new, keeping entries another run saved meanwhile (theirs are the same
        teacher's logits of the same tokens)."""
        from safetensors.torch import save

        if not self.unsaved:
            return
        merged = {**self.read(), **self.logits}
        digests = list(merged)
        blob = save({"digests": torch.tensor([list(d) for d in digests], dtype=torch.uint8),
                     "logits": torch.stack([merged[d] for d in digests]).contiguous()})
        with atomic_file(self.path, "wb") as fh:
            fh.write(blob)
        self.unsaved = 0


def autocast_precision(device_type: str = "cpu") -> str:
    """The dtype the teacher computes in here: the device's autocast dtype when autocast is on, else fp32."""
    return str(torch.get_autocast_dtype(device_type)) if torch.is_autocast_enabled(device_type) else "fp32"
