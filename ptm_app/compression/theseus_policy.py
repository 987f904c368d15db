"""BERT-of-Theseus as a policy of any task module whose backbone is one encoder stack (``model.init_args.theseus:
{predecessor: ..., compress_ratio: 2, ...}``; Xu et al. 2020, "BERT-of-Theseus: compressing BERT by progressive
module replacing" §3): the fine-tuned predecessor's L blocks form L/r modules of r consecutive blocks; each has a
successor of one block.  At every training step each module is replaced by its successor with probability p (one
Bernoulli draw per module, §3.1), the predecessor's blocks frozen, so the successors learn to work together with the
predecessor and with each other.  p follows the linear curriculum p_t = min(1, k·t + b) (§3.3); once it reaches 1
the successor trains alone, which is the successor fine-tuning of §3.2.  The module's backbone *is* the successor
(built from the predecessor: its embeddings, head and first L/r blocks by default), so validation, checkpoints,
export and prediction are the successor alone; the predecessor is named in checkpoints, never saved."""
from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, is_dataclass
from typing import Iterator, Optional

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from ptm_app.compression.students import layer_list_path, student_from_teacher
from ptm_app.compression.teacher import FrozenTeacher, has_trained_head, resolve_teacher, size_facts
from ptm_app.errors import PtmError
from ptm_app.training.policy import BackbonePolicy


def replacement_rate(step: int, k: float, b: float) -> float:
    """The curriculum replacement rate ``p_t = min(1, k·t + b)`` (Xu et al. 2020 §3.3, Eq. 6), at least 0."""
    return max(0.0, min(1.0, k * step + b))


def draw_replacements(step: int, modules: int, rate: float, seed: int) -> torch.Tensor:
    """Which of ``modules`` modules are replaced at ``step``: i.i.d. Bernoulli(``rate``) from a generator seeded by
    (``seed``, ``step``), so a resumed run draws exactly what the uninterrupted run drew.  Drawn on the CPU on every
    machine (the draw picks modules, it samples no model tensor), so a GPU run replaces what a CPU run replaces."""
    generator = torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + step)
    return torch.rand(modules, generator=generator, device="cpu") < rate


@contextlib.contextmanager
def blocks_swapped(model: nn.Module, blocks: list[nn.Module]) -> Iterator[None]:
    """``model``'s block list (``bert.encoder.layer`` …) temporarily holding ``blocks``."""
    path = layer_list_path(model)
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    original = getattr(parent, name)
    setattr(parent, name, nn.ModuleList(blocks))
    try:
        yield
    finally:
        setattr(parent, name, original)


@dataclass
class TheseusSpec:
    """A task module's ``theseus`` setting.

    Args:
        predecessor: the fine-tuned model of the same model class (run directory or ``.ckpt``, exported directory):
            frozen, never saved with the successor (the checkpoint names it).
        compress_ratio: r, predecessor blocks per successor block (L must be a multiple of r).
        successor_init: the predecessor blocks (1..L) the L/r successor blocks start from; default the first L/r
            (Xu et al. §4.1); the embeddings and the task head are copied and trained throughout.
        curriculum_k / curriculum_b: the slope k (per optimiser step) and intercept b of p_t = min(1, k·t + b);
            k = 0 is a constant rate b.
        seed: seeds the replacement draws (one generator per step: a resumed run draws the same).
    """

    predecessor: Optional[str] = None
    compress_ratio: int = 2
    successor_init: Optional[list[int]] = None
    curriculum_k: float = 1e-3
    curriculum_b: float = 0.3
    seed: int = 0

    def __post_init__(self):
        if not self.predecessor:
            raise PtmError("theseus.predecessor is not set: name the fine-tuned run, export or model the successor "
                           "replaces, e.g. theseus: {predecessor: checkpoints/minilm_full_brown_pos}")


def as_theseus_spec(value) -> Optional[TheseusSpec]:
    if value is None or isinstance(value, TheseusSpec):
        return value
    return TheseusSpec(**(asdict(value) if is_dataclass(value) else value))


