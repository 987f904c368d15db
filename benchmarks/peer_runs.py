"""Child process for the peer candidates: the transformers ``Trainer`` and a bare PyTorch loop.

``python -m benchmarks.peer_runs SPEC.json``, ``spec["kind"]`` one of:

- ``hf_pretrain``: ``Trainer`` + ``DataCollatorForLanguageModeling`` as ``examples/pytorch/language-modeling/run_mlm.py``
  sets them up: rows of a fixed-length block (``group_texts`` output: ``input_ids``, ``token_type_ids``,
  ``attention_mask``, ``special_tokens_mask`` as Python lists, which is what a ``datasets`` row gives),
  ``mlm_probability=0.15``, the model from ``AutoModelForMaskedLM.from_config``, ``--bf16`` as a flag.
- ``bare_pretrain``: the same model and blocks in a plain loop: DataLoader → forward → backward →
  ``clip_grad_norm_`` → AdamW step → LR scheduler → ``zero_grad``.  The floor for framework overhead.
- ``hf_finetune``: ``AutoModelForSequenceClassification`` on the tweets with ``DataCollatorWithPadding``
  (dynamic padding), optionally with ``train_sampling_strategy="group_by_length"`` (its ``LengthGroupedSampler``),
  then ``trainer.evaluate`` for the validation accuracy.

No Lightning is imported here, so a candidate's peak RSS is its own.  The blocks come from the ``.npy`` file
the harness cut with ptm_app's packing (every candidate trains on the same blocks).

The GPU benchmark (``benchmarks/gpu_bench.py``) runs the two pre-training kinds with ``device: cuda`` and
``best_flags``: the ``Trainer`` with its fastest settings (bf16, ``optim="adamw_torch_fused"``,
``torch_compile=True``, loader workers with pinned memory, and ``logging_nan_inf_filter=False``, which otherwise
reads every step's loss back from the GPU), the bare loop with bf16 autocast, the fused AdamW, ``torch.compile`` of
the model, the same loader settings and non-blocking copies.  Counts are then taken from the batch the step trains
on (the collators run in the loader's worker processes) and read back after the last step (``StepClock``).
"""
from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

import numpy as np
import torch

from benchmarks.clock import StepClock


class CountingCollator:
    """Wraps a collator and queues each batch's (samples, non-padding tokens, positions) for the step clock."""

    def __init__(self, collate):
        self.collate = collate
        self.queue: collections.deque = collections.deque()

    def __call__(self, features):
        batch = self.collate(features)
        mask = batch.get("attention_mask")
        ids = batch["input_ids"]
        self.queue.append((ids.shape[0], int(mask.sum()) if mask is not None else ids.numel(), ids.numel()))
        return batch


def _hf_clock(clock: StepClock, queue: collections.deque):
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            clock.mark("fit_start")

        def on_step_begin(self, args, state, control, **kwargs):
            clock.mark("first_step_start")

        def on_step_end(self, args, state, control, **kwargs):  # after optimizer, scheduler and zero_grad
            clock.tick(*queue.popleft())

    return Clock()


def _describe(clock: StepClock, model, **extra) -> None:
    clock.extra.update(model=type(model).__name__, params=sum(p.numel() for p in model.parameters()),
                       attn=model.config._attn_implementation, **extra)


def _device(spec: dict) -> str:
    return spec.get("device", "cpu")


def _training_args(spec: dict, **overrides):
    from transformers import TrainingArguments

    if spec.get("best_flags"):  # the Trainer's fastest settings (module docstring)
        workers = spec.get("num_workers", 0)
        overrides = {"optim": "adamw_torch_fused", "torch_compile": bool(spec.get("compile")),
                     "dataloader_num_workers": workers, "dataloader_persistent_workers": workers > 0,
                     "dataloader_pin_memory": _device(spec) == "cuda", "logging_nan_inf_filter": False, **overrides}
    return TrainingArguments(
        output_dir=str(Path(spec["out"]).with_suffix(".hf")), max_steps=spec["steps"],
        per_device_train_batch_size=spec["batch_size"], learning_rate=spec["lr"], weight_decay=spec["weight_decay"],
        warmup_steps=spec["warmup"], lr_scheduler_type="linear", bf16=spec["precision"] == "bf16",
        fp16=spec["precision"] == "fp16", use_cpu=_device(spec) == "cpu", save_strategy="no", report_to="none",
        seed=spec["seed"], **overrides)


class BlockRows(torch.utils.data.Dataset):
    """``group_texts`` rows as a ``datasets`` row gives them (lists), with the tokenizer's special-tokens mask."""

    def __init__(self, blocks: np.ndarray, special_ids: list[int]):
        self.blocks, self.special = blocks, np.asarray(special_ids)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict:
        ids = self.blocks[i]
        return {"input_ids": ids.tolist(), "token_type_ids": [0] * len(ids), "attention_mask": [1] * len(ids),
                "special_tokens_mask": np.isin(ids, self.special).astype(int).tolist()}


def _mlm_model(spec: dict):
    from ptm_app.backbones.build import build_backbone  # the same builder ptm_app uses: the same model

    torch.manual_seed(spec["seed"])
    return build_backbone("masked_lm", None, spec["backbone_config"])


