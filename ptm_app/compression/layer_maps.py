"""Which teacher layer each student layer learns from (layers are numbered 1..L as in ``hidden_states``;
0 is the embedding layer, matched by the embedding loss).

* ``uniform``: TinyBERT (Jiao et al. 2020 §3.1) ``g(m) = m·L_T/L_S`` for m = 1..L_S (the top layers meet).
* ``skip`` / ``skip-k``: PKD-Skip (Sun et al. 2019 §3.1), every k-th teacher layer (k = ``L_T // L_S`` by
  default) for student layers 1..L_S−1 (12 → 6: {2, 4, 6, 8, 10}); the top layer is left to the soft targets.
* ``last`` / ``last-k``: PKD-Last, the last k teacher layers below the top (k = L_S−1 by default) for student
  layers 1..k (12 → 6: {7, …, 11}).
* an explicit list of ``[student_layer, teacher_layer]`` pairs.
"""
from __future__ import annotations

from typing import Union

from ptm_app.errors import PtmError

LayerMap = Union[str, list[list[int]]]
KINDS = ("uniform", "skip", "last")


def layer_pairs(spec: LayerMap, student_layers: int, teacher_layers: int) -> list[tuple[int, int]]:
    """``[(student layer, teacher layer), ...]`` for ``spec``; one line naming a layer that does not exist."""
    s, t = student_layers, teacher_layers
    if isinstance(spec, str):
        kind, _, k = spec.partition("-")
        if kind not in KINDS or (k and (kind == "uniform" or not k.isdigit() or int(k) < 1)):
            raise PtmError(f"distill.layer_map '{spec}' is unknown; use uniform, skip, skip-K, last, last-K (K >= 1) "
                           f"or a list of [student_layer, teacher_layer] pairs")
        if s > t and not k:
            raise PtmError(f"distill.layer_map '{spec}': the student has more layers ({s}) than the teacher ({t}); "
                           f"give an explicit list of [student_layer, teacher_layer] pairs")
        if kind == "uniform":
            pairs = [(m, m * t // s) for m in range(1, s + 1)]
        elif kind == "skip":
            every = int(k) if k else t // s
            pairs = [(m, m * every) for m in range(1, s)]
        else:
            last = int(k) if k else s - 1
            pairs = [(m, t - last - 1 + m) for m in range(1, last + 1)]
    else:
        pairs = []
        for pair in spec:
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(x, int) for x in pair)):
                raise PtmError(f"distill.layer_map entry {pair!r} is not a [student_layer, teacher_layer] pair of "
                               f"integers; write e.g. [[1, 2], [2, 4]]")
            pairs.append((pair[0], pair[1]))
    for student_layer, teacher_layer in pairs:
        if not 1 <= student_layer <= s:
            raise PtmError(f"distill.layer_map names student layer {student_layer}, but the student has layers "
                           f"1..{s}; name layers that exist")
        if not 1 <= teacher_layer <= t:
            raise PtmError(f"distill.layer_map names teacher layer {teacher_layer}, but the teacher has layers "
                           f"1..{t}; name layers that exist")
    return pairs
