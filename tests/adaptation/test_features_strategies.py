"""Feature extraction with a scalar mix, ULMFiT-style fine-tuning strategies, L2-SP and stage chaining."""
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
import yaml
from lightning.pytorch.trainer.states import TrainerFn
from torch.utils.data import DataLoader

from ptm_app.training.trainer import PtmTrainer
from ptm_app.adaptation.chaining import InitFrom, apply_init_from
from ptm_app.adaptation.classification import SequenceClassificationModule
from ptm_app.adaptation.features import FeatureExtractionModule
from ptm_app.adaptation.policies import L2SP, FrozenFeatures
from ptm_app.backbones.layers import layer_ids
from ptm_app.backbones.scalar_mix import ScalarMix
from ptm_app.data.sources import prepared_dir
from ptm_app.errors import PtmError
from ptm_app.training.optim import OptimConfig, build_optimizer, stlr_factor
from ptm_app.training.unfreezing import ChainThaw, GradualUnfreezing, SequentialUnfreezing
from tests.conftest import TINY_BERT, run_main, tiny_mlm_config


def pooled_features(module, batch: dict) -> torch.Tensor:
    """The module's pooled features [B, D] (its ``FrozenFeatures`` policy: the chosen layers, then the pooling)."""
    policy = module.policy(FrozenFeatures)
    return policy.pooled(policy.token_features(module, batch), batch)

ROOT = Path(__file__).resolve().parents[2]
ADAPT = ROOT / "configs" / "adapt"
TINY = {**TINY_BERT, "vocab_size": 50}
LABELS = ["a", "b"]
QUICK = ["--trainer.max_steps", "3", "--trainer.max_epochs", "1", "--trainer.val_check_interval", "3",
         "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false",
         "--trainer.enable_model_summary", "false", "--trainer.log_every_n_steps", "1",
         "--data.init_args.batch_size", "2", "--data.init_args.eval_batch_size", "2",
         "--data.init_args.max_length", "16"]


def batch(seed: int = 0, n: int = 4, length: int = 6) -> dict:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(n, length, dtype=torch.long)
    mask[0, -2:] = 0
    return {"input_ids": torch.randint(5, 50, (n, length), generator=g), "attention_mask": mask,
            "labels": torch.arange(n) % 2}


def fit_tiny(module, steps: int = 3) -> pl.Trainer:
    trainer = PtmTrainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, DataLoader([batch(i) for i in range(steps)], batch_size=None))
    return trainer


def trainable_layers(module) -> list[int]:
    ids = layer_ids(module)
    return sorted({ids[n] for n, p in module.named_parameters() if p.requires_grad})


def backbone_tensors(ckpt_path: Path) -> dict[str, torch.Tensor]:
    state = torch.load(ckpt_path, map_location="cpu", weights_only=True)["state_dict"]
    return {k[len("backbone."):]: v for k, v in state.items() if k.startswith("backbone.")}


# -- scalar mix ---------------------------------------------------------------------------------------
def test_scalar_mix_is_gamma_times_softmax_weighted_sum():
    layers = [torch.randn(2, 3, 5) for _ in range(4)]
    mix = ScalarMix(4)
    with torch.no_grad():
        mix.weights.copy_(torch.tensor([0.3, -1.0, 2.0, 0.5]))
        mix.gamma.fill_(1.7)
    s = mix.layer_weights()
    assert s.sum().item() == pytest.approx(1.0) and (s > 0).all()
    expected = 1.7 * sum(torch.softmax(torch.tensor([0.3, -1.0, 2.0, 0.5]), 0)[j] * layers[j] for j in range(4))
    assert torch.allclose(mix(layers), expected, atol=1e-6)

    without0 = ScalarMix(4, include_layer0=False)  # Qiu eq. 6: layers 1..L only
    assert mix.weights.numel() == 4 and without0.weights.numel() == 3
    assert torch.allclose(without0(layers), sum(layers[1:]) / 3, atol=1e-6)  # uniform at init, γ = 1
    with pytest.raises(ValueError):
        mix(layers[:3])