def _counting_trainer(queue: collections.deque):
    """A ``Trainer`` that queues the counts of the batch each training step trains on (for the step clock)."""
    from transformers import Trainer

    class CountingTrainer(Trainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            ids, mask = inputs["input_ids"], inputs.get("attention_mask")
            queue.append((ids.shape[0], mask.sum() if mask is not None else ids.numel(), ids.numel()))
            return super().training_step(model, inputs, num_items_in_batch)

    return CountingTrainer


def _precision_label(spec: dict) -> str:
    return f"{spec['precision']} flag" if spec["precision"] in ("bf16", "fp16") else "fp32"


def hf_pretrain(spec: dict, clock: StepClock) -> None:
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling, set_seed

    set_seed(spec["seed"])
    clock.cuda = _device(spec) == "cuda"
    tokenizer = AutoTokenizer.from_pretrained(spec["tokenizer"])
    blocks = np.load(spec["blocks"])
    model = _mlm_model(spec)
    queue: collections.deque = collections.deque()  # filled by the training steps (the collator may run in workers)
    trainer = _counting_trainer(queue)(
        model=model, args=_training_args(spec, max_grad_norm=spec["clip"]),
        train_dataset=BlockRows(blocks, tokenizer.all_special_ids),
        data_collator=DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm_probability=0.15),
        processing_class=tokenizer, callbacks=[_hf_clock(clock, queue)])
    trainer.train()
    _describe(clock, model, precision=_precision_label(spec), compiled=bool(spec.get("best_flags") and spec.get("compile")))


def bare_pretrain(spec: dict, clock: StepClock) -> None:
    from ptm_app.data.collators import MLMCollator
    from ptm_app.data.datasets import BlockDataset
    from ptm_app.training.optim import OptimConfig, build_optimizer

    cfg = spec["backbone_config"]
    device = torch.device(_device(spec))
    clock.cuda = device.type == "cuda"
    blocks = np.load(spec["blocks"])
    model = _mlm_model(spec).to(device)
    model.train()
    collate = MLMCollator(pad_token_id=cfg["pad_token_id"], mask_token_id=spec["mask_token_id"],
                          special_ids=tuple(spec["special_ids"]), vocab_size=cfg["vocab_size"], seed=spec["seed"])
    workers = spec.get("num_workers", 0)
    loader = torch.utils.data.DataLoader(BlockDataset(list(blocks)), batch_size=spec["batch_size"], shuffle=True,
                                         collate_fn=collate, generator=torch.Generator().manual_seed(spec["seed"]),
                                         num_workers=workers, persistent_workers=workers > 0,
                                         pin_memory=device.type == "cuda")
    optim = build_optimizer(model, OptimConfig(lr=spec["lr"], weight_decay=spec["weight_decay"],
                                               warmup=spec["warmup"]), spec["steps"])
    optimizer, scheduler = optim["optimizer"], optim["lr_scheduler"]["scheduler"]
    forward = torch.compile(model) if spec.get("compile") else model  # the same parameters, compiled
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(spec["precision"])
    scaler = torch.amp.GradScaler(device.type) if dtype is torch.float16 else None
    clock.mark("fit_start")
    for step, batch in zip(range(spec["steps"]), loader):
        clock.mark("first_step_start")
        mask = batch["attention_mask"]
        counts = (mask.shape[0], mask.sum(), mask.numel())  # on the host's copy: no read-back from the GPU
        batch = {k: batch[k].to(device, non_blocking=True) for k in ("input_ids", "attention_mask", "labels")}
        with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = forward(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           labels=batch["labels"]).loss
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(optimizer)
        if spec["clip"]:
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec["clip"])
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        clock.tick(*counts)
    _describe(clock, model, precision=f"{spec['precision']} autocast" if dtype is not None else "fp32",
              compiled=bool(spec.get("compile")))


def _read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def hf_finetune(spec: dict, clock: StepClock) -> None:
    from transformers import (AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, Trainer,
                              set_seed)

    set_seed(spec["seed"])
    tokenizer = AutoTokenizer.from_pretrained(spec["backbone"])
    train, val = _read_jsonl(spec["train"]), _read_jsonl(spec["validation"])
    labels = sorted({r["label"] for r in train})

    def encode(rows):
        enc = tokenizer([r["text"] for r in rows], truncation=True, max_length=spec["max_length"])
        return [{**{k: enc[k][i] for k in enc.keys()}, "labels": labels.index(r["label"])} for i, r in enumerate(rows)]

    model = AutoModelForSequenceClassification.from_pretrained(spec["backbone"], num_labels=len(labels))
    counter = CountingCollator(DataCollatorWithPadding(tokenizer))

    def accuracy(pred):
        return {"acc": float((np.argmax(pred.predictions, -1) == pred.label_ids).mean())}

    # transformers 5 names its length grouping train_sampling_strategy="group_by_length" (LengthGroupedSampler)
    sampling = "group_by_length" if spec.get("group_by_length") else "random"
    trainer = Trainer(model=model, args=_training_args(spec, per_device_eval_batch_size=spec["batch_size"],
                                                       train_sampling_strategy=sampling),
                      train_dataset=encode(train), eval_dataset=encode(val), data_collator=counter,
                      processing_class=tokenizer, compute_metrics=accuracy, callbacks=[_hf_clock(clock, counter.queue)])
    trainer.train()
    counter.queue.clear()
    clock.extra["val"] = {"val/acc": trainer.evaluate()["eval_acc"], "val/examples": len(val)}
    _describe(clock, model, precision="bf16 flag" if spec["precision"] == "bf16" else "fp32")


KINDS = {"hf_pretrain": hf_pretrain, "bare_pretrain": bare_pretrain, "hf_finetune": hf_finetune}


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    clock = StepClock()
    KINDS[spec["kind"]](spec, clock)
    clock.write(spec["out"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
