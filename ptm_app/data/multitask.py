"""Multitask data: several labelled task data modules behind one shared tokenizer, mixed batch by batch.

Each training batch comes from one task (MT-DNN, Liu et al. 2019 §3.1), the task drawn with the mixing rates
of T5 (Raffel et al. 2020 §3.5.2): *examples-proportional* ``r_m = min(e_m, K) / Σ_n min(e_n, K)`` (``K`` =
``size_limit``, none by default), *temperature-scaled* ``r_m ∝ (min(e_m, K) / Σ_n min(e_n, K))^(1/T)``, or
*uniform* ``r_m = 1/M``.  ``e_m`` counts the task's training units (examples; windows for QA).

The per-epoch task order is a pure function of ``(seed, epoch)``, and each task's own loader keeps its own
seeded order (``ResumableLoader``).  So a checkpoint only needs ``{epoch, consumed}``: the position of every
task inside its own data is recomputed from the task orders of the earlier epochs, and resuming at step N
replays nothing.
"""
from __future__ import annotations

import inspect
from itertools import chain
from typing import Any, Iterator, Literal, Optional

import lightning.pytorch as pl
import torch

from ptm_app.data.choice_data import MultipleChoiceDataModule
from ptm_app.data.collators import TaggedCollator
from ptm_app.data.contract import DataFacts, ModelHooks
from ptm_app.data.datamodules import TaskDataModule, check_batch_sizes
from ptm_app.data.loader import ResumableLoader
from ptm_app.data.qa_data import QADataModule
from ptm_app.data.tagging_data import TokenTaskDataModule
from ptm_app.data.tokenizer import TokenizerSpec, load_tokenizer
from ptm_app.errors import PtmError

Mixing = Literal["proportional", "temperature", "uniform"]
TASK_MODULES = {cls.__name__: cls for cls in (TaskDataModule, TokenTaskDataModule, QADataModule,
                                               MultipleChoiceDataModule)}


def mixing_rates(sizes: list[int], mixing: Mixing = "proportional", temperature: float = 2.0,
                 size_limit: Optional[int] = None) -> list[float]:
    """T5 §3.5.2 mixing rates for tasks with ``sizes`` training units (see the module docstring)."""
    if not sizes or min(sizes) <= 0:
        raise PtmError(f"multitask: every task needs training examples (sizes {sizes})")
    if mixing == "uniform":
        return [1.0 / len(sizes)] * len(sizes)
    capped = [min(s, size_limit) if size_limit else s for s in sizes]
    power = 1.0 if mixing == "proportional" else 1.0 / temperature
    if mixing == "temperature" and temperature <= 0:
        raise PtmError(f"multitask: temperature must be > 0 (got {temperature})")
    weights = [(c / sum(capped)) ** power for c in capped]
    return [w / sum(weights) for w in weights]


def task_kind(module: pl.LightningDataModule) -> str:
    """The task kind a task's data needs (``task_kinds.registry.TASK_KINDS``: head, loss, metrics): its ``kind``."""
    return module.kind


class TaskSchedule:
    """The task of every training batch of an epoch: ``length`` draws from the mixing rates, seeded by
    ``seed + epoch`` and the same on every rank (all ranks step the same task's head together)."""

    def __init__(self, rates: list[float], length: int, seed: int):
        self.rates, self.length, self.seed = rates, length, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:  # called by Lightning at every epoch start
        self.epoch = epoch

    def order(self, epoch: int) -> list[int]:
        gen = torch.Generator().manual_seed(self.seed + epoch)
        return torch.multinomial(torch.tensor(self.rates, dtype=torch.float64), self.length, replacement=True,
                                 generator=gen).tolist()


