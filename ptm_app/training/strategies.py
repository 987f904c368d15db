"""Strategy presets that run on CPU (gloo) and CUDA alike: FSDP2 and DeepSpeed (``configs/strategy/*.yaml``).

Lightning refuses ``strategy="fsdp"`` and ``"deepspeed"`` without a GPU (``accelerator_connector`` and
``DeepSpeedStrategy.setup_environment``).  DDP needs nothing: ``strategy: ddp`` runs on gloo as is.

- ``FSDP`` is Lightning's ``ModelParallelStrategy`` (FSDP2, ``torch.distributed.fsdp.fully_shard``), which has
  no CUDA check.  We prefer it to an FSDP1 subclass: FSDP1 on CPU needs a ``device_id`` override and segfaults
  saving a full state dict (docs/design.md "Platform notes" §5.3), and it refuses frozen and trainable parameters in one flat
  parameter ("uniform requires_grad", so LoRA needs ``use_orig_params=True``); FSDP2 shards per parameter, so
  LoRA and adapters need nothing special.  ``ModelParallelStrategy`` leaves the sharding to the module's
  ``configure_model``; here the strategy does it for every ptm_app module: one ``fully_shard`` unit per
  transformer block (the backbone's ``_no_split_modules``), the LightningModule as the root unit (embeddings,
  heads, adapters), and every step goes through the root's ``forward`` (Lightning's forward redirection, as its
  FSDP1 strategy does), so heads used outside the backbone's forward are unsharded too.  ``sharding: hybrid``
  is HSDP: shard inside a node, replicate across nodes (a 2-D device mesh, nodes × devices).
  Checkpoints are ``torch.distributed.checkpoint`` directories; ``export`` consolidates them.
- ``DeepSpeed`` is Lightning's ``DeepSpeedStrategy``; on a CPU it makes the three changes of docs/design.md
  "Platform notes" §5.4 (skip the CUDA check and the device-index check, pass the local rank as DeepSpeed's device rank),
  sets ``DS_ACCELERATOR=cpu`` and, for ZeRO-3, destroys the process group at teardown (DeepSpeed's CPU
  backend otherwise aborts at exit).  On CUDA every method is Lightning's own but one: the model is built whole
  and partitioned by ``deepspeed.initialize``, not under ``deepspeed.zero.Init``, where transformers' weight
  init fails on ZeRO-3's empty partitions.  ZeRO-Offload (``offload_optimizer``, ``offload_parameters``) runs
  on a CPU too: DeepSpeed's CPU accelerator keeps the offloaded fp32 partitions in host memory, and our torch
  AdamW steps them (``zero_force_ds_cpu_optimizer: false``; otherwise DeepSpeed insists on its DeepSpeedCPUAdam,
  whose ``cpu_adam`` op does build here, ~3 min of ninja/g++ into ``TORCH_EXTENSIONS_DIR``, and differs from
  torch's AdamW by ~1e-6 per weight).  So the losses equal the other strategies' (tests/scale).

Both save sharded checkpoints from every rank, so ``cli`` gives them no ``CheckpointIO`` plugin; the saves are
atomic (``AtomicShardedSave``).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, ModelParallelStrategy, Strategy
from lightning.pytorch.strategies import FSDPStrategy as _LightningFSDP

from ptm_app.errors import PtmError
from ptm_app.errors import require_deepspeed

SHARDED = (ModelParallelStrategy, DeepSpeedStrategy, _LightningFSDP)


def is_sharded(strategy: Any) -> bool:
    """True for strategies that write checkpoints from every rank (a directory), not through ``CheckpointIO``."""
    if isinstance(strategy, Strategy):
        return isinstance(strategy, SHARDED)
    return isinstance(strategy, str) and strategy.startswith(("fsdp", "deepspeed"))


def check_checkpoint_layout(ckpt_path: Any, strategy: Any) -> None:
    """Refuse, in one line, a sharded checkpoint directory (FSDP's ``torch.distributed.checkpoint`` files,
    DeepSpeed's ``latest`` + tag directory) given to a strategy that cannot read it: a single-device or DDP run
    reads one file, and FSDP and DeepSpeed each read only their own layout."""
    path = Path(str(ckpt_path)) if ckpt_path else None
    if path is None or not path.is_dir():
        return
    layout = "DeepSpeed" if (path / "latest").is_file() else "FSDP"
    if is_sharded(strategy):
        name = type(strategy).__name__ if isinstance(strategy, Strategy) else str(strategy)
        if ("deepspeed" in name.lower()) == (layout == "DeepSpeed"):
            return
        raise PtmError(f"--ckpt_path {path} is a {layout} checkpoint directory, but this run's strategy is {name}; "
                       f"resume it with the strategy that wrote it (configs/strategy/), or export it (python main.py "
                       f"export --ckpt_path {path} --output_dir DIR) and start from that")
    raise PtmError(f"--ckpt_path {path} is a sharded ({layout}) checkpoint directory, which a single-process or DDP "
                   f"run cannot read; resume it with the strategy that wrote it (add its configs/strategy/ file), or "
                   f"export it (python main.py export --ckpt_path {path} --output_dir DIR) and start from that")


def transformer_blocks(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks of every transformers model inside ``module``, innermost first: the classes its
    ``_no_split_modules`` names and its ``GradientCheckpointingLayer``s; for a model that declares neither (ALBERT,
    XLM and XLNet in transformers 5) the entries of its per-layer module lists (``backbones.layers.block_paths``).
    Blocks holding a tied parameter (BERT's word embeddings are its MLM decoder) are left out: FSDP2 needs both
    users of a tied tensor in one unit, so these stay in the root unit.  An LSTM (the ELMo BiLM) has none."""
    from transformers import PreTrainedModel
    from transformers.modeling_layers import GradientCheckpointingLayer

    from ptm_app.backbones.layers import block_paths

    names: set[str] = set()
    for sub in module.modules():
        names.update(getattr(sub, "_no_split_modules", None) or ())
    candidates = [sub for sub in module.modules()
                  if type(sub).__name__ in names or isinstance(sub, GradientCheckpointingLayer)]
    if not candidates:
        for model in module.modules():
            n = getattr(getattr(model, "config", None), "num_hidden_layers", None)
            if isinstance(model, PreTrainedModel) and isinstance(n, int) and model.config.model_type != "ptm_bilstm_lm":
                paths = set(block_paths(model, n))
                candidates += [sub for path, sub in model.named_modules() if path in paths]
    uses = Counter(id(p) for _, p in module.named_parameters(remove_duplicate=False))
    seen: set[int] = set()
    blocks = []
    for sub in candidates:
        if id(sub) not in seen and all(uses[id(p)] == 1 for p in sub.parameters()):
            seen.add(id(sub))
            blocks.append(sub)
    order = {id(sub): i for i, sub in enumerate(module.modules())}
    return sorted(blocks, key=lambda sub: order[id(sub)])[::-1]  # fully_shard goes bottom-up


class AtomicShardedSave:
    """Sharded checkpoints replace the previous one atomically: a crash mid-save leaves it loadable.

    Every rank writes its shards into ``.<name>.tmp-<step>/`` next to the target (``write_shards``: the
    strategy's own save), a barrier, then global rank 0 flushes the files to disk and swaps the complete
    directory into place (``paths.replace_dir``: the old one renamed away, the new one in, the old one deleted),
    and a barrier after (the previous ``last.ckpt`` becomes ``last-1.ckpt`` only if it passes verification:
    ``checkpoint_io.writing.worth_keeping``).  ``--ckpt_path last`` and ``export`` therefore see the previous complete
    directory or the new complete one, never a mix (``paths.restore_replaced`` undoes a crash between the two
    renames).  Temp directories left by a crashed save are deleted by the next save to the same target.  This
    covers every ``trainer.save_checkpoint``: ``LastCheckpoint``'s ``last.ckpt`` and ``ModelCheckpoint``'s
    ``best.ckpt``.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options: Any = None) -> None:
        from ptm_app.checkpoint_io.reading import LAST, PREVIOUS, mark_verified
        from ptm_app.paths import fsync_tree, replace_dir
        from ptm_app.checkpoint_io.writing import worth_keeping

        target = Path(self.broadcast(str(filepath)))
        tmp = target.with_name(f".{target.name}.tmp-{checkpoint.get('global_step', 0)}")
        if self.is_global_zero:
            for stale in target.parent.glob(f".{target.name}.tmp-*"):
                shutil.rmtree(stale)
        self.barrier("ptm_app_save_begin")
        self.write_shards(checkpoint, tmp, storage_options)
        self.barrier("ptm_app_save_written")
        if self.is_global_zero:
            fsync_tree(tmp)
            keep = target.name == LAST and worth_keeping(target)  # a damaged last.ckpt never replaces last-1
            replace_dir(tmp, target, keep=target.with_name(PREVIOUS) if keep else None)
            mark_verified(target)
        self.barrier("ptm_app_save_committed")

    def write_shards(self, checkpoint: dict[str, Any], directory: Path, storage_options: Any = None) -> None:
        """This rank's part of the checkpoint, into ``directory``: Lightning's save for the strategy."""
        super().save_checkpoint(checkpoint, directory, storage_options)


class FSDP(AtomicShardedSave, ModelParallelStrategy):
    """Fully sharded data parallel (FSDP2) on CPU or GPU: ``sharding: full`` or ``hybrid`` (HSDP).

    Args:
        sharding: ``full`` shards parameters, gradients and optimizer states over every rank (ZeRO-3);
            ``hybrid`` shards inside a node and replicates across nodes (fewer slow inter-node all-gathers).
        reshard_after_forward: free the gathered block parameters after forward (less memory, one more
            all-gather in backward); False keeps them (ZeRO-2-like).
    """

    def __init__(self, sharding: Literal["full", "hybrid"] = "full", reshard_after_forward: bool = True,
                 process_group_backend: str | None = None):
        if sharding not in ("full", "hybrid"):
            raise PtmError(f"FSDP sharding '{sharding}' is unknown; use full or hybrid")
        super().__init__(process_group_backend=process_group_backend)
        self.sharding, self.reshard_after_forward = sharding, reshard_after_forward

    def setup_environment(self) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        Strategy.setup_environment(self)  # the accelerator; ModelParallelStrategy would build a TP mesh
        self._setup_distributed()
        nodes = self.num_nodes if self.sharding == "hybrid" else 1
        self._device_mesh = init_device_mesh(self.root_device.type, (nodes, self.world_size // nodes),
                                             mesh_dim_names=("replicate", "shard"))
        self.lightning_module._device_mesh = self._device_mesh

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def _fsdp_mesh(self):
        return self.device_mesh if self.sharding == "hybrid" else self.device_mesh["shard"]

    def setup(self, trainer) -> None:
        from torch.distributed.fsdp import FSDPModule, fully_shard

        module = self.lightning_module
        if not isinstance(module, FSDPModule):
            mesh = self._fsdp_mesh()
            blocks = transformer_blocks(module)
            if not blocks:
                raise PtmError(f"FSDP: no transformer blocks found in {type(module).__name__}; "
                               "use strategy ddp or a transformers backbone")
            for block in blocks:
                fully_shard(block, mesh=mesh, reshard_after_forward=self.reshard_after_forward)
            fully_shard(module, mesh=mesh, reshard_after_forward=False)
        super().setup(trainer)

    def load_checkpoint(self, checkpoint_path, weights_only=None) -> dict[str, Any]:
        """Lightning's loader, except for delta-only checkpoints (``delta_only``: the trainable tensors, the frozen
        base rebuilt from its source), which ``torch.distributed.checkpoint`` loads partially."""
        from ptm_app.checkpoint_io.reading import load_file, verify

        path = Path(self.broadcast(checkpoint_path))
        verify(path, trust=weights_only is False)  # torch.distributed.checkpoint unpickles .metadata with pickle
        meta = load_file(path / "meta.pt", trust=weights_only is False) if (path / "meta.pt").is_file() else {}
        if not meta.get("ptm_app", {}).get("delta_only"):
            return super().load_checkpoint(checkpoint_path, weights_only)
        from torch.distributed.checkpoint import DefaultLoadPlanner, load
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict, set_model_state_dict,
                                                             set_optimizer_state_dict)

        optimizers = {f"optimizer_{i}": opt for i, opt in enumerate(self.optimizers)}
        state = {"state_dict": get_model_state_dict(self.model),
                 **{key: get_optimizer_state_dict(self.model, opt) for key, opt in optimizers.items()}}
        load(state, checkpoint_id=path, planner=DefaultLoadPlanner(allow_partial_load=True))
        set_model_state_dict(self.model, state["state_dict"], options=StateDictOptions(strict=False))
        for key, opt in optimizers.items():
            set_optimizer_state_dict(self.model, opt, state[key])
        return meta

    # every step enters through the root module's forward, so FSDP2 gathers the root unit (embeddings, heads)
    def _step(self, name: str, context, *args, **kwargs):
        with context():
            return self._forward_redirection(self.model, self.lightning_module, name, *args, **kwargs)

    def training_step(self, *args, **kwargs):
        return self._step("training_step", self.precision_plugin.train_step_context, *args, **kwargs)

    def validation_step(self, *args, **kwargs):
        return self._step("validation_step", self.precision_plugin.val_step_context, *args, **kwargs)

    def test_step(self, *args, **kwargs):
        return self._step("test_step", self.precision_plugin.test_step_context, *args, **kwargs)

    def predict_step(self, *args, **kwargs):
        return self._step("predict_step", self.precision_plugin.predict_step_context, *args, **kwargs)


class DeepSpeed(AtomicShardedSave, DeepSpeedStrategy):
    """DeepSpeed ZeRO (stage 1, 2, 3, optional CPU offload) on CPU or GPU; every argument is Lightning's
    ``DeepSpeedStrategy``'s.  On a CPU, offloading keeps ZeRO-3's numbers (the states are in host memory anyway)."""

    def __init__(self, stage: Literal[1, 2, 3] = 2, offload_optimizer: bool = False, offload_parameters: bool = False,
                 **kwargs: Any):
        require_deepspeed()
        self._on_cpu = not torch.cuda.is_available()
        if self._on_cpu:
            os.environ["DS_ACCELERATOR"] = "cpu"  # before deepspeed is imported; an empty value is an error
            # DeepSpeed JIT-compiles its shm_comm op on first use (~60 s): keep the build with the venv's torch
            os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
            kwargs.setdefault("process_group_backend", "gloo")
        super().__init__(stage=stage, offload_optimizer=offload_optimizer, offload_parameters=offload_parameters,
                         **kwargs)
        if offload_optimizer:  # our optimizer is torch's AdamW; DeepSpeed otherwise insists on its DeepSpeedCPUAdam
            self.config.setdefault("zero_force_ds_cpu_optimizer", False)

    def _cpu(self) -> bool:
        return self.root_device.type == "cpu"

    def load_checkpoint(self, checkpoint_path, weights_only=None) -> dict[str, Any]:
        """DeepSpeed unpickles its files with ``weights_only=False``: they are checked to be plain data first."""
        from ptm_app.checkpoint_io.reading import verify

        verify(Path(self.broadcast(str(checkpoint_path))), trust=weights_only is False)
        return super().load_checkpoint(checkpoint_path, weights_only)

    def setup_environment(self) -> None:
        if not self._cpu():
            return super().setup_environment()
        DDPStrategy.setup_environment(self)  # skips Lightning's CUDAAccelerator check

    def setup_distributed(self) -> None:
        if not self._cpu():
            return super().setup_distributed()
        from lightning.fabric.utilities.seed import reset_seed

        reset_seed()  # Lightning's order, without _validate_device_index_selection (a CPU has no index)
        self.set_world_ranks()
        self._init_deepspeed_distributed()
        reset_seed()  # the first init JIT-builds shm_comm, which draws from the global RNGs: same stream as DDP

    def _setup_model_and_optimizer(self, model, optimizer, lr_scheduler=None):
        if not self._cpu():
            return super()._setup_model_and_optimizer(model, optimizer, lr_scheduler)
        import deepspeed

        engine, ds_optimizer, _, _ = deepspeed.initialize(
            args=argparse.Namespace(device_rank=self.local_rank),  # Lightning passes root_device.index: None
            config=self.config, model=model, model_parameters=filter(lambda p: p.requires_grad, model.parameters()),
            optimizer=optimizer, lr_scheduler=lr_scheduler, dist_init_required=False)
        return engine, ds_optimizer

    def setup(self, trainer) -> None:
        module = self.lightning_module
        if getattr(module, "delta", None) is not None and getattr(module, "delta_only", False):
            # delta-only checkpoints: DeepSpeed saves the trainable tensors; the frozen base comes from its source
            self.exclude_frozen_parameters = True
            module.strict_loading = False
        super().setup(trainer)

    @contextmanager
    def model_sharded_context(self):
        """Build the backbone whole; ``deepspeed.initialize`` partitions it (ZeRO-3 included).  Under Lightning's
        ``deepspeed.zero.Init`` transformers' weight init indexes the empty partitioned tensors and fails
        (``init.zeros_(weight[padding_idx])``: IndexError) unless transformers' own ``HfDeepSpeedConfig`` is set."""
        yield

    def teardown(self) -> None:
        super().teardown()
        if self._on_cpu and self.zero_stage_3 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()  # else: "terminate called without an active exception"
