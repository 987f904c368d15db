"""Pruning during fine-tuning, a policy of any task module (``model.init_args.pruning``;
``adaptation.compressed.PruningModule`` is the sequence classifier that older configs name), any of

* ``layers``: drop transformer blocks before fine-tuning (Sajjad et al. 2020, "Poor man's BERT" §3: top-layer,
  alternate or a listed set);
* ``heads``: iterative head pruning (Michel et al. 2019 §4.3): at each round the heads with the lowest gradient
  importance on held-out (validation) batches are removed physically (``compression.heads``), and the model is
  fine-tuned ``every`` steps before the next round, until ``target`` of all heads are gone;
* ``magnitude``: unstructured magnitude pruning to a sparsity, one-shot or on Zhu & Gupta's cubic schedule
  (``compression.magnitude``); the masks are buffers of the module (checkpointed: resume is exact) and the pruned
  weights are zero in the weights, so ``export`` writes a permanently sparse model.

The pruned shapes are recorded in the backbone's config (``pruned_heads``, ``num_hidden_layers``,
``dropped_layers``), so checkpoints, exports and ``predict`` reload the smaller model.  ``summary.json`` gets the
real parameter count, the sparsity, the heads per layer and the on-disk size of the weights.
"""
from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Optional, Union

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from ptm_app.checkpoint_io.reading import CKPT_KEY
from ptm_app.compression import heads as head_pruning
from ptm_app.compression.magnitude import MagnitudeSpec, magnitude_masks, prunable_weights, sparsity_of
from ptm_app.compression.students import layer_list_path
from ptm_app.errors import PtmError
from ptm_app.training.policy import BackbonePolicy

LayerChoice = Union[str, list[int]]


@dataclass
class LayerDropSpec:
    """Args:
        drop: ``top`` (the top ``k`` blocks), ``alternate`` (every other block from the top: L, L−2, … ``k`` of
            them) or a list of blocks (1..L) to remove.
        k: how many blocks ``top`` / ``alternate`` remove.
    """

    drop: LayerChoice = "top"
    k: int = 0


@dataclass
class HeadPruningSpec:
    """Args:
        target: the fraction of all attention heads to remove by the last round, in [0, 1).
        rounds: pruning rounds; round r removes heads until ``round(target · r / rounds · H)`` are gone.
        every: fine-tuning steps between rounds (round r runs at global step ``start_step + (r − 1) · every``).
        start_step: the global step of the first round.
        score_batches: held-out (validation) batches for the importance scores.
        heads: instead of scores, remove these heads at ``start_step``: ``{layer (0-based): [heads]}``.
    """

    target: float = 0.0
    rounds: int = 1
    every: int = 0
    start_step: int = 0
    score_batches: int = 4
    heads: Optional[dict[int, list[int]]] = None

    def __post_init__(self):
        if not 0.0 <= float(self.target) < 1.0:
            raise PtmError(f"pruning.heads.target={self.target} is outside [0, 1); give the fraction of heads to "
                           f"remove, such as 0.5")
        if self.rounds < 1 or self.score_batches < 1 or (self.rounds > 1 and self.every < 1):
            raise PtmError("pruning.heads: rounds and score_batches must be >= 1, and every >= 1 with several rounds")

    def round_step(self, r: int) -> int:
        return self.start_step + (r - 1) * self.every


@dataclass
class PruneSpec:
    layers: Optional[LayerDropSpec] = None
    heads: Optional[HeadPruningSpec] = None
    magnitude: Optional[MagnitudeSpec] = None


def as_prune_spec(value) -> PruneSpec:
    if isinstance(value, PruneSpec):
        return value
    value = asdict(value) if is_dataclass(value) else dict(value or {})
    parts = {"layers": LayerDropSpec, "heads": HeadPruningSpec, "magnitude": MagnitudeSpec}
    return PruneSpec(**{k: (cls(**v) if isinstance(v, dict) else v) for k, cls in parts.items()
                        if (v := value.get(k)) is not None})


