"""Frozen-feature tagging and QA (ELMo's own uses, Peters et al. 2018 §4): only the scalar mix and the head
train, the backbone stays bit-identical and out of the optimiser, the per-token features are exactly the chosen
layer(s), the ELMo BiLSTM works as the backbone, checkpoints omit the frozen backbone and reload / export with
the same outputs, and a tiny model learns first-sub-token tags and QA spans through the fine-tuning modules'
data, metrics and predict writers."""
import json
import random
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from ptm_app.training.trainer import PtmTrainer
from ptm_app.adaptation.features import (FeatureExtractionModule, QAFeatureExtractionModule,
                                         TokenFeatureExtractionModule)
from ptm_app.adaptation.policies import FrozenFeatures
from ptm_app.data.sources import prepared_dir
from ptm_app.data.qa_data import QADataModule
from ptm_app.data.tagging_data import TokenTaskDataModule
from ptm_app.data.tokenizer import TokenizerSpec
from ptm_app.errors import PtmError
from ptm_app.inference.export import export_checkpoint, load_exported_module
from ptm_app.training.optim import OptimConfig, build_optimizer
from tests.conftest import TINY_BERT, write_jsonl

TINY = {**TINY_BERT, "vocab_size": 100}
TAGS = ["N", "V", "X"]
MINILM = TokenizerSpec(pretrained="minilm")


def batch(seed: int = 0, n: int = 3, length: int = 9) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 100, (n, length), generator=g)
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0
    labels = torch.randint(0, len(TAGS), (n, length), generator=g)
    labels[:, 0] = labels[0, -3:] = -100
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids), "labels": labels,
            "start_positions": torch.tensor([1, 2, 3])[:n], "end_positions": torch.tensor([2, 4, 3])[:n]}


def make(cls, **kwargs):
    torch.manual_seed(0)
    extra = {"labels": TAGS} if cls is not QAFeatureExtractionModule else {}
    return cls(**{"backbone_config": TINY, **extra, **kwargs}).build()


def fit(module, steps: int = 3, batches: list[dict] | None = None) -> pl.Trainer:
    trainer = PtmTrainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, DataLoader(batches or [batch(i) for i in range(steps)], batch_size=None))
    return trainer


@pytest.mark.parametrize("cls", [TokenFeatureExtractionModule, QAFeatureExtractionModule])
def test_only_the_mix_and_head_train_and_the_backbone_stays_bit_identical(cls):
    module = make(cls)
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    assert trainable == {"mix.weights", "mix.gamma", "task_head.1.weight", "task_head.1.bias"}
    assert module.mix.weights.numel() == TINY["num_hidden_layers"] + 1  # ELMo: layer 0 included
    assert module.task_head[1].out_features == (3 if cls is TokenFeatureExtractionModule else 2)
    groups = build_optimizer(module, module.optim, 10)["optimizer"].param_groups
    in_optimizer = {id(p) for g in groups for p in g["params"]}
    assert in_optimizer == {id(p) for n, p in module.named_parameters() if n in trainable}
    before = {k: v.clone() for k, v in module.backbone.state_dict().items()}
    head_before, mix_before = module.task_head[1].weight.clone(), module.mix.weights.clone()
    fit(module)
    assert all(torch.equal(before[k], v) for k, v in module.backbone.state_dict().items())
    assert all(p.grad is None for p in module.backbone.parameters())  # run without gradients
    assert not torch.equal(head_before, module.task_head[1].weight) and not torch.equal(mix_before, module.mix.weights)
    module.train()
    assert not any(m.training for m in module.backbone.modules()) and module.task_head.training
    out = module(batch())
    if cls is TokenFeatureExtractionModule:
        assert out.shape == (3, 9, 3)  # [B, T, tags]: one row per input token, aligned with the labels
    else:
        assert out[0].shape == out[1].shape == (3, 9) and out[0].dtype == torch.float32


@pytest.mark.parametrize("representation, include_layer0", [("embedding", True), ("top", True),
                                                            ("scalar_mix", True), ("scalar_mix", False)])