def test_scalar_mix_layer_norm_ignores_padding():
    mix = ScalarMix(2, do_layer_norm=True)
    layers = [torch.randn(1, 4, 3) * 5 + 2 for _ in range(2)]
    mask = torch.tensor([[1, 1, 1, 0]])
    out = mix(layers, mask)
    changed = [h.clone() for h in layers]
    for h in changed:
        h[0, 3] = 1e4  # padding must not move the statistics of the real tokens
    assert torch.allclose(mix(changed, mask)[0, :3], out[0, :3], atol=1e-5)


# -- feature extraction ---------------------------------------------------------------------------------
def tiny_features(representation: str, **kwargs) -> FeatureExtractionModule:
    torch.manual_seed(0)  # the same backbone weights for every representation
    return FeatureExtractionModule(backbone_config=TINY, labels=LABELS, representation=representation, **kwargs).build()


def test_feature_extraction_trains_only_the_head_and_leaves_the_backbone_bit_identical():
    module = tiny_features("scalar_mix", head_hidden=8)
    assert {n for n, p in module.named_parameters() if p.requires_grad} == {
        "mix.weights", "mix.gamma", "task_head.1.weight", "task_head.1.bias", "task_head.4.weight", "task_head.4.bias"}
    before = {k: v.clone() for k, v in module.backbone.state_dict().items()}
    head_before = module.task_head[1].weight.clone()
    module.train()
    assert not any(m.training for m in module.backbone.modules()) and module.task_head.training
    fit_tiny(module)
    assert all(torch.equal(before[k], v) for k, v in module.backbone.state_dict().items())
    assert not torch.equal(head_before, module.task_head[1].weight)  # the head did train
    module.train()
    first, second = pooled_features(module, batch()), pooled_features(module, batch())
    assert torch.equal(first, second)  # no dropout in the backbone in train mode