class MultitaskLoader:
    """Training batches of several tasks, one task per batch in ``TaskSchedule`` order, each drawn from that
    task's own ``ResumableLoader`` (which rolls over into its next epoch when it runs out).

    Stateful like ``ResumableLoader``: ``DataPositionCallback`` counts ``consumed`` batches and Lightning saves
    ``state_dict()`` in the checkpoint."""

    resumable = True

    def __init__(self, loaders: dict[str, ResumableLoader], rates: list[float], length: int, seed: int):
        self.loaders, self.names = loaders, list(loaders)
        self.sampler = TaskSchedule(rates, length, seed)
        self.consumed = 0
        self.restored = False
        self._resume: Optional[dict] = None
        self._starts: dict[int, list[int]] = {0: [0] * len(loaders)}

    def __len__(self) -> int:
        return self.sampler.length

    def batches_before(self, epoch: int) -> list[int]:
        """Batches each task served in epochs ``0 .. epoch-1`` (the task orders are fixed by the seed)."""
        known = max(e for e in self._starts if e <= epoch)
        totals = list(self._starts[known])
        for e in range(known, epoch):
            for task in self.sampler.order(e):
                totals[task] += 1
            self._starts[e + 1] = list(totals)
        return totals

    def _stream(self, loader: ResumableLoader, served: int) -> Iterator[dict]:
        """The task's batches from its ``served``-th on, rolling over its epochs forever."""
        per_epoch = len(loader)
        epoch, offset = divmod(served, per_epoch)
        loader.load_state_dict({"epoch": epoch, "consumed": offset, "batch_size": loader.batch_size})
        while True:
            yield from loader
            epoch += 1
            loader.epoch_sampler.set_epoch(epoch)

    def _begin(self) -> int:
        """Where this epoch's iteration starts: the restored position once after a resume, else 0."""
        if self._resume is not None:
            self.sampler.set_epoch(self._resume["epoch"])
            self.consumed, self._resume = self._resume["consumed"], None
        else:
            self.consumed = 0
        return self.consumed

    def __iter__(self) -> Iterator[dict]:
        start = self._begin()
        epoch = self.sampler.epoch
        order = self.sampler.order(epoch)
        served = self.batches_before(epoch)
        for task in order[:start]:
            served[task] += 1
        streams = [self._stream(self.loaders[name], served[i]) for i, name in enumerate(self.names)]
        for task in order[start:]:
            yield next(streams[task])

    def state_dict(self) -> dict:
        return {"epoch": self.sampler.epoch, "consumed": self.consumed, "length": self.sampler.length,
                "rates": list(self.sampler.rates)}

    def load_state_dict(self, state: dict) -> None:
        if state.get("length") != self.sampler.length or not torch.allclose(
                torch.tensor(state.get("rates", [])), torch.tensor(self.sampler.rates)):
            raise PtmError("cannot resume: the checkpoint's multitask mixing (tasks, rates or batches_per_epoch) "
                           "differs from this run's; resume with the same data settings")
        self.restored = True
        done = state["consumed"] >= self.sampler.length
        self._resume = {"epoch": state["epoch"] + done, "consumed": 0 if done else state["consumed"]}