# -- layer dropping (Sajjad et al. 2020) -------------------------------------------------------------------------------
def layers_to_drop(spec: LayerDropSpec, total: int) -> list[int]:
    """The blocks (1..L) ``spec`` removes; refuses layers that do not exist and dropping every layer."""
    if spec.drop in ("top", "alternate"):
        if not 0 <= spec.k < total:
            raise PtmError(f"pruning.layers.k={spec.k}: the model has {total} layers and must keep one; "
                           f"give 0 <= k < {total}")
        step = 1 if spec.drop == "top" else 2
        chosen = list(range(total, 0, -step))[:spec.k]
        if len(chosen) < spec.k:
            raise PtmError(f"pruning.layers: alternate dropping can remove at most {len(chosen)} of {total} layers; "
                           f"lower k")
        return sorted(chosen)
    if isinstance(spec.drop, str):
        raise PtmError(f"pruning.layers.drop={spec.drop!r}: use 'top', 'alternate' or a list of layers (1..L)")
    bad = [layer for layer in spec.drop if not isinstance(layer, int) or not 1 <= layer <= total]
    if bad:
        raise PtmError(f"pruning.layers.drop names layer(s) {bad}, but the model has layers 1..{total}; "
                       f"name layers that exist")
    if len(set(spec.drop)) >= total:
        raise PtmError(f"pruning.layers.drop removes all {total} layers; keep at least one")
    return sorted(set(spec.drop))


def drop_layers(model: nn.Module, drop: list[int]) -> nn.Module:
    """Remove blocks ``drop`` (1..L) from the model's block list; ``config.num_hidden_layers`` and
    ``config.dropped_layers`` (original numbers) record it; ``pruned_heads`` keys follow the renumbering."""
    path = layer_list_path(model)
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    blocks = getattr(parent, name)
    keep = [i for i in range(len(blocks)) if i + 1 not in set(drop)]
    setattr(parent, name, nn.ModuleList([blocks[i] for i in keep]))
    pruned = head_pruning.recorded_pruned(model) if getattr(model.config, "pruned_heads", None) else {}
    if pruned:
        model.config.pruned_heads = {str(keep.index(i)): v for i, v in pruned.items() if i in keep}
    for j, block in enumerate(getattr(parent, name)):  # caches index layers by position
        for module in block.modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = j
    original = list(getattr(model.config, "dropped_layers", None) or [])
    model.config.dropped_layers = original + drop
    model.config.num_hidden_layers = len(keep)
    return model


def on_disk_mb(model: nn.Module) -> float:
    """The size of the model's weights as a safetensors file (what ``export`` writes), in MiB."""
    from safetensors.torch import save_model

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        save_model(model, str(path))
        return round(path.stat().st_size / 2**20, 3)


