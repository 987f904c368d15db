"""Delta tuning for generation (``GenerationModule(delta=...)``) on all three architectures: a decoder with a
prompt (GPT-2), an encoder-decoder (BART) and BERT2BERT (``EncoderDecoderModel``).  Only the delta (+ BERT2BERT's
new cross-attention and LM-head transform) trains, the rest stays bit-identical; left-padded batched generation
equals one-by-one; a delta-only checkpoint reloads onto a freshly built backbone with the same logits and
generations; export merges LoRA (same outputs from a plain transformers model) or writes base + delta.  Through
main.py: LoRA on BERT2BERT resumes exactly with delta-only checkpoints."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
import yaml
from torch.utils.data import DataLoader

from ptm_app.training.trainer import PtmTrainer
from ptm_app.backbones.delta import load_delta
from ptm_app.adaptation.generation import GenerationModule
from ptm_app.errors import PtmError
from ptm_app.inference.export import export_checkpoint
from tests.adaptation.test_generation import pairs, tiny_bert_dir
from tests.conftest import assert_resumes_exactly, write_jsonl

PROMPT_SIZE = 3  # virtual tokens
METHODS = {"decoder": ["lora", "ia3", "prefix", "prompt", "ptuning", "houlsby", "pals", "bitfit"],
           "encoder_decoder": ["lora", "prompt", "pals"],
           "bert2bert": ["lora", "ia3", "prefix", "prompt", "houlsby", "pals"]}
CASES = [(arch, method) for arch, methods in METHODS.items() for method in methods]
DELTA_NAMES = {"lora": ("lora_A", "lora_B"), "ia3": ("ia3_l",), "prefix": ("prompt_encoder",),
               "prompt": ("prompt_encoder",), "ptuning": ("prompt_encoder",), "houlsby": ("delta_adapters.",),
               "pals": ("delta_adapters.",), "bitfit": ("bias",)}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def backbones(tmp_path_factory) -> dict[str, Path]:
    """Tiny pre-trained-style directories with MiniLM's tokenizer: GPT-2, BART and a BERT encoder."""
    import transformers

    root = tmp_path_factory.mktemp("generation_backbones")
    bert = tiny_bert_dir(root)
    tok = transformers.AutoTokenizer.from_pretrained(bert)
    ids = dict(vocab_size=len(tok), pad_token_id=0, bos_token_id=101, eos_token_id=102)
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, n_positions=64, **ids))
    bart = transformers.BartForConditionalGeneration(transformers.BartConfig(
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, decoder_start_token_id=101,
        forced_eos_token_id=None, **ids))
    dirs = {"decoder": root / "gpt2", "encoder_decoder": root / "bart", "bert2bert": bert}
    for name, model in (("decoder", gpt2), ("encoder_decoder", bart)):
        model.save_pretrained(dirs[name])
        tok.save_pretrained(dirs[name])
    return dirs


def build(arch: str, backbones: dict, method: str, **spec) -> GenerationModule:
    from transformers import AutoTokenizer

    torch.manual_seed(0)
    module = GenerationModule(backbone=str(backbones[arch]), architecture=arch, prompt=" =>", max_new_tokens=4,
                              optim={"lr": 1e-2, "warmup": 0},
                              delta={"method": method, "r": 4, "bottleneck": 8, "num_virtual_tokens": PROMPT_SIZE,
                                     **spec}).build()
    module.tokenizer = AutoTokenizer.from_pretrained(backbones[arch])
    return module


def batches(module: GenerationModule, n: int = 3) -> list[dict]:
    tok = module.tokenizer
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    collate = module.make_collator(tok)
    rows = pairs(4 * n, seed=5)
    return [collate([{"source_ids": torch.tensor(ids(r["text"])), "target_ids": torch.tensor(ids(r["target"])),
                      "target": r["target"], "key": 4 * b + i} for i, r in enumerate(rows[4 * b:4 * b + 4])])
            for b in range(n)]


def fit(module: GenerationModule, data: list[dict]) -> pl.Trainer:
    trainer = PtmTrainer(max_steps=len(data), accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, DataLoader(data, batch_size=None))
    return trainer


def raw_generate(model, batch: dict, arch: str, pals: bool) -> torch.Tensor:
    """transformers' ``generate`` on the module's inputs (greedy, 4 new tokens)."""
    settings = dict(max_new_tokens=4, do_sample=False, pad_token_id=0, eos_token_id=102, use_cache=not pals)
    if arch == "decoder":
        return model.generate(input_ids=batch["prompt_input_ids"], attention_mask=batch["prompt_attention_mask"],
                              **settings)
    return model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                          decoder_start_token_id=101, **settings)