class MultitaskDataModule(pl.LightningDataModule):
    """Several task data modules (``TaskDataModule``, ``TokenTaskDataModule``, ``QADataModule``) with one
    tokenizer; training batches mixed by ``mixing``, one validation/test loader per task.

    Args:
        tokenizer: shared by every task (a trained one is trained on all the tasks' training texts).
        tasks: task name → ``{class_path: TaskDataModule | TokenTaskDataModule | QADataModule, init_args: {...}}``
            (``tokenizer`` comes from here; ``batch_size``/``eval_batch_size``/``num_workers``/``seed`` default
            to this module's).
        mixing: ``proportional``, ``temperature`` or ``uniform`` (T5 §3.5.2).
        temperature: T of temperature-scaled mixing (T5 tried 2, 4, 8).
        size_limit: K, the cap on a task's size in the proportional and temperature rates.
        batches_per_epoch: training batches per epoch; default the sum of the tasks' batches per epoch.
    """

    prepare_data_per_node = False  # like the task modules: global rank 0 tokenizes every task once

    def __init__(self, tokenizer: TokenizerSpec, tasks: dict[str, dict], mixing: Mixing = "proportional",
                 temperature: float = 2.0, size_limit: Optional[int] = None, batches_per_epoch: Optional[int] = None,
                 batch_size: int = 32, eval_batch_size: Optional[int] = None, num_workers: int = 0, seed: int = 1234):
        super().__init__()
        check_batch_sizes(batch_size, eval_batch_size)
        if not tasks:
            raise PtmError("multitask: data.init_args.tasks is empty; give at least two named tasks")
        self.tokenizer_spec, self.mixing, self.temperature = tokenizer, mixing, temperature
        self.size_limit, self.batches_per_epoch, self.seed = size_limit, batches_per_epoch, seed
        shared = {"batch_size": batch_size, "eval_batch_size": eval_batch_size, "num_workers": num_workers,
                  "seed": seed}
        self.tasks = {name: _task_module(name, spec, tokenizer, shared) for name, spec in tasks.items()}
        self.tokenizer = None
        self.max_length = max(getattr(t, "max_length", 0) for t in self.tasks.values())
        self.model_hooks: Optional[ModelHooks] = None  # from data.contract.connect
        self._attached = False

    def load_tokenizer(self):
        if self.tokenizer is None:
            corpora = [task._tokenizer_corpus() for task in self.tasks.values()]
            texts = lambda: chain.from_iterable(corpus() for corpus, _ in corpora)  # noqa: E731
            self.tokenizer = load_tokenizer(self.tokenizer_spec, texts, "+".join(key for _, key in corpora))
            for task in self.tasks.values():
                task.tokenizer = self.tokenizer
        return self.tokenizer

    def prepare_data(self) -> None:
        self.load_tokenizer()
        for task in self.tasks.values():
            task.prepare_data()

    def setup(self, stage: Optional[str] = None) -> None:
        self.load_tokenizer()
        for task in self.tasks.values():
            task.setup(stage)

    def facts(self) -> DataFacts:
        """What the multitask module may know: the shared tokenizer, each task's kind and labels, its records."""
        return DataFacts(tokenizer=self.load_tokenizer, max_length=self.max_length, task_specs=self.task_specs,
                         task_records=lambda task, split: self.tasks[task].records(split))

    def connect_model(self, hooks: ModelHooks) -> None:
        self.model_hooks = hooks

    def task_specs(self) -> dict[str, dict[str, Any]]:
        """Per task: its kind and label names (what the model needs to build one head per task; None for data
        without a label set: regression values, QA spans)."""
        return {name: {"kind": task_kind(task), "labels": (task.label_set() or None) if hasattr(task, "label_set")
                       else None} for name, task in self.tasks.items()}

    def _attach(self) -> None:
        """Give every task the trainer (rank, world size) and the model's collator for its kind."""
        if self._attached:
            return
        if self.model_hooks is None or self.model_hooks.task_collator is None:
            raise PtmError("MultitaskDataModule needs a multitask module's collators (model.class_path: "
                           "MultitaskModule); connect them with ptm_app.data.contract.connect(model, data)")
        for name, task in self.tasks.items():
            task.trainer = self.trainer
            task.collate_fn = TaggedCollator(self.model_hooks.task_collator(task_kind(task), self.tokenizer), name)
        self._attached = True

    def rates(self) -> list[float]:
        sizes = [len(task.datasets["train"]) for task in self.tasks.values()]
        return mixing_rates(sizes, self.mixing, self.temperature, self.size_limit)

    def train_dataloader(self) -> MultitaskLoader:
        self._attach()
        loaders = {name: task.train_dataloader() for name, task in self.tasks.items()}
        length = self.batches_per_epoch or sum(len(loader) for loader in loaders.values())
        return MultitaskLoader(loaders, self.rates(), length, self.seed)

    def _eval_loaders(self, split: str) -> list:
        self._attach()
        return [task._eval_loader(split) for task in self.tasks.values()]

    def val_dataloader(self) -> list:
        return self._eval_loaders("validation")

    def test_dataloader(self) -> list:
        return self._eval_loaders("test")

    def predict_dataloader(self):
        raise PtmError("a multitask run does not predict; fine-tune one task from its checkpoint "
                       "(model.init_args.init_from) and predict with that run")


def _task_module(name: str, spec: dict, tokenizer: TokenizerSpec, shared: dict) -> pl.LightningDataModule:
    if not isinstance(spec, dict) or "class_path" not in spec:
        raise PtmError(f"multitask task '{name}': give {{class_path: {' | '.join(TASK_MODULES)}, init_args: {{...}}}}")
    cls = TASK_MODULES.get(str(spec["class_path"]).rpartition(".")[2])
    if cls is None:
        raise PtmError(f"multitask task '{name}': unknown class_path '{spec['class_path']}'; "
                       f"use one of {', '.join(TASK_MODULES)}")
    return nested_data_module(cls, spec.get("init_args"), shared, tokenizer, f"multitask task '{name}'")


def nested_data_module(cls, args: Optional[dict], shared: dict, tokenizer: TokenizerSpec, where: str):
    """``cls(tokenizer=tokenizer, **args)`` with the ``shared`` settings as defaults; an option ``cls`` does not
    take is one line naming ``where`` and the options there are."""
    args = dict(args or {})
    allowed = set(inspect.signature(cls).parameters) - {"tokenizer"}
    unknown = sorted(set(args) - allowed)
    if unknown:
        raise PtmError(f"{where}: unknown option '{unknown[0]}' for {cls.__name__}; "
                       f"the options are {', '.join(sorted(allowed))}")
    for key, value in shared.items():
        args.setdefault(key, value)
    return cls(tokenizer=tokenizer, **args)