def test_representations_give_different_features():
    b = batch()
    feats = {r: pooled_features(tiny_features(r), b) for r in ("embedding", "top", "scalar_mix")}
    feats["mix_without_layer0"] = pooled_features(tiny_features("scalar_mix", include_layer0=False), b)
    names = list(feats)
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            assert not torch.allclose(feats[x], feats[y]), (x, y)
    module = tiny_features("top", pooling="cls")
    with torch.no_grad():
        top = module.backbone(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
    assert torch.allclose(pooled_features(module, b), top[:, 0])
    mask = b["attention_mask"].unsqueeze(-1).float()
    assert torch.allclose(feats["top"], (top * mask).sum(1) / mask.sum(1), atol=1e-6)  # masked mean


@pytest.mark.parametrize("model_type", ["bart", "t5"])
def test_an_encoder_decoder_gives_its_encoders_layers(model_type):
    shape = ({"d_model": 16, "encoder_layers": 2, "decoder_layers": 1, "encoder_attention_heads": 2,
              "decoder_attention_heads": 2, "encoder_ffn_dim": 32, "decoder_ffn_dim": 32, "max_position_embeddings": 32}
             if model_type == "bart" else {"d_model": 16, "d_kv": 8, "d_ff": 32, "num_layers": 2,
                                            "num_decoder_layers": 1, "num_heads": 2})
    torch.manual_seed(0)
    module = FeatureExtractionModule(backbone_config={"model_type": model_type, "vocab_size": 60, **shape},
                                     labels=LABELS, representation="scalar_mix").build()
    b = batch()
    with torch.no_grad():
        states = module.backbone.get_encoder()(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                                               output_hidden_states=True).hidden_states
    assert len(states) == 3 and module.mix.weights.numel() == 3  # the embeddings + 2 encoder layers
    expected = module.mix(states, b["attention_mask"])
    assert torch.allclose(module.policy(FrozenFeatures).token_features(module, b), expected)


def test_feature_extraction_on_the_elmo_bilstm_from_a_checkpoint(tmp_path):
    from ptm_app.backbones.bilstm import BiLSTMConfig, BiLSTMForLanguageModeling

    config = BiLSTMConfig(vocab_size=50, embedding_dim=8, hidden_size=12, num_layers=2)
    lm = BiLSTMForLanguageModeling(config)
    ckpt = {"state_dict": {f"backbone.{k}": v for k, v in lm.state_dict().items()},
            "hyper_parameters": {"backbone_config": config.to_dict()},
            "ptm_app": {"model_class": "bilm", "module": "ptm_app.objectives.bilm.BiLMModule", "tokenizer": {}}}
    torch.save(ckpt, tmp_path / "elmo.ckpt")  # the layout BiLMModule writes
    module = FeatureExtractionModule(backbone=str(tmp_path / "elmo.ckpt"), labels=LABELS).build()
    assert module.task_head[1].in_features == config.output_dim == 16 and module.mix.weights.numel() == 3
    assert torch.equal(module.backbone.embed_tokens.weight, lm.bilm.embed_tokens.weight)
    assert module(batch()).shape == (4, 2)
    ids = layer_ids(lm)  # discriminative LRs and unfreezing work on the BiLM too
    assert (ids["bilm.embed_tokens.weight"], ids["bilm.backward_stack.lstms.0.weight_ih_l0"],
            ids["bilm.forward_stack.projections.1.weight"], ids["lm_head.bias"]) == (0, 1, 2, 3)


# -- learning-rate schedules ------------------------------------------------------------------------------
def test_stlr_follows_ulmfit_eq3():
    assert stlr_factor(0, 100) == pytest.approx(1 / 32)  # starts at lr / ratio
    assert stlr_factor(5, 100) == pytest.approx((1 + 0.5 * 31) / 32)
    assert stlr_factor(10, 100) == 1.0  # the peak at cut = floor(0.1 · 100)
    assert stlr_factor(55, 100) == pytest.approx((1 + 0.5 * 31) / 32)  # p = 1 − 45 / (10 · 9)
    assert stlr_factor(100, 100) == pytest.approx(1 / 32)  # ends at lr / ratio
    model = torch.nn.Linear(2, 2)
    opt = build_optimizer(model, OptimConfig(lr=0.01, schedule="stlr", warmup=0.5), total_steps=100)
    lrs = []
    for _ in range(100):
        lrs.append(opt["optimizer"].param_groups[0]["lr"])
        opt["optimizer"].step()
        opt["lr_scheduler"]["scheduler"].step()
    assert lrs[0] == pytest.approx(0.01 / 32) and max(lrs) == lrs[10] == pytest.approx(0.01)


def test_discriminative_learning_rates_divide_by_2_6_per_layer():
    module = SequenceClassificationModule(backbone_config=TINY, labels=LABELS,
                                          optim=OptimConfig(lr=1e-3, layer_decay=2.6, weight_decay=0.1)).build()
    groups = build_optimizer(module, module.optim, 10)["optimizer"].param_groups
    top = TINY["num_hidden_layers"]
    for g in groups:  # depth from the top: head and layer L → 0, ..., embeddings → L
        assert g["lr"] == pytest.approx(1e-3 / 2.6 ** max(0, top - g["layer"]))
        assert g["weight_decay"] == (0.0 if g["params"][0].ndim < 2 else 0.1)
    by_id = {id(p): g["layer"] for g in groups for p in g["params"]}
    assert by_id[id(module.backbone.bert.embeddings.word_embeddings.weight)] == 0
    assert by_id[id(module.backbone.bert.encoder.layer[1].output.dense.weight)] == 2
    assert by_id[id(module.backbone.classifier.weight)] == by_id[id(module.backbone.bert.pooler.dense.weight)] == 3
    assert sum(len(g["params"]) for g in groups) == len(list(module.parameters()))


ENCODER = {"num_attention_heads": 2, "intermediate_size": 32, "embedding_size": 8}


@pytest.mark.parametrize("model_type,config,names", [
    ("gpt2", {"n_embd": 16, "n_layer": 2, "n_head": 2},
     {"transformer.wte.weight": 0, "transformer.h.1.attn.c_attn.weight": 2, "score.weight": 3}),
    ("distilbert", {"dim": 16, "n_layers": 2, "n_heads": 2, "hidden_dim": 32},
     {"distilbert.embeddings.word_embeddings.weight": 0, "distilbert.transformer.layer.0.ffn.lin1.weight": 1,
      "pre_classifier.weight": 3}),
    ("xlnet", {"d_model": 16, "n_layer": 2, "n_head": 2, "d_inner": 32},
     {"transformer.mask_emb": 0, "transformer.layer.1.rel_attn.seg_embed": 2, "logits_proj.weight": 3}),
    ("albert", {"hidden_size": 16, "num_hidden_layers": 4, "num_hidden_groups": 2, **ENCODER},  # 2 groups of 2 layers
     {"albert.encoder.embedding_hidden_mapping_in.weight": 0, "classifier.weight": 5,
      "albert.encoder.albert_layer_groups.0.albert_layers.0.ffn.weight": 2,
      "albert.encoder.albert_layer_groups.1.albert_layers.0.ffn.weight": 4}),
    ("electra", {"hidden_size": 16, "num_hidden_layers": 2, **ENCODER},
     {"electra.embeddings_project.weight": 0, "electra.encoder.layer.0.output.dense.weight": 1,
      "classifier.out_proj.weight": 3}),
])
def test_layer_ids_of_other_encoders(model_type, config, names):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_config(AutoConfig.for_model(model_type, vocab_size=50, **config))
    ids = layer_ids(model)
    assert {k: ids[k] for k in names} == names


# -- unfreezing ---------------------------------------------------------------------------------------------
def tiny_classifier(**kwargs) -> SequenceClassificationModule:
    torch.manual_seed(0)
    return SequenceClassificationModule(backbone_config=TINY, labels=LABELS, **kwargs).build()


def stages(callback, counts: list[int], interval: str = "epoch") -> list[list[int]]:
    """Trainable layers at each epoch (or step), each from a freshly built module as after a resume."""
    seen = []
    for count in counts:
        module = tiny_classifier()
        optimizer = build_optimizer(module, module.optim, 10)["optimizer"]
        trainer = SimpleNamespace(current_epoch=count if interval == "epoch" else 0,
                                  global_step=count if interval == "step" else 0, optimizers=[optimizer])
        callback.on_train_batch_start(trainer, module, None, 0)
        seen.append(trainable_layers(module))
    return seen


def test_gradual_unfreezing_adds_one_layer_from_the_top_per_epoch():
    head, l2, l1, emb = 3, 2, 1, 0  # TINY has 2 layers: the head/pooler are layer 3
    assert stages(GradualUnfreezing(), [0, 1, 2, 3, 7]) == [
        [head], [l2, head], [l1, l2, head], [emb, l1, l2, head], [emb, l1, l2, head]]
    assert stages(GradualUnfreezing(every=2, interval="step"), [0, 1, 2, 5], "step") == [
        [head], [head], [l2, head], [l1, l2, head]]


def test_sequential_unfreezing_and_chain_thaw_stages():
    assert stages(SequentialUnfreezing(milestones=(1, 3)), [0, 1, 2, 3]) == [[3], [1, 2, 3], [1, 2, 3], [0, 1, 2, 3]]
    assert stages(ChainThaw(every=10, interval="step"), [0, 10, 25, 30, 40, 99], "step") == [
        [3], [0], [1], [2], [0, 1, 2, 3], [0, 1, 2, 3]]


def test_unfreezing_state_is_derived_from_the_trainer_and_spares_weights_outside_the_optimiser():
    module = tiny_classifier()
    module.backbone.bert.embeddings.requires_grad_(False)  # e.g. init_from.freeze: never in the optimiser
    optimizer = build_optimizer(module, module.optim, 10)["optimizer"]
    callback = ChainThaw()
    for epoch in (4, 2, 0, 4):  # any order, as when resuming at any point
        callback.on_train_batch_start(SimpleNamespace(current_epoch=epoch, global_step=0, optimizers=[optimizer]),
                                      module, None, 0)
        assert trainable_layers(module) == {4: [1, 2, 3], 2: [1], 0: [3]}[epoch]
    assert not any(p.requires_grad for p in module.backbone.bert.embeddings.parameters())


# -- L2-SP --------------------------------------------------------------------------------------------------
def test_l2_sp_penalty_is_zero_at_start_and_matches_the_formula():
    module = tiny_classifier(l2_sp=0.3)
    trainer = PtmTrainer(accelerator="cpu", logger=False)
    trainer.state.fn = TrainerFn.FITTING
    module.trainer = trainer
    module.configure_model()  # takes w⁰ when a fit builds the module
    penalty = module.policy(L2SP).penalty
    assert penalty(module)[0] == "l2_sp" and penalty(module)[1].item() == 0.0
    assert "classifier.weight" not in module.l2_sp_anchor.names  # the new head is not pulled anywhere
    assert not any(k.startswith("l2_sp") for k in module.state_dict())  # not in checkpoints
    with torch.no_grad():
        module.backbone.bert.encoder.layer[0].output.dense.weight.add_(0.01)
        module.backbone.bert.embeddings.word_embeddings.weight[3].sub_(0.2)
        module.backbone.classifier.weight.add_(5.0)
    manual = 0.5 * 0.3 * (0.01 ** 2 * 64 * 32 + 0.2 ** 2 * 32)
    assert penalty(module)[1].item() == pytest.approx(manual, rel=1e-4)


def test_l2_sp_is_logged_during_training():
    module = tiny_classifier(l2_sp=1.0, optim=OptimConfig(lr=1e-2, warmup=0))
    trainer = fit_tiny(module, steps=2)
    assert trainer.callback_metrics["train/l2_sp"] > 0


# -- stage chaining -------------------------------------------------------------------------------------------
@pytest.fixture
def source_dir(tmp_path) -> Path:
    from transformers import AutoConfig, BertForMaskedLM

    torch.manual_seed(1)
    BertForMaskedLM(AutoConfig.for_model(**TINY)).save_pretrained(tmp_path / "stage1")
    return tmp_path / "stage1"


def test_init_from_loads_only_the_listed_modules_and_freezes(source_dir):
    from transformers import AutoModelForMaskedLM

    source = AutoModelForMaskedLM.from_pretrained(source_dir)
    module = tiny_classifier()
    fresh = {k: v.clone() for k, v in module.backbone.state_dict().items()}
    report = apply_init_from(module, InitFrom(path=str(source_dir), modules=["bert.embeddings"],
                                              freeze=["bert.embeddings.word_embeddings"]))
    state = module.backbone.state_dict()
    assert report["loaded"] == len([k for k in state if k.startswith("bert.embeddings.")])
    assert torch.equal(state["bert.embeddings.word_embeddings.weight"], source.bert.embeddings.word_embeddings.weight)
    encoder = "bert.encoder.layer.0.output.dense.weight"
    assert torch.equal(state[encoder], fresh[encoder])  # not listed: keeps its fresh init
    assert not module.backbone.bert.embeddings.word_embeddings.weight.requires_grad
    assert module.backbone.bert.embeddings.position_embeddings.weight.requires_grad


def test_init_from_matches_a_bare_encoder_and_fails_in_one_line(source_dir, tmp_path):
    from transformers import AutoModel

    bare = tmp_path / "bare"
    AutoModel.from_pretrained(source_dir).save_pretrained(bare)  # keys without the 'bert.' prefix
    module = tiny_classifier()
    assert apply_init_from(module, InitFrom(path=str(bare), modules=["bert.encoder"]))["loaded"] > 0
    with pytest.raises(PtmError, match="nothing under 'bert.decoder'"):
        apply_init_from(module, InitFrom(path=str(source_dir), modules=["bert.decoder"]))
    with pytest.raises(PtmError, match="not found"):
        apply_init_from(module, InitFrom(path=str(tmp_path / "missing.ckpt")))
    with pytest.raises(PtmError, match="matches no parameter"):
        apply_init_from(module, InitFrom(path=str(source_dir), freeze=["bert.nope"]))
    with pytest.raises(PtmError, match="strict"):
        apply_init_from(module, InitFrom(path=str(bare), strict=True))  # no classifier in a bare encoder


def test_chained_stage_resumes_without_reapplying_init_from(tiny_corpus, tmp_path):
    runs = tmp_path / "runs"
    stage1 = tiny_mlm_config(tiny_corpus, tmp_path, max_steps=2)
    assert run_main(["fit", "--config", str(stage1), "--run_name", "stage1"], runs) == 0
    mlm = yaml.safe_load(stage1.read_text())
    cfg = {
        "seed_everything": 3,
        "trainer": {"max_steps": 4, "accelerator": "cpu", "val_check_interval": 2, "log_every_n_steps": 1,
                    "enable_progress_bar": False, "enable_model_summary": False},
        "model": {"class_path": "SequenceClassificationModule",
                  "init_args": {"backbone_config": TINY_BERT, "optim": {"lr": 1e-2, "warmup": 0},
                                "init_from": {"path": "stage1", "modules": ["bert.embeddings", "bert.encoder"],
                                              "freeze": ["bert.embeddings"]}}},
        "data": {"class_path": "TaskDataModule",
                 "init_args": {"source": str(tiny_corpus), "max_length": 32, "batch_size": 4,
                               "tokenizer": mlm["data"]["init_args"]["tokenizer"]}},
    }
    path = tmp_path / "stage2.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert run_main(["fit", "--config", str(path), "--stop_at_step", "2"], runs) == 0
    source_ckpt = runs / "stage1" / "checkpoints" / "last.ckpt"
    first = backbone_tensors(source_ckpt)
    paused = backbone_tensors(runs / "stage2" / "checkpoints" / "last.ckpt")
    emb, enc = "bert.embeddings.word_embeddings.weight", "bert.encoder.layer.0.output.dense.weight"
    assert torch.equal(paused[emb], first[emb])  # loaded from stage 1 and frozen
    assert not torch.equal(paused[enc], first[enc])  # loaded, then trained

    ckpt = torch.load(source_ckpt, weights_only=False)  # stage 1 changes after stage 2 started
    ckpt["state_dict"] = {k: v + 1.0 if v.is_floating_point() else v for k, v in ckpt["state_dict"].items()}
    torch.save(ckpt, source_ckpt)
    assert run_main(["fit", "--config", str(path), "--ckpt_path", "last"], runs) == 0
    resumed = torch.load(runs / "stage2" / "checkpoints" / "last.ckpt", weights_only=True)
    assert resumed["global_step"] == 4 and resumed["hyper_parameters"]["init_from"]["path"] == "stage1"
    final = {k[len("backbone."):]: v for k, v in resumed["state_dict"].items() if k.startswith("backbone.")}
    assert torch.equal(final[emb], paused[emb])  # still the restored weights, not the changed stage 1
    assert 0 < (final[enc] - paused[enc]).abs().max() < 0.1  # trained on from the restored weights (stage 1 is +1)

    loaded = SequenceClassificationModule.load_from_checkpoint(runs / "stage2" / "checkpoints" / "last.ckpt")
    assert torch.equal(loaded.backbone.state_dict()[enc], final[enc])
    assert not loaded.backbone.bert.embeddings.word_embeddings.weight.requires_grad  # freeze holds


# -- the shipped configs through main.py (MiniLM, 3 steps each) ----------------------------------------------
@pytest.fixture(scope="module")
def prepared():
    for name in ("minilm", "tweets", "bbc"):
        prepared_dir(name)  # fail loudly (with the fix) if `make data` was not run


def minilm_weights() -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(prepared_dir("minilm") / "model.safetensors")


@pytest.mark.parametrize("name", ["minilm_features_top_tweets", "minilm_features_scalar_mix_tweets"])
def test_feature_configs_run_and_keep_minilm_frozen(name, prepared, tmp_path):
    assert run_main(["fit", "--config", str(ADAPT / f"{name}.yaml"), *QUICK], tmp_path) == 0
    ckpt = tmp_path / name / "checkpoints" / "last.ckpt"
    assert not backbone_tensors(ckpt) and ckpt.stat().st_size < 5e6  # frozen MiniLM not stored: rebuilt on load
    from ptm_app.adaptation.features import FeatureExtractionModule
    from ptm_app.inference.export import export_checkpoint, load_exported_module

    module = FeatureExtractionModule.load_from_checkpoint(ckpt).eval()
    trained, original = module.backbone.state_dict(), minilm_weights()
    shared = [k for k in original if k in trained]
    assert len(shared) > 90 and all(torch.equal(trained[k], original[k]) for k in shared)
    # export: MiniLM as a transformers model + the scalar mix and head as module weights; reload = same scores
    loaded = load_exported_module(export_checkpoint(ckpt, tmp_path / "export"))
    batch = dict(module.tokenizer(["delayed again, great", "thanks for the upgrade"], return_tensors="pt",
                                  padding=True))
    with torch.no_grad():
        assert torch.allclose(loaded(batch), module(batch), atol=1e-5)


def test_finetune_strategies_config_trains_only_the_head_first(prepared, tmp_path):
    name = "minilm_ulmfit_strategies_bbc"
    assert run_main(["fit", "--config", str(ADAPT / f"{name}.yaml"), *QUICK], tmp_path) == 0
    trained, original = backbone_tensors(tmp_path / name / "checkpoints" / "last.ckpt"), minilm_weights()
    encoder = [k for k in original if f"bert.{k}" in trained and not k.startswith("pooler")]
    assert len(encoder) > 90 and all(torch.equal(trained[f"bert.{k}"], original[k]) for k in encoder)
    ckpt = torch.load(tmp_path / name / "checkpoints" / "last.ckpt", weights_only=True)
    lrs = sorted({g["lr"] for g in ckpt["optimizer_states"][0]["param_groups"]})
    assert lrs[-1] / lrs[0] == pytest.approx(2.6 ** 6)  # 6 MiniLM layers below the top one


def test_ulmfit_chain_runs_stage_1_then_stage_2(prepared, tmp_path):
    assert run_main(["fit", "--config", str(ROOT / "configs" / "pretrain" / "minilm_ulmfit_lm_bbc.yaml"), *QUICK], tmp_path) == 0
    assert run_main(["fit", "--config", str(ADAPT / "minilm_ulmfit_classifier_bbc.yaml"), *QUICK], tmp_path) == 0
    lm = backbone_tensors(tmp_path / "minilm_ulmfit_lm_bbc" / "checkpoints" / "last.ckpt")
    clf = backbone_tensors(tmp_path / "minilm_ulmfit_classifier_bbc" / "checkpoints" / "last.ckpt")
    key = "bert.encoder.layer.0.attention.self.query.weight"  # frozen for the first 20 steps of stage 2
    assert torch.equal(clf[key], lm[key]) and not torch.equal(clf[key], minilm_weights()[key[len("bert."):]])
