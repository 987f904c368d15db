"""BERT masked-LM corruption (Devlin et al. 2019, §3.1).

Select ``p`` (15 %) of the maskable positions; of those, 80 % become ``[MASK]``, 10 % a random
token and 10 % stay unchanged.  Labels hold the original id at selected positions and
``IGNORE_INDEX`` elsewhere.  Special tokens and padding are never selected.
"""
from __future__ import annotations

import hashlib
import random
from typing import Iterable

import torch

from ptm_app.data import IGNORE_INDEX


def _seed_from(seed: int, keys: Iterable) -> int:
    digest = hashlib.blake2b(repr((seed, tuple(keys))).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def draw_rng(seed: int, keys: Iterable) -> random.Random:
    """Like ``draw_generator`` but a ``random.Random`` (for per-sequence list operations)."""
    return random.Random(_seed_from(seed, keys))


def draw_generator(seed: int, keys: Iterable, device: torch.device | str | None = None) -> torch.Generator:
    """A generator on ``device`` (default the CPU) seeded from ``seed`` and the batch's sample keys.

    Every batch gets its own, reproducible stream: masks change from batch to batch and from
    epoch to epoch (keys include the epoch) yet are identical when a run is resumed.  A generator
    samples only tensors on its own device: model-side draws pass the device of the tensor they
    sample.  The CPU and CUDA generators are different algorithms, so one seed gives one stream per
    device type (collators always draw on the CPU, so their corruption is the same on every machine).
    """
    gen = torch.Generator(device=device) if device is not None else torch.Generator()
    gen.manual_seed(_seed_from(seed, keys))
    return gen


def static_key(key, copies: int = 1) -> tuple:
    """The key of an example's static draw (BERT's static masking, RoBERTa §4.1): the example's own index and,
    with ``copies`` = k (``create_pretraining_data``'s ``dupe_factor``), the copy ``epoch % k``, so the example
    gets one of k fixed draws whatever batch it lands in.  ``key`` is a sampler key ``(epoch, index)`` or an index."""
    epoch, index = key if isinstance(key, tuple) else (0, key)
    return "static", int(index), int(epoch) % max(int(copies), 1)


def mlm_mask(
    input_ids: torch.Tensor,
    maskable: torch.Tensor,
    *,
    mask_token_id: int,
    vocab_size: int,
    generator: torch.Generator,
    mlm_probability: float = 0.15,
    mask_ratio: float = 0.8,
    random_ratio: float = 0.1,
    random_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(corrupted_ids, labels)`` for BERT's 15 % / 80-10-10 recipe.

    ``maskable`` is a bool tensor (same shape) that is False at special tokens and padding.
    ``random_ids`` optionally restricts replacement tokens (default: any id in ``[0, vocab_size)``);
    pass the non-special ids so a random replacement is never ``[CLS]``/``[PAD]``.
    """
    if not 0.0 <= mlm_probability <= 1.0 or mask_ratio + random_ratio > 1.0 + 1e-9:
        raise ValueError("need 0 <= mlm_probability <= 1 and mask_ratio + random_ratio <= 1")
    shape = input_ids.shape
    probs = torch.full(shape, mlm_probability)
    selected = torch.bernoulli(probs, generator=generator).bool() & maskable.bool()
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))

    action = torch.rand(shape, generator=generator)
    to_mask = selected & (action < mask_ratio)
    to_random = selected & (action >= mask_ratio) & (action < mask_ratio + random_ratio)

    corrupted = input_ids.clone()
    corrupted[to_mask] = mask_token_id
    n_random = int(to_random.sum())
    if n_random:
        if random_ids is None:
            replacement = torch.randint(0, vocab_size, (n_random,), generator=generator)
        else:
            pick = torch.randint(0, len(random_ids), (n_random,), generator=generator)
            replacement = random_ids[pick]
        corrupted[to_random] = replacement.to(input_ids.dtype)
    return corrupted, labels
