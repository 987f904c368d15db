"""K-Adapter: adapters trained by named delta runs, loaded onto one frozen backbone; the backbone stays bit-identical
while the head (and nothing else) learns; the head reads [h; h_factual; h_linguistic]; a missing name is one line.
The backbone is a tiny BERT with MiniLM's tokenizer, saved as a prepared model is (the shipped recipes use MiniLM:
``test_configs``)."""
import pytest
import torch
import yaml

from ptm_app.main import main
from tests.conftest import run_main

pytestmark = pytest.mark.usefixtures("one_thread")


def adapter_run(base, corpus, tmp, runs, name: str, run_name: str, seed: int) -> None:
    cfg = {"seed_everything": seed,
           "trainer": {"max_steps": 2, "accelerator": "cpu", "devices": 1, "precision": "32-true",
                       "limit_val_batches": 1, "enable_progress_bar": False, "log_every_n_steps": 1},
           "model": {"class_path": "SequenceClassificationModule",
                     "init_args": {"backbone": str(base), "optim": {"lr": 1e-2, "warmup": 0},
                                   "delta": {"method": "houlsby", "name": name, "bottleneck": 8}}},
           "data": {"class_path": "TaskDataModule",
                    "init_args": {"source": str(corpus), "tokenizer": {"pretrained": str(base)}, "max_length": 24,
                                  "batch_size": 4, "limit_train": 8}}}
    path = tmp / f"{run_name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert run_main(["fit", "--config", str(path)], runs) == 0


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A 2-layer, 32-wide BERT with MiniLM's vocabulary and tokenizer, as a ``save_pretrained`` folder."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from ptm_app.data.sources import prepared_dir

    try:
        minilm = prepared_dir("minilm")
    except Exception:
        pytest.skip("minilm is not prepared (python main.py data prepare minilm)")
    out = tmp_path_factory.mktemp("tiny_base")
    tok = AutoTokenizer.from_pretrained(minilm)
    with torch.random.fork_rng():  # seeded, without moving the global RNG of the tests after
        torch.manual_seed(0)
        BertModel(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=64, max_position_embeddings=64)).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def adapter_runs(base, tiny_corpus, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kadapter")
    runs = tmp / "runs"
    adapter_run(base, tiny_corpus, tmp, runs, "factual", "factual_run", seed=3)
    adapter_run(base, tiny_corpus, tmp, runs, "linguistic", "linguistic_run", seed=4)  # another init: other weights
    return runs


def test_backbone_stays_frozen_and_the_head_reads_every_adapter(base, adapter_runs, tiny_corpus, monkeypatch):
    from transformers import AutoTokenizer

    from ptm_app.knowledge.k_adapter import KAdapterModule

    monkeypatch.setenv("PTM_RUNS_DIR", str(adapter_runs))
    module = KAdapterModule(backbone=str(base), labels=["neg", "pos"],
                            adapters={"factual": "factual_run", "linguistic": "linguistic_run"}).build()
    module.configure_model()
    frozen = {k: v.clone() for k, v in module.backbone.state_dict().items() if not k.startswith("delta_adapters.")}
    adapters = {k: v.clone() for k, v in module.backbone.state_dict().items() if k.startswith("delta_adapters.")}
    assert {k.split(".")[1] for k in adapters} == {"factual", "linguistic"}
    # the loaded adapters are the trained ones (their up-projections left zero after training 2 steps at lr 1e-2)
    assert any(k.endswith("up.weight") and v.abs().sum() > 0 for k, v in adapters.items())
    assert module.classifier[1].in_features == 3 * module.backbone.config.hidden_size

    tok = AutoTokenizer.from_pretrained(base)
    batch = dict(tok(["the cat sat on a mat", "markets rose as shares fell"], padding=True, return_tensors="pt"))
    batch["labels"] = torch.tensor([0, 1])
    module.train()
    features = module.features(batch)
    plain, factual, linguistic = features.chunk(3, dim=-1)
    assert not torch.allclose(plain, factual) and not torch.allclose(factual, linguistic)

    trainable = [p for p in module.parameters() if p.requires_grad]
    assert {id(p) for p in trainable} == {id(p) for p in module.classifier.parameters()}
    head_before = module.classifier[1].weight.clone()
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-2, weight_decay=0.1)  # every parameter offered
    for _ in range(3):
        loss = module.kind.loss(module(batch), batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    state = module.backbone.state_dict()
    assert all(torch.equal(state[k], v) for k, v in frozen.items())  # bit-identical backbone
    assert all(torch.equal(state[k], v) for k, v in adapters.items())  # adapters frozen too (train_adapters: false)
    assert not torch.equal(module.classifier[1].weight, head_before)


def test_a_named_adapter_that_does_not_exist_is_one_line(base, adapter_runs, tiny_corpus, tmp_path, capsys):
    cfg = {"trainer": {"max_steps": 1, "accelerator": "cpu", "devices": 1, "enable_progress_bar": False},
           "model": {"class_path": "KAdapterModule",
                     "init_args": {"backbone": str(base),
                                   "adapters": {"factual": "factual_run", "syntax": "linguistic_run"}}},
           "data": {"class_path": "TaskDataModule",
                    "init_args": {"source": str(tiny_corpus), "tokenizer": {"pretrained": str(base)}, "max_length": 24,
                                  "batch_size": 4}}}
    path = tmp_path / "kadapter_bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PTM_RUNS_DIR", str(adapter_runs))
        code = main(["fit", "--config", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1 and err[-1] == errors[0], err
    assert "adapters.syntax: no adapter named 'syntax'" in errors[0] and "it has 'linguistic'" in errors[0]


def test_k_adapter_run_resumes_exactly_and_reloads(base, adapter_runs, tiny_corpus, tmp_path, capsys):
    """A K-Adapter fit paused at step 2 and resumed logs the full run's losses; its checkpoint holds the adapters and
    the head but not the frozen base, and ``load_from_checkpoint`` rebuilds the same model without the adapter runs;
    its export (base + adapters + head) reloads to identical outputs and predicts what the run predicts."""
    from ptm_app.checkpoint_io.reading import read_checkpoint
    from ptm_app.knowledge.k_adapter import KAdapterModule
    from tests.conftest import assert_resumes_exactly

    cfg = {"seed_everything": 5,
           "trainer": {"max_steps": 4, "accelerator": "cpu", "devices": 1, "precision": "32-true",
                       "val_check_interval": 2, "limit_val_batches": 1, "enable_progress_bar": False,
                       "log_every_n_steps": 1},
           "model": {"class_path": "KAdapterModule",
                     "init_args": {"backbone": str(base), "optim": {"lr": 1e-2, "warmup": 0},
                                   "adapters": {"factual": "factual_run", "linguistic": "linguistic_run"}}},
           "data": {"class_path": "TaskDataModule",
                    "init_args": {"source": str(tiny_corpus), "tokenizer": {"pretrained": str(base)}, "max_length": 24,
                                  "batch_size": 4, "limit_train": 12}}}
    path = tmp_path / "kadapter_tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert_resumes_exactly(["fit", "--config", str(path)], adapter_runs, stop=2, steps=4)
    last = adapter_runs / "full" / "checkpoints" / "last.ckpt"
    state = read_checkpoint(last)["state_dict"]
    assert any(k.startswith("backbone.delta_adapters.factual.") for k in state)
    assert not any(k.startswith("backbone.encoder.") for k in state)  # the frozen base is rebuilt, not stored
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PTM_RUNS_DIR", str(tmp_path / "elsewhere"))  # the adapter runs are not needed to reload
        module = KAdapterModule.load_from_checkpoint(last)
    assert torch.equal(module.classifier[1].weight, state["classifier.1.weight"])
    assert torch.equal(module.backbone.delta_adapters["linguistic"].ffn[0].up.weight,
                       state["backbone.delta_adapters.linguistic.ffn.0.up.weight"])
    # export: the frozen base as a save_pretrained model, the adapters and the head as the module's weights
    import json

    from safetensors.torch import load_file
    from transformers import AutoModel

    from ptm_app.inference.export import load_exported_module

    out = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(last), "--output_dir", str(out)], adapter_runs) == 0
    saved = load_file(str(out / "module_weights.safetensors"))
    assert torch.equal(saved["backbone.delta_adapters.factual.ffn.0.up.weight"],
                       state["backbone.delta_adapters.factual.ffn.0.up.weight"])
    assert torch.equal(saved["classifier.1.weight"], state["classifier.1.weight"])
    plain = AutoModel.from_pretrained(out)  # the plain base: no adapter keys in it
    assert not any("delta_adapters" in k for k in plain.state_dict())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PTM_RUNS_DIR", str(tmp_path / "elsewhere"))  # neither the runs nor the checkpoint are needed
        reloaded = load_exported_module(out)
    texts = ["the cat sat on the mat", "songs of the sea were sung", "a dog"]
    batch = module.make_collator(reloaded.tokenizer)([{"input_ids": torch.tensor(ids), "key": i} for i, ids in
                                                      enumerate(reloaded.tokenizer(texts)["input_ids"])])
    module.eval()
    with torch.no_grad():
        expected, got = module(batch), reloaded(batch)
    assert torch.equal(expected, got)  # the same model, bit for bit
    without = module.classifier(torch.cat([module.features(batch)[:, :module.backbone.config.hidden_size]] * 3, -1))
    assert not torch.allclose(without, expected)  # and the adapters' states do count in it
    # predict on the export and on the run: the same label and probabilities
    capsys.readouterr()
    assert main(["predict", "--ckpt_path", str(out), "--text", texts[1]]) == 0
    from_export = json.loads(capsys.readouterr().out.strip())
    assert main(["predict", "--ckpt_path", str(last), "--text", texts[1]]) == 0
    from_run = json.loads(capsys.readouterr().out.strip())
    assert from_export["label"] == from_run["label"]
    for label, p in from_run["probs"].items():
        assert from_export["probs"][label] == pytest.approx(p, abs=1e-6)
    probs = torch.softmax(expected[1], -1).tolist()
    assert [from_export["probs"][name] for name in module.hparams.labels] == pytest.approx(probs, abs=1e-6)
