"""Probes on frozen representations, control tasks, the scalar mix and its center of gravity.

- A probe is a linear classifier (Tenney et al. 2019 §3; Hewitt & Liang 2019 §2) or a one-hidden-layer MLP
  (Hewitt & Liang's MLP-1), trained on one layer's features (standardised with the training set's statistics),
  full-batch L-BFGS or minibatch Adam, seeded.
- A control task (Hewitt & Liang 2019 §2.1) gives every word *type* a label drawn once from the task's label
  distribution, as a fixed seeded function of the type; selectivity = task accuracy - control accuracy.
- The scalar mix (ELMo, Peters et al. 2018 eq. 1; ``backbones.scalar_mix.ScalarMix``) learns softmax weights s_l
  over all layers jointly with one linear probe (same optimizer and steps as the probes); its center of gravity is sum_l l * s_l (Tenney et al. 2019a
  "BERT Rediscovers the Classical NLP Pipeline", §3).
"""
from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from typing import Iterable, Literal, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class ProbeSettings:
    """How one probe is built and trained (see ``probing.probe`` for the meaning of each setting)."""

    kind: Literal["linear", "mlp"] = "linear"
    hidden_size: int = 256
    optimizer: Literal["lbfgs", "adam"] = "lbfgs"
    steps: int = 100
    lr: Optional[float] = None
    weight_decay: float = 1e-4
    batch_size: int = 512
    seed: int = 0

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else (1.0 if self.optimizer == "lbfgs" else 1e-3)


@contextlib.contextmanager
def one_thread():
    """Probes are small matrices: one intra-op thread fits them faster than two contending ones (measured here:
    an L-BFGS probe on 1848 x 384 features took 1.5 s with 1 thread, 5.8 s with 2 on a shared 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class Standardizer:
    """(x - mean) / std with the training features' statistics."""

    def __init__(self, x: torch.Tensor):
        self.mean = x.mean(0)
        self.std = x.std(0).clamp(min=1e-6)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def build_probe(dim: int, classes: int, settings: ProbeSettings) -> nn.Module:
    if settings.kind == "mlp":
        return nn.Sequential(nn.Linear(dim, settings.hidden_size), nn.ReLU(), nn.Linear(settings.hidden_size, classes))
    return nn.Linear(dim, classes)


def _fit(params: list[nn.Parameter], loss_fn, n: int, settings: ProbeSettings, generator: torch.Generator) -> None:
    """Minimise ``loss_fn(index)`` (index None = every example) plus L2 on the weight matrices."""
    decay = [p for p in params if p.dim() > 1]

    def objective(index):
        return loss_fn(index) + settings.weight_decay * sum((w ** 2).sum() for w in decay)

    if settings.optimizer == "lbfgs":
        opt = torch.optim.LBFGS(params, lr=settings.learning_rate, max_iter=settings.steps,
                                line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            loss = objective(None)
            loss.backward()
            return loss

        opt.step(closure)
        return
    opt = torch.optim.Adam(params, lr=settings.learning_rate)
    for _ in range(settings.steps):  # epochs
        for index in torch.randperm(n, generator=generator).split(settings.batch_size):
            opt.zero_grad()
            objective(index).backward()
            opt.step()


def train_probe(x: torch.Tensor, y: torch.Tensor, classes: int, settings: ProbeSettings) -> nn.Module:
    """A probe fitted on standardised ``x`` [N, D] to labels ``y`` [N]; call it on standardised features."""
    generator = torch.Generator().manual_seed(settings.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        probe = build_probe(x.size(1), classes, settings)
    with torch.enable_grad():
        _fit(list(probe.parameters()), lambda i: F.cross_entropy(probe(x if i is None else x[i]),
                                                                 y if i is None else y[i]),
             len(y), settings, generator)
    return probe.eval()


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Share of ``y`` predicted; a label id of -1 (unseen in training) always counts as wrong."""
    return (model(x).argmax(-1) == y).float().mean().item() if len(y) else float("nan")


def probe_accuracy(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor,
                   classes: int, settings: ProbeSettings) -> float:
    """Train on one layer's training features, score on its test features (both standardised by train)."""
    scale = Standardizer(train_x)
    return accuracy(train_probe(scale(train_x), train_y, classes, settings), scale(test_x), test_y)


# -- control tasks (Hewitt & Liang 2019 §2.1) -----------------------------------------------------------------
def label_distribution(labels: Iterable[str]) -> dict[str, float]:
    """Each label's share of ``labels``, in sorted label order."""
    counts: dict[str, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    total = sum(counts.values())
    return {label: counts[label] / total for label in sorted(counts)}


def control_label(word_type: str, distribution: dict[str, float], seed: int) -> str:
    """The control label of ``word_type``: a uniform number fixed by (seed, type) through a hash, mapped through
    the inverse cumulative ``distribution``; the same type always gets the same label, in any process."""
    digest = hashlib.blake2b(f"{seed}\x00{word_type}".encode(), digest_size=8).digest()
    u = int.from_bytes(digest, "big") / 2.0 ** 64
    cumulative = 0.0
    for label, share in distribution.items():
        cumulative += share
        if u < cumulative:
            return label
    return next(reversed(distribution))


def word_type(word: str) -> str:
    """A word's type for the control task: its lowercased form."""
    return word.lower()


# -- scalar mix and center of gravity -------------------------------------------------------------------------
def train_scalar_mix(train_layers: Sequence[torch.Tensor], y: torch.Tensor, classes: int,
                     settings: ProbeSettings, mix_l2: float = 0.0) -> tuple[torch.Tensor, nn.Module]:
    """ELMo's scalar mix over standardised layers, trained jointly with a linear probe by the probes' optimizer
    and steps; returns the softmax weights s_l and the trained (mix, probe).

    ``mix_l2`` adds lambda * ||w||^2 on the mix's pre-softmax weights, ELMo's regulariser that keeps the mix near
    the average of all layers (Peters et al. 2018 §3.2): without it, a probe that separates its training set from
    several layers lets the mix drift to any one of them."""
    from ptm_app.backbones.scalar_mix import ScalarMix

    generator = torch.Generator().manual_seed(settings.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        mix = ScalarMix(len(train_layers))
        linear = nn.Linear(train_layers[0].size(1), classes)
    stacked = torch.stack(list(train_layers))  # [L, N, D]
    model = _MixProbe(mix, linear)
    with torch.enable_grad():
        _fit(list(model.parameters()), lambda i: F.cross_entropy(model(stacked if i is None else stacked[:, i]),
                                                                 y if i is None else y[i])
             + mix_l2 * (mix.weights ** 2).sum(), len(y), settings, generator)
    return mix.layer_weights().detach(), model.eval()


class _MixProbe(nn.Module):
    def __init__(self, mix: nn.Module, linear: nn.Module):
        super().__init__()
        self.mix, self.linear = mix, linear

    def forward(self, stacked: torch.Tensor) -> torch.Tensor:  # [L, N, D]
        return self.linear(self.mix(list(stacked)))


def center_of_gravity(weights: Sequence[float], layers: Sequence[int]) -> float:
    """sum_l l * s_l (Tenney et al. 2019a §3): the expected layer under the mix weights."""
    return float(sum(layer * float(w) for layer, w in zip(layers, weights)))
