"""BERT-of-Theseus (Xu et al. 2020, "BERT-of-Theseus: compressing BERT by progressive module replacing" §3):
the fine-tuned predecessor's L blocks form L/r modules of r consecutive blocks; each has a successor of one block.
At every training step each module is replaced by its successor with probability p (one Bernoulli draw per module,
§3.1), the predecessor's blocks frozen, so the successors learn to work together with the predecessor and with each
other.  p follows the linear curriculum p_t = min(1, k·t + b) (§3.3); once it reaches 1 the successor trains alone,
which is the successor fine-tuning of §3.2.  Validation, export and prediction are the successor alone."""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from ptm_app.adaptation.classification import SequenceClassificationModule
from ptm_app.compression.students import layer_list_path, student_from_teacher
from ptm_app.compression.teacher import FrozenTeacher, has_trained_head, resolve_teacher, size_facts
from ptm_app.errors import PtmError
from ptm_app.training.optim import OptimConfig


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


class TheseusModule(SequenceClassificationModule):
    """Compress a fine-tuned classifier by progressive module replacing; logs ``train/replace_rate`` (p_t) and
    ``train/replaced`` (the fraction of modules replaced at that step) next to ``train/loss``.

    Args:
        predecessor: the fine-tuned classifier (run directory or ``.ckpt``, exported directory): frozen, never
            saved with the successor (the checkpoint names it).
        compress_ratio: r, predecessor blocks per successor block (L must be a multiple of r).
        successor_init: the predecessor blocks (1..L) the L/r successor blocks start from; default the first L/r
            (Xu et al. §4.1); the embeddings, pooler and classifier are copied and trained throughout.
        curriculum_k / curriculum_b: the slope k (per optimiser step) and intercept b of p_t = min(1, k·t + b);
            k = 0 is a constant rate b.
        seed: seeds the replacement draws (one generator per step: a resumed run draws the same).
        backbone / backbone_config: written by the checkpoint (the successor's config); leave them unset, the
            successor is built from the predecessor.
    """

    def __init__(self, predecessor: str, compress_ratio: int = 2, successor_init: Optional[list[int]] = None,
                 curriculum_k: float = 1e-3, curriculum_b: float = 0.3, labels: Optional[list[str]] = None,
                 optim: OptimConfig = OptimConfig(lr=2e-5), positive_label: Optional[str] = None, seed: int = 0,
                 backbone: Optional[str] = None, backbone_config: Optional[dict] = None):
        if backbone:
            raise PtmError("TheseusModule builds its successor from the predecessor; remove model.init_args.backbone")
        self.frozen_predecessor = FrozenTeacher(predecessor, "sequence_classification")
        super().__init__(None, backbone_config, labels, optim, positive_label=positive_label)

    def default_style(self) -> str:
        return "module replacing (BERT-of-Theseus)"

    @property
    def predecessor(self) -> nn.Module:
        return self.frozen_predecessor.model

    def can_build(self) -> bool:
        return self.hparams.labels is not None

    def predecessor_blocks(self) -> nn.ModuleList:
        return self.predecessor.get_submodule(layer_list_path(self.predecessor))

    def build_model(self):
        self.config_updates()  # the data's labels, when not given
        pred, r = self.predecessor, self.hparams.compress_ratio
        n = pred.config.num_hidden_layers
        if not has_trained_head(pred):
            raise PtmError(f"predecessor '{self.hparams.predecessor}' has no trained classification head; fine-tune "
                           f"it first (BERT-of-Theseus compresses a fine-tuned model)")
        if r < 1 or n % r:
            raise PtmError(f"compress_ratio {r}: the predecessor's {n} layers must split into modules of r layers; "
                           f"choose a divisor of {n}")
        names = [pred.config.id2label[i] for i in range(pred.config.num_labels)]
        if names != list(self.hparams.labels):
            raise PtmError(f"predecessor '{self.hparams.predecessor}' predicts labels {names} but the data's labels "
                           f"are {list(self.hparams.labels)}; compress a model fine-tuned on this label set")
        init = self.hparams.successor_init or list(range(1, n // r + 1))
        if len(init) != n // r or not all(isinstance(i, int) and 1 <= i <= n for i in init):
            raise PtmError(f"successor_init {init}: name {n // r} predecessor layers in 1..{n}")
        rank_zero_info(f"successor: {n // r} layers from predecessor layers {init} (each replaces {r})")
        return student_from_teacher(pred, init)

    # -- training: the mixed model -----------------------------------------------------------------------------
    def replace_rate(self, step: int) -> float:
        return replacement_rate(step, self.hparams.curriculum_k, self.hparams.curriculum_b)

    def mixed_blocks(self, replaced: torch.Tensor) -> list[nn.Module]:
        """Module i: the successor's block i if ``replaced[i]``, else the predecessor's blocks r·i … r·i+r−1."""
        r, successor = self.hparams.compress_ratio, self.backbone.get_submodule(layer_list_path(self.backbone))
        predecessor = self.predecessor_blocks()
        blocks: list[nn.Module] = []
        for i, swap in enumerate(replaced.tolist()):
            blocks.extend([successor[i]] if swap else list(predecessor[r * i: r * i + r]))
        return blocks

    def mixed_logits(self, batch: dict, replaced: torch.Tensor) -> torch.Tensor:
        """The successor's embeddings and head around the mixed blocks (the successor alone if all replaced)."""
        if bool(replaced.all()):
            return self(batch)
        if next(self.predecessor.parameters()).device != self.device:
            self.predecessor.to(self.device)
        with blocks_swapped(self.backbone, self.mixed_blocks(replaced)):
            return self(batch)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        step, n = self.global_step, self.batch_size(batch)
        rate = self.replace_rate(step)
        replaced = draw_replacements(step, self.backbone.config.num_hidden_layers, rate, self.hparams.seed)
        loss = self.kind.loss(self.mixed_logits(batch, replaced), batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=n)
        self.log_dict({"train/replace_rate": rate, "train/replaced": replaced.float().mean().item()}, batch_size=n)
        return loss

    def summary_facts(self) -> dict:
        return size_facts(self.backbone, self.predecessor)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["hyper_parameters"]["predecessor"] = resolve_teacher(self.hparams.predecessor)
