"""Delta tuning is a setting of the token-classification and QA modules too: exactly the delta and the task
head train, the frozen weights stay bit-identical, delta-only checkpoints reload with the same outputs, and
the shipped configs (LoRA on Brown POS, Houlsby adapters on WordNet QA) run and resume exactly."""
from pathlib import Path

import pytest
import torch

from ptm_app.adaptation.qa import QuestionAnsweringModule
from ptm_app.adaptation.token_classification import TokenClassificationModule
from tests.conftest import TINY_BERT, assert_resumes_exactly

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {**TINY_BERT, "vocab_size": 100}
QUICK = ["--trainer.max_steps", "6", "--trainer.val_check_interval", "6", "--trainer.limit_val_batches", "2",
         "--trainer.num_sanity_val_steps", "0", "--trainer.log_every_n_steps", "1", "--trainer.precision", "32-true",
         "--data.init_args.max_length", "64", "--data.init_args.batch_size", "8", "--data.init_args.eval_batch_size",
         "16", "--data.init_args.limit_train", "200", "--trainer.enable_progress_bar", "false"]


def trainable(module) -> set[str]:
    return {n for n, p in module.backbone.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("method, expected", [("lora", ("lora_A", "lora_B")), ("houlsby", ("adapters",)),
                                              ("bitfit", ("bias",))])
def test_token_classification_trains_only_the_delta_and_the_tagger(method, expected):
    delta = {"method": method, **({"target_modules": ["query", "value"]} if method == "lora" else {})}
    module = TokenClassificationModule(backbone_config=CONFIG, labels=["N", "V", "X"], delta=delta).build()
    names = trainable(module)
    head = {n for n in names if "classifier" in n}
    assert head, names  # the new tagger always trains
    assert names - head and all(any(e in n for e in expected) for n in names - head), sorted(names)[:8]


def test_qa_with_adapters_keeps_the_encoder_bit_identical():
    torch.manual_seed(0)
    module = QuestionAnsweringModule(backbone_config=CONFIG, delta={"method": "houlsby", "bottleneck": 8}).build()
    frozen = {n: p.detach().clone() for n, p in module.backbone.named_parameters() if not p.requires_grad}
    assert any("qa_outputs" in n for n in trainable(module)) and frozen
    ids = torch.randint(5, 100, (4, 12))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
             "start_positions": torch.tensor([1, 2, 3, 4]), "end_positions": torch.tensor([2, 3, 5, 6])}
    opt = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-2)
    before = module(batch)[0].detach().clone()
    for _ in range(3):
        loss = module.kind.loss(module(batch), batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert not torch.allclose(module(batch)[0], before)  # the adapters and the span layer moved
    for name, p in module.backbone.named_parameters():
        if name in frozen:
            assert torch.equal(p, frozen[name]), name


@pytest.mark.parametrize("config, module_cls", [
    ("minilm_lora_brown_pos", TokenClassificationModule),
    pytest.param("minilm_houlsby_wordnet_qa", QuestionAnsweringModule, marks=pytest.mark.slow),
])
def test_delta_config_on_tagging_and_qa_resumes_exactly_and_reloads(config, module_cls, tmp_path):
    cfg, runs = str(ROOT / "configs" / "adapt" / f"{config}.yaml"), tmp_path / "runs"
    assert_resumes_exactly(["fit", "--config", cfg, *QUICK], runs, stop=3, steps=6)

    path = runs / "full" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["ptm_app"]["delta_only"]
    assert sum(v.numel() for k, v in ckpt["state_dict"].items() if k.startswith("backbone.")) < 0.1 * 22_700_000
    module = module_cls.load_from_checkpoint(path).eval()
    params = {f"backbone.{n}": p for n, p in module.backbone.named_parameters()}
    saved = {k: v for k, v in ckpt["state_dict"].items() if k.startswith("backbone.")}
    assert all(torch.equal(params[k], v) for k, v in saved.items())  # every saved delta tensor is in place
    kwargs = {"labels": module.hparams.labels} if "labels" in module.hparams else {}
    rebuilt = dict(module_cls(backbone="minilm", delta=module.hparams.delta, **kwargs).build().backbone.named_parameters())
    # frozen = every rebuilt parameter not saved, except peft's frozen copy of the fresh (random) head
    frozen = [n for n in rebuilt if f"backbone.{n}" not in saved and "original_module" not in n]
    assert len(frozen) > 50 and all(torch.equal(params[f"backbone.{n}"], rebuilt[n]) for n in frozen)