def test_token_features_are_the_chosen_layers(representation, include_layer0):
    module = make(TokenFeatureExtractionModule, representation=representation, include_layer0=include_layer0,
                  head_hidden=8).eval()
    b = batch()
    if module.mix is not None:
        with torch.no_grad():
            module.mix.weights.copy_(torch.linspace(-1, 1, module.mix.weights.numel()))
            module.mix.gamma.fill_(1.5)
    with torch.no_grad():
        layers = module.backbone(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                                 token_type_ids=b["token_type_ids"], output_hidden_states=True).hidden_states
    if representation == "embedding":
        expected = layers[0]
    elif representation == "top":
        expected = layers[-1]
    else:
        mixed = layers if include_layer0 else layers[1:]
        s = torch.softmax(torch.linspace(-1, 1, len(mixed)), 0)
        expected = 1.5 * sum(w * h for w, h in zip(s, mixed))
    assert torch.allclose(module.policy(FrozenFeatures).token_features(module, b), expected, atol=1e-6)
    assert torch.allclose(module(b), module.task_head(expected), atol=1e-6)
    assert module.style() == {"embedding": "frozen features: embedding", "top": "frozen features: top"}.get(
        representation, f"frozen features: scalar mix {'incl.' if include_layer0 else 'excl.'} layer 0")


def test_bad_representation_or_pooling_is_one_line_error():
    with pytest.raises(PtmError, match="representation 'scalar-mix' is unknown; use one of embedding, top, scalar_mix"):
        make(TokenFeatureExtractionModule, representation="scalar-mix")
    with pytest.raises(PtmError, match="pooling 'max' is unknown; use cls or mean"):
        FeatureExtractionModule(backbone_config=TINY, labels=TAGS, pooling="max").build()


def bilm_checkpoint(path: Path):
    from ptm_app.backbones.bilstm import BiLSTMConfig, BiLSTMForLanguageModeling

    config = BiLSTMConfig(vocab_size=100, embedding_dim=8, hidden_size=12, num_layers=2)
    torch.manual_seed(3)
    lm = BiLSTMForLanguageModeling(config)
    ckpt = {"state_dict": {f"backbone.{k}": v for k, v in lm.state_dict().items()},
            "hyper_parameters": {"backbone_config": config.to_dict()},
            "ptm_app": {"model_class": "bilm", "module": "ptm_app.objectives.bilm.BiLMModule", "tokenizer": {}}}
    torch.save(ckpt, path)  # the layout BiLMModule writes
    return lm


