"""``torch.compile`` as a callback (``trainer.callbacks: [TorchCompile]``, ``configs/memory/compile.yaml``).

Regional compilation (PyTorch recipe "Reducing torch.compile cold start compilation time with regional
compilation"): every repeated transformer block (transformers' ``GradientCheckpointingLayer``: ``BertLayer``,
``GPT2Block`` ...) is compiled in place with ``nn.Module.compile()``.  Identical blocks share one compiled graph,
so the cold compile costs one block, not the whole model.  Blocks rather than ``.backbone`` because every code path
runs them, while several modules call past ``backbone.__call__`` (the sparse MLM head and SimCSE call
``backbone.base_model``; ELECTRA's generator is a second model).  Models without such blocks (XLNet, ALBERT, XLM,
the ELMo BiLSTM) compile each transformers model's base model whole.

In place means no ``_orig_mod.`` wrapper: parameter names and ``state_dict`` keys are unchanged, so checkpoints,
``--ckpt_path last``, ``export`` and ``load_from_checkpoint`` (into an uncompiled module) work as without compile;
peft and adapter layers inside the blocks are compiled with them, and so is transformers' gradient checkpointing
(it checkpoints inside the block's forward, which dynamo traces).  DDP and FSDP2 (``configs/strategy/fsdp.yaml``:
the recommended per-block compile under ``fully_shard``) work; DeepSpeed and Lightning's FSDP1 are refused, as is a
CPU without a C++ compiler (inductor writes C++ kernels there).  Compiled dropout draws from inductor's own random
stream, so with dropout > 0 a compiled run's losses are not the eager run's.  A change of ``requires_grad`` (the
unfreezing schedules) recompiles the blocks once per stage.

Caches: inductor's FX graph, AOTAutograd and kernel caches go to ``cache_dir`` (``TORCHINDUCTOR_CACHE_DIR``),
so the next run of the same model compiles in seconds (docs/design.md "Platform notes" §8: 34 s cold, 3.5 s warm).  Inductor keeps
its precompiled C++ headers (~150 MB) in ``<tmp>/torchinductor_<user>`` whatever the setting.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, Optional

from lightning.pytorch.callbacks import Callback
from torch import nn

from ptm_app.errors import PtmError
from ptm_app.paths import cache_root

Mode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]


def compile_units(module: nn.Module) -> list[nn.Module]:
    """What ``TorchCompile`` compiles: the transformer blocks, else every transformers model's base model."""
    from transformers import PreTrainedModel
    from transformers.modeling_layers import GradientCheckpointingLayer

    blocks = [m for m in module.modules() if isinstance(m, GradientCheckpointingLayer)]
    if blocks:
        inner = {id(sub) for b in blocks for sub in b.modules() if sub is not b}
        return [b for b in blocks if id(b) not in inner]  # outermost only
    models = [m.base_model for m in module.modules() if isinstance(m, PreTrainedModel)]
    unique = list({id(m): m for m in models}.values())
    inner = {id(sub) for m in unique for sub in m.modules() if sub is not m}
    return [m for m in unique if id(m) not in inner]


def default_cache_dir() -> Path:
    """``$TORCHINDUCTOR_CACHE_DIR`` if the user set it, else ``<PTM cache>/torch_compile``."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir as torch_default

    env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if env and os.path.abspath(env) != os.path.abspath(torch_default()):  # torch writes its default there too
        return Path(env)
    return cache_root() / "torch_compile"


class TorchCompile(Callback):
    """Compile the module's transformer blocks in place with ``torch.compile`` (see the module docstring).

    Args:
        mode: ``torch.compile`` mode; ``reduce-overhead`` (CUDA graphs) needs a GPU.
        dynamic: ``torch.compile(dynamic=...)``; None = compile static shapes, recompile dynamic on a new length.
        fullgraph: fail on a graph break instead of running the break eagerly.
        cache_dir: inductor's cache directory (``TORCHINDUCTOR_CACHE_DIR``); default
            ``$TORCHINDUCTOR_CACHE_DIR`` if set, else ``<PTM cache>/torch_compile``.
    """

    def __init__(self, mode: Mode = "default", dynamic: Optional[bool] = None, fullgraph: bool = False,
                 cache_dir: Optional[str] = None):
        self.mode, self.dynamic, self.fullgraph = mode, dynamic, fullgraph
        self.cache_dir = Path(cache_dir).expanduser().resolve() if cache_dir else None
        self.compiled: list[str] = []  # names of the compiled modules, for the log and the tests

    def setup(self, trainer, pl_module, stage: str) -> None:
        from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy

        if isinstance(trainer.strategy, (DeepSpeedStrategy, FSDPStrategy)):  # FSDP2 (our FSDP preset) is fine
            raise PtmError(f"TorchCompile is not supported with {type(trainer.strategy).__name__} (untested: ZeRO and "
                           f"FSDP1 hook into parameters); remove the TorchCompile callback, or use "
                           f"configs/strategy/fsdp.yaml (FSDP2) or ddp")
        on_cpu = trainer.strategy.root_device.type == "cpu"
        if self.mode == "reduce-overhead" and on_cpu:
            raise PtmError("TorchCompile(mode='reduce-overhead') is CUDA graphs, which need a GPU; "
                           "on a CPU use mode: default or max-autotune-no-cudagraphs")
        if on_cpu:
            _check_cpp_compiler()
        directory = self.cache_dir or default_cache_dir()
        directory.mkdir(parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory)  # read by inductor at every cache access
        self.cache_dir = directory

    def on_fit_start(self, trainer, pl_module) -> None:
        self._compile(pl_module)

    def on_validation_start(self, trainer, pl_module) -> None:
        self._compile(pl_module)

    def on_test_start(self, trainer, pl_module) -> None:
        self._compile(pl_module)

    def on_predict_start(self, trainer, pl_module) -> None:
        self._compile(pl_module)

    def _compile(self, pl_module) -> None:
        names = {id(m): n for n, m in pl_module.named_modules()}
        for unit in compile_units(pl_module):
            if unit._compiled_call_impl is None:  # idempotent: fit compiles once, validation reuses it
                unit.compile(mode=self.mode, dynamic=self.dynamic, fullgraph=self.fullgraph)
                self.compiled.append(names.get(id(unit), type(unit).__name__))
        if not self.compiled:
            raise PtmError(f"TorchCompile found nothing to compile in {type(pl_module).__name__} "
                           f"(no transformers model); remove the TorchCompile callback")


def _check_cpp_compiler() -> None:
    """Inductor on a CPU writes C++ kernels: refuse early, in one line, without a compiler."""
    from torch._inductor import exc
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        get_cpp_compiler()
    except exc.InvalidCxxCompiler:
        raise PtmError("TorchCompile: no C++ compiler found (torch.compile's inductor needs g++ or clang++ "
                       "on a CPU); install g++ (or set CXX), or remove the TorchCompile callback") from None
