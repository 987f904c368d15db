"""Sequence-to-sequence masked LM: T5 span corruption and MASS.

* T5 (Raffel et al. 2020 §3.1.4): each corrupted span becomes ONE sentinel in the inputs; the
  targets list every sentinel followed by its span, then a final sentinel.
* MASS (Song et al. 2019 §2.2): one contiguous fragment, ONE ``[MASK]`` PER TOKEN in the encoder
  input; the decoder predicts exactly the fragment.
"""
from __future__ import annotations

import random
from typing import Sequence

from ptm_app.data.corruption.spans import Span


def _segmentation(n_items: int, n_segments: int, rng: random.Random) -> list[int]:
    """A uniformly random split of ``n_items`` into ``n_segments`` non-empty parts."""
    cuts = sorted(rng.sample(range(1, n_items), n_segments - 1))
    return [b - a for a, b in zip([0] + cuts, cuts + [n_items])]


def t5_spans(
    n_tokens: int, rng: random.Random, *, noise_density: float = 0.15, mean_span_length: float = 3.0
) -> list[Span]:
    """T5's ``random_spans_noise_mask`` as sorted spans (Raffel et al. 2020 §3.1.4).

    Exactly ``round(n * noise_density)`` noise tokens (at least 1, at most n - 1) in
    ``round(noise / mean_span_length)`` spans (at least 1), both split uniformly at random.  Unlike
    the reference code, whose noise always ends the sequence unless rolled, the leading and trailing
    clean runs may be empty and the clean tokens are spread uniformly; inner clean runs are non-empty.
    """
    if n_tokens < 2:
        return []
    n_noise = min(max(round(n_tokens * noise_density), 1), n_tokens - 1)
    n_clean = n_tokens - n_noise
    n_spans = min(max(round(n_noise / mean_span_length), 1), n_noise, n_clean + 1)
    noise = _segmentation(n_noise, n_spans, rng)
    clean = _segmentation(n_clean + 2, n_spans + 1, rng)  # +2: the outer runs may be empty
    clean[0] -= 1
    clean[-1] -= 1
    spans, start = [], 0
    for gap, length in zip(clean, noise):
        start += gap
        spans.append((start, start + length))
        start += length
    return spans


def t5_format(
    ids: Sequence[int], spans: Sequence[Span], *, sentinel_ids: Sequence[int], eos_id: int | None = None
) -> tuple[list[int], list[int]]:
    """T5 inputs/targets for given sorted, non-overlapping spans (``eos_id`` is appended to both)."""
    if len(spans) + 1 > len(sentinel_ids):
        raise ValueError(f"{len(spans)} spans need {len(spans) + 1} sentinel ids, got {len(sentinel_ids)}")
    inputs, targets, position = [], [], 0
    for sentinel, (start, end) in zip(sentinel_ids, spans):
        if not position <= start <= end <= len(ids):
            raise ValueError(f"spans must be sorted, non-overlapping and inside the sequence: {(start, end)}")
        inputs += list(ids[position:start]) + [sentinel]
        targets += [sentinel] + list(ids[start:end])
        position = end
    inputs += list(ids[position:])
    targets.append(sentinel_ids[len(spans)])
    if eos_id is not None:
        inputs.append(eos_id)
        targets.append(eos_id)
    return inputs, targets


def t5_span_corruption(
    ids: Sequence[int],
    rng: random.Random,
    *,
    noise_density: float = 0.15,
    mean_span_length: float = 3.0,
    sentinel_ids: Sequence[int],
    eos_id: int | None = None,
) -> tuple[list[int], list[int]]:
    """T5 span corruption (Raffel et al. 2020 §3.1.4): ``(inputs, targets)``.

    ``sentinel_ids`` in order of use (for HF T5: ``<extra_id_0>, <extra_id_1>, ...``).
    """
    spans = t5_spans(len(ids), rng, noise_density=noise_density, mean_span_length=mean_span_length)
    return t5_format(ids, spans, sentinel_ids=sentinel_ids, eos_id=eos_id)


def t5_reconstruct(
    inputs: Sequence[int], targets: Sequence[int], sentinel_ids: Sequence[int], *, eos_id: int | None = None
) -> list[int]:
    """Invert ``t5_format``: put every sentinel's target tokens back in place of it in the inputs."""
    if eos_id is not None:
        inputs = inputs[:-1] if inputs and inputs[-1] == eos_id else inputs
        targets = targets[:-1] if targets and targets[-1] == eos_id else targets
    sentinels = set(sentinel_ids)
    fills: dict[int, list[int]] = {}
    current = None
    for token in targets:
        if token in sentinels:
            current = fills.setdefault(token, [])
        elif current is None:
            raise ValueError("targets must start with a sentinel")
        else:
            current.append(token)
    out: list[int] = []
    for token in inputs:
        if token not in sentinels:
            out.append(token)
        elif token in fills:
            out += fills[token]
        else:
            raise ValueError(f"sentinel {token} has no target")
    return out


def mass_format(
    ids: Sequence[int], start: int, length: int, *, mask_token_id: int, decoder_start_id: int | None = None
) -> tuple[list[int], list[int], list[int]]:
    """MASS inputs for the fragment ``ids[start:start + length]`` (Song et al. 2019 §2.2).

    Returns ``(encoder_input, decoder_input, decoder_target)``: the encoder sees one ``[MASK]``
    per fragment token; the decoder target is the fragment and the decoder input is the fragment
    shifted right, starting with ``[MASK]`` (as in MASS) or ``decoder_start_id``.
    """
    end = start + length
    if not 0 <= start <= end <= len(ids):
        raise ValueError(f"fragment {(start, end)} outside a sequence of {len(ids)} tokens")
    fragment = list(ids[start:end])
    encoder_input = list(ids[:start]) + [mask_token_id] * length + list(ids[end:])
    first = mask_token_id if decoder_start_id is None else decoder_start_id
    decoder_input = [first] + fragment[:-1] if fragment else []
    return encoder_input, decoder_input, fragment


def mass_fragment(
    ids: Sequence[int],
    rng: random.Random,
    *,
    fraction: float = 0.5,
    mask_token_id: int,
    decoder_start_id: int | None = None,
) -> tuple[list[int], list[int], list[int], int]:
    """MASS (Song et al. 2019 §2.2): one uniformly placed fragment of ``round(fraction * n)`` tokens.

    The length is rounded half up and kept in ``[1, n]`` for non-empty inputs.  Returns
    ``(encoder_input, decoder_input, decoder_target, start)``; ``start`` lets the caller give the
    decoder the fragment's original positions.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    n = len(ids)
    length = min(n, max(1, int(fraction * n + 0.5))) if n else 0
    start = rng.randrange(n - length + 1)
    return (*mass_format(ids, start, length, mask_token_id=mask_token_id, decoder_start_id=decoder_start_id), start)