@pytest.mark.parametrize("cls", [TokenFeatureExtractionModule, QAFeatureExtractionModule])
def test_elmo_bilstm_features_for_tagging_and_qa_and_checkpoints_without_it(cls, tmp_path):
    lm = bilm_checkpoint(tmp_path / "elmo.ckpt")
    module = make(cls, backbone=str(tmp_path / "elmo.ckpt"), backbone_config=None)
    assert module.task_head[1].in_features == 16 and module.mix.weights.numel() == 3  # [h→; h←], L+1 = 3 layers
    assert torch.equal(module.backbone.embed_tokens.weight, lm.bilm.embed_tokens.weight)
    frozen = {k: v.clone() for k, v in module.backbone.state_dict().items()}
    trainer = fit(module)
    assert all(torch.equal(frozen[k], v) for k, v in module.backbone.state_dict().items())
    trainer.save_checkpoint(tmp_path / "run.ckpt")
    saved = torch.load(tmp_path / "run.ckpt", weights_only=True)
    assert not [k for k in saved["state_dict"] if k.startswith("backbone.")]  # rebuilt from the ELMo checkpoint
    reloaded = cls.load_from_checkpoint(tmp_path / "run.ckpt").eval()
    module.eval()
    with torch.no_grad():
        ours, theirs = module(batch()), reloaded(batch())
    for a, b in zip(*(x if isinstance(x, tuple) else (x,) for x in (ours, theirs))):
        assert torch.equal(a, b)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """A tiny BERT as a save_pretrained directory (with MiniLM's tokenizer files, for export)."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    prepared_dir("minilm")
    root = tmp_path_factory.mktemp("tiny_bert")
    torch.manual_seed(1)
    AutoModel.from_config(AutoConfig.for_model(**TINY)).save_pretrained(root)
    AutoTokenizer.from_pretrained(prepared_dir("minilm")).save_pretrained(root)
    return root


@pytest.mark.parametrize("cls", [FeatureExtractionModule, TokenFeatureExtractionModule, QAFeatureExtractionModule])
def test_checkpoints_omit_the_frozen_backbone_and_reload_and_export_with_the_same_outputs(cls, tiny_dir, tmp_path):
    from transformers import AutoTokenizer

    module = make(cls, backbone=str(tiny_dir), backbone_config=None, head_hidden=8)
    module.tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    b = batch()
    if cls is FeatureExtractionModule:
        b["labels"] = torch.tensor([0, 1, 2])  # one label per sequence
    fit(module, steps=2, batches=[b, b]).save_checkpoint(tmp_path / "run.ckpt")
    ckpt = torch.load(tmp_path / "run.ckpt", weights_only=True)
    assert ckpt["ptm_app"]["delta_only"] and ckpt["hyper_parameters"]["backbone"] == str(tiny_dir)
    assert sorted({k.split(".")[0] for k in ckpt["state_dict"]}) == ["mix", "task_head"]
    module.eval()
    with torch.no_grad():
        expected = module(b)
    reloaded = cls.load_from_checkpoint(tmp_path / "run.ckpt").eval()
    exported = load_exported_module(export_checkpoint(tmp_path / "run.ckpt", tmp_path / "export"))
    assert (tmp_path / "export" / "module_weights.safetensors").is_file()
    for other in (reloaded, exported):
        with torch.no_grad():
            got = other(b)
        for x, y in zip(*(v if isinstance(v, tuple) else (v,) for v in (expected, got))):
            assert torch.allclose(x, y, atol=1e-6)
        assert not any(p.requires_grad for p in other.backbone.parameters())


def test_a_backbone_from_a_config_alone_stays_in_the_checkpoint(tmp_path):
    module = make(TokenFeatureExtractionModule)
    fit(module, steps=1).save_checkpoint(tmp_path / "run.ckpt")
    ckpt = torch.load(tmp_path / "run.ckpt", weights_only=True)
    assert not ckpt["ptm_app"].get("delta_only")  # random weights: nothing to rebuild them from
    reloaded = TokenFeatureExtractionModule.load_from_checkpoint(tmp_path / "run.ckpt")
    assert all(torch.equal(a, b) for a, b in zip(module.backbone.state_dict().values(),
                                                 reloaded.backbone.state_dict().values()))


# -- learning through the fine-tuning modules' data, metrics and writers (tiny BERT, MiniLM tokenizer) --------
TAG_OF = {"the": "DET", "a": "DET", "cat": "NOUN", "dog": "NOUN", "unaffordable": "ADJ", "red": "ADJ",
          "sat": "VERB", "ran": "VERB"}


def tagged(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        words = [rng.choice(list(TAG_OF)) for _ in range(rng.randint(3, 7))]
        rows.append({"id": f"s{seed}-{i}", "words": words, "tags": [TAG_OF[w] for w in words]})
    return rows


def tiny_trainer(root: Path, steps: int) -> pl.Trainer:
    return PtmTrainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
                      num_sanity_val_steps=0, val_check_interval=steps, check_val_every_n_epoch=None)


def test_token_features_learn_first_sub_token_tags_and_predict_one_tag_per_word(tmp_path):
    for split, n, seed in (("train", 64, 1), ("validation", 16, 2), ("test", 8, 3)):
        write_jsonl(tmp_path / "data" / f"{split}.jsonl", tagged(n, seed))
    dm = TokenTaskDataModule(source=str(tmp_path / "data"), tokenizer=MINILM, batch_size=16, max_length=16)
    torch.manual_seed(0)
    module = TokenFeatureExtractionModule(backbone_config={**TINY_BERT, "vocab_size": 30522},
                                          representation="embedding", optim=OptimConfig(lr=5e-2, warmup=0))
    trainer = tiny_trainer(tmp_path, 60)
    trainer.fit(module, datamodule=dm)
    assert module.hparams.labels == ["ADJ", "DET", "NOUN", "VERB"]  # from the data module
    assert trainer.callback_metrics["val/acc"] == 1.0  # "unaffordable" (4 WordPieces) tagged on its first one
    trainer.predict(module, datamodule=dm)
    rows = [json.loads(line) for line in open(tmp_path / "predictions.jsonl")]
    assert [r["tags"] for r in rows] == [[TAG_OF[w] for w in r["words"]] for r in rows] and len(rows) == 8


def qa_rows(n: int, seed: int) -> list[dict]:
    """The answer is always the phrase "purple elephants", at a random place among filler words."""
    rng = random.Random(seed)
    fillers = "the cat sat on a mat while dogs ran in the park".split()
    rows = []
    for i in range(n):
        words = [rng.choice(fillers) for _ in range(rng.randint(6, 14))]
        at = rng.randint(0, len(words))
        context = " ".join(words[:at] + ["purple", "elephants"] + words[at:])
        rows.append({"id": f"q{seed}-{i}", "question": "which animals?", "context": context,
                     "answers": {"text": ["purple elephants"], "answer_start": [context.index("purple elephants")]}})
    return rows


@pytest.fixture
def qa_data(tmp_path) -> QADataModule:
    for split, n, seed in (("train", 48, 1), ("validation", 12, 2), ("test", 6, 3)):
        write_jsonl(tmp_path / "qa" / f"{split}.jsonl", qa_rows(n, seed))
    return QADataModule(source=str(tmp_path / "qa"), tokenizer=MINILM, max_length=32, batch_size=16)


def test_qa_features_learn_spans_and_write_answers(qa_data, tmp_path):
    torch.manual_seed(0)
    module = QAFeatureExtractionModule(backbone_config={**TINY_BERT, "vocab_size": 30522}, head_hidden=32,
                                       representation="embedding", optim=OptimConfig(lr=2e-2, warmup=0)).build()
    trainer = tiny_trainer(tmp_path, 60)
    trainer.fit(module, datamodule=qa_data)
    assert trainer.callback_metrics["val/em"] == 1.0 and trainer.callback_metrics["val/f1"] == 1.0
    trainer.predict(module, datamodule=qa_data)
    rows = [json.loads(line) for line in open(tmp_path / "predictions.jsonl")]
    assert len(rows) == 6 and all(r["answer"] == "purple elephants" for r in rows)
    assert all(r["context"][r["answer_start"]:].startswith("purple elephants") for r in rows)


def test_a_task_module_that_takes_the_feature_settings_carries_frozen_features():
    """Frozen features are a policy, not a base class: a multiple-choice module given the ``representation``
    settings builds the plain encoder, trains only the mix and a one-score head, and reads each (question, choice)
    pair's pooled features as its choice score (the kind's ``Choices`` head shape)."""
    from ptm_app.adaptation.choice import MultipleChoiceModule

    class ChoiceFeatures(MultipleChoiceModule):
        def __init__(self, backbone_config: dict, num_choices: int, representation: str = "scalar_mix",
                     pooling: str = "mean", head_hidden: int | None = None, dropout: float = 0.0):
            super().__init__(None, backbone_config, num_choices, OptimConfig(lr=1e-3))

    torch.manual_seed(0)
    module = ChoiceFeatures(TINY, 2).build()
    assert module.model_class == "base" and [type(p) for p in module.policies] == [FrozenFeatures]
    assert {n for n, p in module.named_parameters() if p.requires_grad} == {
        "mix.weights", "mix.gamma", "task_head.1.weight", "task_head.1.bias"}
    assert module.task_head[1].out_features == 1
    b = batch(n=4)  # two questions, two (question, choice) pairs each
    b["labels"] = torch.tensor([1, 0])
    out = module(b)
    policy = module.policy(FrozenFeatures)
    pooled = policy.pooled(policy.token_features(module, b), b)
    assert out.shape == (2, 2) and torch.allclose(out, module.task_head(pooled).view(2, 2))
    module.kind.loss(out, b).backward()
    assert module.mix.weights.grad.abs().sum() > 0 and all(p.grad is None for p in module.backbone.parameters())