class Theseus(BackbonePolicy):
    """The successor is the module's backbone, built from the frozen predecessor (``build``); each training step
    runs the module's own forward and loss with the step's drawn mix of successor and predecessor blocks, and logs
    ``train/replace_rate`` (p_t) and ``train/replaced`` (the fraction of modules replaced at that step) next to
    ``train/loss``; ``summary.json`` gets the successor's and the predecessor's parameter counts."""

    builds = True

    def __init__(self, spec: TheseusSpec | dict, model_class: str):
        self.spec = as_theseus_spec(spec)
        self.frozen = FrozenTeacher(self.spec.predecessor, model_class)

    @property
    def predecessor(self) -> nn.Module:
        return self.frozen.model

    def style(self) -> str:
        return "module replacing (BERT-of-Theseus)"

    # -- building the successor ----------------------------------------------------------------------------------
    def build(self, module, fitting: bool) -> Optional[nn.Module]:
        """The successor from the predecessor; None (the module builds ``backbone_config``) when a checkpoint's
        successor config is given outside a fit (loading, export: no predecessor needed)."""
        if module.hparams.get("backbone_config"):
            if not fitting:
                return None
            raise PtmError("theseus builds the successor from the predecessor's config; remove "
                           "model.init_args.backbone_config")
        pred, spec = self.predecessor, self.spec
        module.config_updates()  # the data's labels, when not given
        if getattr(pred.config, "is_encoder_decoder", False):
            raise PtmError(f"theseus replaces the blocks of one encoder stack; predecessor '{spec.predecessor}' is an "
                           f"encoder-decoder ({type(pred).__name__}): compress an encoder")
        n, r = pred.config.num_hidden_layers, spec.compress_ratio
        if not has_trained_head(pred):
            raise PtmError(f"predecessor '{spec.predecessor}' has no trained {module.model_class.replace('_', ' ')} "
                           f"head; fine-tune it first (BERT-of-Theseus compresses a fine-tuned model)")
        if r < 1 or n % r:
            raise PtmError(f"compress_ratio {r}: the predecessor's {n} layers must split into modules of r layers; "
                           f"choose a divisor of {n}")
        labels = module.hparams.get("labels")
        names = [pred.config.id2label[i] for i in range(pred.config.num_labels)]
        if labels is not None and names != list(labels):
            raise PtmError(f"predecessor '{spec.predecessor}' predicts labels {names} but the data's labels are "
                           f"{list(labels)}; compress a model fine-tuned on this label set")
        if module.tokenizer is not None:  # the successor reads the data with the predecessor's embeddings
            self.frozen.check_vocabulary(module.tokenizer, "theseus (the successor keeps the predecessor's "
                                                           "embeddings)")
        init = spec.successor_init or list(range(1, n // r + 1))
        if len(init) != n // r or not all(isinstance(i, int) and 1 <= i <= n for i in init):
            raise PtmError(f"successor_init {init}: name {n // r} predecessor layers in 1..{n}")
        rank_zero_info(f"successor: {n // r} layers from predecessor layers {init} (each replaces {r})")
        return student_from_teacher(pred, init)

    # -- training: the mixed model -----------------------------------------------------------------------------
    def predecessor_blocks(self) -> nn.ModuleList:
        return self.predecessor.get_submodule(layer_list_path(self.predecessor))

    def mixed_blocks(self, module, replaced: torch.Tensor) -> list[nn.Module]:
        """Module i: the successor's block i if ``replaced[i]``, else the predecessor's blocks r·i … r·i+r−1."""
        r, successor = self.spec.compress_ratio, module.backbone.get_submodule(layer_list_path(module.backbone))
        predecessor = self.predecessor_blocks()
        blocks: list[nn.Module] = []
        for i, swap in enumerate(replaced.tolist()):
            blocks.extend([successor[i]] if swap else list(predecessor[r * i: r * i + r]))
        return blocks

    def mixed_outputs(self, module, batch: dict, replaced: torch.Tensor):
        """The module's outputs with the successor's embeddings and head around the mixed blocks (the successor
        alone if all are replaced)."""
        if bool(replaced.all()):
            return module(batch)
        self.frozen.on(module.device)
        with blocks_swapped(module.backbone, self.mixed_blocks(module, replaced)):
            return module(batch)

    def training_loss(self, module, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        step, spec = module.global_step, self.spec
        rate = replacement_rate(step, spec.curriculum_k, spec.curriculum_b)
        replaced = draw_replacements(step, module.backbone.config.num_hidden_layers, rate, spec.seed)
        loss = module.kind.loss(self.mixed_outputs(module, batch, replaced), batch)
        return loss, {"replace_rate": torch.tensor(rate), "replaced": replaced.float().mean()}

    def summary(self, module) -> dict:
        return size_facts(module.backbone, self.predecessor)

    # -- checkpoints: the predecessor by name, never its weights --------------------------------------------------
    def save(self, module, checkpoint: dict) -> None:
        hparams, resolved = checkpoint["hyper_parameters"], resolve_teacher(self.spec.predecessor)
        if "theseus" in hparams:
            hparams["theseus"] = {**asdict(self.spec), "predecessor": resolved}
        else:  # TheseusModule's flat setting
            hparams["predecessor"] = resolved


def replacing(spec: TheseusSpec | dict, hparams, model_class: str) -> Theseus:
    """The ``theseus`` policy of a module with ``hparams``; one line for settings that choose the backbone too."""
    if hparams.get("backbone"):
        raise PtmError("theseus builds the successor from the predecessor; remove model.init_args.backbone")
    return Theseus(spec, model_class)
