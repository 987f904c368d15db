"""Multitask learning with one shared delta (``MultitaskModule(delta=...)``): the encoder stays frozen and
bit-identical, only the delta and the per-task heads train, a delta-only checkpoint reloads onto a freshly built
encoder with the same outputs for every task, export gives the same outputs again, and a run from YAML through
main.py (sentiment + tagging + QA) resumes exactly."""
from __future__ import annotations

import pytest
import torch
import yaml
from torch.utils.data import DataLoader

from ptm_app.training.trainer import PtmTrainer
from ptm_app.adaptation.multitask import MultitaskModule
from ptm_app.inference.export import export_checkpoint, load_exported_module
from tests.adaptation.test_generation import tiny_bert_dir
from tests.adaptation.test_multitask import _config, _task_files
from tests.conftest import assert_resumes_exactly

TASKS = {"mood": {"kind": "sequence", "labels": ["neg", "pos"]}, "tags": {"kind": "token", "labels": ["N", "V", "X"]},
         "score": {"kind": "regression", "labels": None}}
DELTA_NAMES = {"houlsby": ("delta_adapters.",), "pals": ("delta_adapters.",), "lora": ("lora_A", "lora_B"),
               "prompt": ("prompt_encoder",), "prefix": ("prompt_encoder",), "bitfit": ("bias",)}
PROMPT_SIZE = 4


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return tiny_bert_dir(tmp_path_factory.mktemp("multitask_delta"))


def task_batch(task: str, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 3000, (4, 9), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    batch = {"task": task, "input_ids": ids * mask, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    if task == "mood":
        batch["labels"] = torch.tensor([0, 1, 1, 0])
    elif task == "tags":
        batch["labels"] = torch.randint(0, 3, (4, 9), generator=gen).masked_fill(mask == 0, -100)
    else:
        batch["labels"] = torch.rand(4, generator=gen)
    return batch


BATCHES = [task_batch(task, i) for i, task in enumerate(["mood", "tags", "score"] * 2)]


def build(encoder, method: str) -> MultitaskModule:
    torch.manual_seed(0)
    return MultitaskModule(backbone=str(encoder), tasks=TASKS, optim={"lr": 1e-2, "warmup": 0},
                           delta={"method": method, "r": 4, "bottleneck": 8, "num_virtual_tokens": PROMPT_SIZE}).build()


def outputs(module: MultitaskModule) -> list[torch.Tensor]:
    module.eval()
    with torch.no_grad():
        return [module(b) for b in BATCHES[:3]]


@pytest.mark.parametrize("method", ["houlsby", "pals", "lora", "prompt", "prefix", "bitfit"])
def test_one_shared_delta_and_the_heads_train_and_reload_from_a_delta_only_checkpoint(method, encoder, tmp_path):
    module = build(encoder, method)
    trainable = {n for n, p in module.backbone.named_parameters() if p.requires_grad}
    assert trainable and all(any(k in n for k in DELTA_NAMES[method]) for n in trainable), sorted(trainable)[:4]
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    trainer = PtmTrainer(max_steps=len(BATCHES), accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, DataLoader(BATCHES, batch_size=None))
    for name, param in module.named_parameters():
        if name.startswith("heads.") or name.removeprefix("backbone.") in trainable:
            if not name.endswith("key.bias") and ".pooler." not in name:  # no or round-off gradients only
                assert not torch.equal(param, before[name]), f"{name} did not move"
        else:
            assert torch.equal(param, before[name]), f"frozen {name} changed"
    want = outputs(module)
    assert want[0].shape == (4, 2) and want[1].shape == (4, 9, 3) and want[2].shape == (4,)  # no virtual positions

    trainer.save_checkpoint(tmp_path / "run.ckpt")
    ckpt = torch.load(tmp_path / "run.ckpt", weights_only=True)
    assert ckpt["ptm_app"]["delta_only"]
    saved = {k.removeprefix("backbone.") for k in ckpt["state_dict"] if k.startswith("backbone.")}
    assert saved == trainable and {k.split(".")[1] for k in ckpt["state_dict"] if k.startswith("heads.")} == set(TASKS)
    reloaded = MultitaskModule.load_from_checkpoint(tmp_path / "run.ckpt")
    for got, expected in zip(outputs(reloaded), want):
        assert torch.equal(got, expected)
    exported = load_exported_module(export_checkpoint(tmp_path / "run.ckpt", tmp_path / "export"))
    for got, expected in zip(outputs(exported), want):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_houlsby_multitask_from_yaml_resumes_exactly(encoder, tmp_path):
    dirs = _task_files(tmp_path / "data")
    cfg = yaml.safe_load(_config(tmp_path, dirs, steps=6).read_text())
    cfg["model"]["init_args"] = {"backbone": str(encoder), "optim": {"lr": 1e-3, "warmup": 2},
                                 "delta": {"method": "houlsby", "bottleneck": 8, "dropout": 0.1}}
    cfg["data"]["init_args"]["tokenizer"] = {"pretrained": str(encoder)}
    cfg["trainer"]["val_check_interval"] = 3
    path = tmp_path / "houlsby_multitask.yaml"
    path.write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "runs"
    assert_resumes_exactly(["fit", "--config", str(path)], runs, stop=3, steps=6)
    ckpt = torch.load(runs / "part" / "checkpoints" / "last.ckpt", weights_only=True)
    backbone = [k for k in ckpt["state_dict"] if k.startswith("backbone.")]
    assert ckpt["ptm_app"]["delta_only"] and backbone and all(".delta_adapters." in f".{k}" for k in backbone)
    assert {k.split(".")[1] for k in ckpt["state_dict"] if k.startswith("heads.")} == {"sentiment", "tagging", "qa"}