class Pruning(BackbonePolicy):
    """Pruning as a policy of a task module (``model.init_args.pruning``; see the module docstring): the layers are
    dropped from the freshly built backbone (once: a rebuilt pruned model records ``dropped_layers``), the head
    rounds and the magnitude schedule run before each training batch, the masks are applied after each optimiser
    step, and a checkpoint's pruned heads are restructured before its weights load.  Head importance is the module's
    own task loss (Michel et al. 2019 §4.2), so any kind prunes.  The magnitude masks are ``module.magnitude_masks``
    (buffers: checkpointed, a resume is exact; export leaves them out)."""

    def __init__(self, spec: PruneSpec | dict):
        self.spec = as_prune_spec(spec)

    def style(self) -> str:
        return "pruning"

    # -- building: layers dropped once, masks created ------------------------------------------------------------
    def apply(self, module, fresh: bool, fitting: bool) -> None:
        if not fresh:
            return
        model, spec = module.backbone, self.spec.layers
        if spec is not None and not getattr(model.config, "dropped_layers", None):  # a rebuilt model already is
            drop = layers_to_drop(spec, model.config.num_hidden_layers)
            if drop:
                rank_zero_info(f"pruning: dropping layers {drop} of {model.config.num_hidden_layers}")
                drop_layers(model, drop)
        if self.spec.heads is not None:
            head_pruning.attention_blocks(model)  # neither BERT- nor Llama-style attention: one line, now
        if self.spec.magnitude is not None and getattr(module, "magnitude_masks", None) is None:
            module.magnitude_masks = nn.Module()
            for name, weight in prunable_weights(model).items():
                module.magnitude_masks.register_buffer(name.replace(".", "__"),
                                                       torch.ones_like(weight, dtype=torch.bool))

    # -- the schedule ----------------------------------------------------------------------------------------------
    def train_batch_start(self, module) -> None:
        step = module.global_step
        if self.spec.heads is not None:
            self.head_round(module, step)
        magnitude = self.spec.magnitude
        if magnitude is not None and step in magnitude.update_steps():
            self.update_masks(module, magnitude.sparsity_at(step))

    def optimizer_stepped(self, module) -> None:
        self.apply_masks(module)  # pruned weights stay exactly zero

    # -- heads ------------------------------------------------------------------------------------------------------
    def heads_target(self, module, step: int) -> int:
        """How many heads should be gone by global ``step``."""
        spec, config = self.spec.heads, module.backbone.config
        total = config.num_attention_heads * config.num_hidden_layers
        done = [r for r in range(1, spec.rounds + 1) if spec.round_step(r) <= step]
        return round(spec.target * total * (done[-1] if done else 0) / spec.rounds)

    def head_round(self, module, step: int) -> None:
        """Prune to this step's target if it is not met (idempotent: a resumed run repeats nothing)."""
        spec = self.spec.heads
        if module.trainer.world_size > 1:
            raise PtmError("pruning.heads slices weights while training, which DDP / FSDP / DeepSpeed cannot follow; "
                           "run head pruning on one device (trainer.devices: 1, no strategy overlay)")
        gone = sum(len(v) for v in head_pruning.recorded_pruned(module.backbone).values())
        if spec.heads is not None:
            if step >= spec.start_step and gone == 0:
                self.remove_heads(module, {int(k): list(v) for k, v in spec.heads.items()})
            return
        wanted = self.heads_target(module, step)
        if wanted <= gone:
            return
        layers = module.backbone.config.num_hidden_layers
        most = module.backbone.config.num_attention_heads * layers - layers
        if round(spec.target * (most + layers)) > most:
            raise PtmError(f"pruning.heads.target={spec.target} asks for {round(spec.target * (most + layers))} of "
                           f"{most + layers} heads, but each of the {layers} layers keeps one (at most {most}); "
                           f"lower the target")
        scores = self.head_scores(module)
        self.remove_heads(module, head_pruning.heads_to_prune(scores, wanted - gone))

    def head_scores(self, module) -> list[torch.Tensor]:
        """Michel et al.'s importance on the first ``score_batches`` validation batches, in eval mode, leaving the
        RNG as it was (so a resumed run draws the same dropout masks)."""
        loader = module.trainer.datamodule.val_dataloader()
        limit = self.spec.heads.score_batches

        def batches():
            for i, batch in enumerate(loader):
                if i >= limit:
                    return
                yield {k: v.to(module.device) if torch.is_tensor(v) else v for k, v in batch.items()}

        was_training = module.backbone.training
        module.backbone.eval()
        try:
            with torch.random.fork_rng(devices=[]), torch.enable_grad():
                return head_pruning.michel_scores(module.backbone, batches(),
                                                  lambda m, b: module.kind.loss(module(b), b))
        finally:
            module.backbone.train(was_training)

    def remove_heads(self, module, chosen: dict[int, list[int]]) -> None:
        """Slice the heads out of the weights and out of the optimiser's moments (same Parameter objects)."""
        before = sum(head_pruning.heads_per_layer(module.backbone))
        head_pruning.prune_heads(module.backbone, chosen, on_slice=lambda *a: self.slice_state(module, *a))
        after = head_pruning.heads_per_layer(module.backbone)
        rank_zero_info(f"pruning: step {module.global_step}: {before} -> {sum(after)} heads (per layer {after})")

    def slice_state(self, module, param: nn.Parameter, index: torch.Tensor, dim: int) -> None:
        """Slice what is kept per weight along with it: its magnitude mask and the optimiser's moments."""
        masks = getattr(module, "magnitude_masks", None)
        if masks is not None and param.dim() == 2:
            for name, weight in prunable_weights(module.backbone).items():
                if weight is param:
                    key = name.replace(".", "__")
                    masks.register_buffer(key, getattr(masks, key).index_select(dim, index.to(param.device)))
        if module._trainer is None:
            return
        for optimizer in module.trainer.optimizers:
            state = optimizer.state.get(param)
            for key, value in (state or {}).items():
                if torch.is_tensor(value) and value.shape == param.shape:
                    state[key] = value.index_select(dim, index.to(value.device)).contiguous()

    # -- magnitude ---------------------------------------------------------------------------------------------
    def update_masks(self, module, sparsity: float) -> None:
        spec = self.spec.magnitude
        weights = prunable_weights(module.backbone)
        for name, mask in magnitude_masks(weights, sparsity, spec.scope).items():
            getattr(module.magnitude_masks, name.replace(".", "__")).copy_(mask.bool())
        self.apply_masks(module)
        rank_zero_info(f"pruning: step {module.global_step}: magnitude sparsity {sparsity:.4f} ({spec.scope})")

    @torch.no_grad()
    def apply_masks(self, module) -> None:
        masks = getattr(module, "magnitude_masks", None)
        if masks is None:
            return
        for name, weight in prunable_weights(module.backbone).items():
            weight.mul_(getattr(masks, name.replace(".", "__")).to(weight.dtype))

    # -- checkpoints and the summary ---------------------------------------------------------------------------------
    def save(self, module, checkpoint: dict) -> None:
        checkpoint["hyper_parameters"]["pruning"] = asdict(self.spec)
        record = checkpoint[CKPT_KEY]
        record["training_only"] = [*record.get("training_only", []), "magnitude_masks."]  # export: zeros in weights

    def load(self, module, checkpoint: dict) -> None:
        """Give the backbone the checkpoint's pruned heads before Lightning loads the weights into it."""
        config = checkpoint.get("hyper_parameters", {}).get("backbone_config") or {}
        pruned = {int(k): list(v) for k, v in (config.get("pruned_heads") or {}).items()}
        if pruned and module.backbone is not None and not head_pruning.recorded_pruned(module.backbone):
            module.backbone.config.pruned_heads = {str(k): v for k, v in pruned.items()}
            head_pruning.restructure(module.backbone, on_slice=lambda *a: self.slice_state(module, *a))

    def summary(self, module) -> dict:
        """The pruned model's real size, for ``summary.json`` (its ``compression`` block)."""
        model = module.backbone
        facts = {"params": sum(p.numel() for p in model.parameters()), "model_mb": on_disk_mb(model),
                 "num_hidden_layers": model.config.num_hidden_layers,
                 "dropped_layers": list(getattr(model.config, "dropped_layers", None) or [])}
        if self.spec.heads is not None:
            facts["heads_per_layer"] = head_pruning.heads_per_layer(model)
            facts["pruned_heads"] = head_pruning.recorded_pruned(model)
        weights = prunable_weights(model)
        facts["sparsity"] = round(sparsity_of(weights.values()), 6)
        facts["nonzero_params"] = sum(int((p != 0).sum()) for p in model.parameters())
        return {"compression": facts}