@pytest.mark.parametrize("arch, method", CASES)
def test_delta_trains_alone_reloads_from_a_delta_only_checkpoint_and_exports(arch, method, backbones, tmp_path):
    module = build(arch, backbones, method)
    data = batches(module)
    trainable = {n for n, p in module.backbone.named_parameters() if p.requires_grad}
    delta = {n for n in trainable if any(k in n for k in DELTA_NAMES[method])}
    new = trainable - delta
    if arch == "bert2bert":  # the warm start's new cross-attention and LM-head transform (Rothe et al. 2020 §2)
        assert new and all("crossattention" in n or ".decoder.cls." in f".{n}" for n in new), sorted(new)[:4]
    else:  # the pre-trained LM head (tied to the embeddings) stays frozen
        assert not new, sorted(new)[:4]
    assert delta
    before = {n: p.detach().clone() for n, p in module.backbone.named_parameters()}
    fit(module, data).save_checkpoint(tmp_path / "run.ckpt")
    for name, param in module.backbone.named_parameters():
        if name not in trainable:
            assert torch.equal(param, before[name]), f"frozen {name} changed"
        elif not name.endswith("key.bias"):  # softmax ignores key biases: round-off gradients only
            assert not torch.equal(param, before[name]), f"{name} did not move"

    module.eval()
    batch = data[0]
    together = module.generate(batch)  # left-padded (decoder) / right-padded source, batched
    assert together == [module.generate({k: v[i:i + 1] if torch.is_tensor(v) else v[i:i + 1]
                                         for k, v in batch.items()})[0] for i in range(len(together))]
    with torch.no_grad():
        logits = module(batch)
    assert logits.shape[:2] == batch["labels"].shape  # the virtual prompt positions are not in the logits

    ckpt = torch.load(tmp_path / "run.ckpt", weights_only=True)
    assert ckpt["ptm_app"]["delta_only"]
    assert {k.removeprefix("backbone.") for k in ckpt["state_dict"] if k.startswith("backbone.")} == trainable
    reloaded = GenerationModule.load_from_checkpoint(tmp_path / "run.ckpt").eval()  # base rebuilt from its dir
    with torch.no_grad():
        assert torch.equal(reloaded(batch), logits)
    assert reloaded.generate(batch) == together

    out = export_checkpoint(tmp_path / "run.ckpt", tmp_path / "export")
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    exported = (AutoModelForCausalLM if arch == "decoder" else AutoModelForSeq2SeqLM).from_pretrained(out)
    merged = method in ("lora", "ia3", "bitfit")
    assert (out / "delta.safetensors").exists() != merged
    if not merged:
        exported = load_delta(exported, out)
    exported.eval()
    with torch.no_grad():
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "decoder_input_ids") if k in batch}
        want = module.backbone(**inputs).logits
        torch.testing.assert_close(exported(**inputs).logits, want, rtol=0, atol=1e-5)
    pals = method == "pals"
    assert torch.equal(raw_generate(exported, batch, arch, pals), raw_generate(module.backbone, batch, arch, pals))


def test_bert2bert_refuses_a_frozen_cross_attention(backbones):
    with pytest.raises(PtmError, match="cross-attention and LM head start random.*delta.train_head: true"):
        build("bert2bert", backbones, "lora", train_head=False)


def test_virtual_tokens_count_against_the_position_limit(backbones):
    data = SimpleNamespace(max_source_length=40, max_target_length=10)  # 1 + 40 + 2 (" =>") + 11 = 54 <= 64
    build("decoder", backbones, "lora").check_lengths(data)
    module = build("decoder", backbones, "prompt", num_virtual_tokens=12)
    with pytest.raises(PtmError, match=r"\+ 12 virtual tokens = 66 positions, more than the backbone allows \(64\)"):
        module.check_lengths(data)


def test_lora_bert2bert_config_resumes_exactly_with_delta_only_checkpoints(backbones, tmp_path):
    data = tmp_path / "data"
    write_jsonl(data / "train.jsonl", pairs(24, 0))
    write_jsonl(data / "validation.jsonl", pairs(4, 1))
    cfg = {"seed_everything": 3,
           "trainer": {"accelerator": "cpu", "devices": 1, "max_steps": 6, "val_check_interval": 3,
                       "check_val_every_n_epoch": None, "log_every_n_steps": 1, "num_sanity_val_steps": 0,
                       "enable_progress_bar": False, "enable_model_summary": False},
           "model": {"class_path": "GenerationModule",
                     "init_args": {"backbone": str(backbones["bert2bert"]), "architecture": "bert2bert",
                                   "max_new_tokens": 4, "optim": {"lr": 1e-3, "warmup": 2},
                                   "delta": {"method": "lora", "r": 4, "dropout": 0.1}}},
           "data": {"class_path": "Seq2SeqDataModule",
                    "init_args": {"source": str(data), "tokenizer": {"pretrained": str(backbones["bert2bert"])},
                                  "max_source_length": 24, "max_target_length": 8, "batch_size": 4,
                                  "eval_batch_size": 4}}}
    path = tmp_path / "lora_b2b.yaml"
    path.write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "runs"
    assert_resumes_exactly(["fit", "--config", str(path)], runs, stop=3, steps=6)  # LoRA dropout: RNG resumes too
    ckpt = torch.load(runs / "part" / "checkpoints" / "last.ckpt", weights_only=True)
    keys = [k for k in ckpt["state_dict"] if k.startswith("backbone.")]
    assert ckpt["ptm_app"]["delta_only"] and keys
    assert all("lora_" in k or "crossattention" in k or ".decoder.cls." in k for k in keys), keys[:4]
    full = torch.load(runs / "full" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert all(torch.equal(full[k], ckpt["state_dict"][k]) for k in keys)  # the resumed run ends where the whole did
