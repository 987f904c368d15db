"""TorchCompile: the compiled run's losses equal the eager run's, it pauses and resumes, its checkpoint loads into an
uncompiled module and exports, the inductor cache lands in cache_dir; where it cannot run it says so in one line."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from ptm_app.training.trainer import PtmTrainer
from ptm_app.errors import PtmError
from ptm_app.training.compile import TorchCompile, compile_units
from tests.conftest import TINY_BERT, TINY_GPT2, logged_losses, run_main, tiny_mlm_config

ROOT = Path(__file__).resolve().parents[2]
COMPILE = str(ROOT / "configs" / "memory" / "compile.yaml")


def no_dropout_config(corpus: Path, tmp: Path, **trainer) -> str:
    """The tiny MLM run without dropout (compiled dropout draws from inductor's own random stream) and without
    validation (the eval graph would be a second compile)."""
    path = tiny_mlm_config(corpus, tmp, limit_val_batches=0, **trainer)
    cfg = yaml.safe_load(path.read_text())
    cfg["model"]["init_args"]["backbone_config"].update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


@pytest.fixture(scope="module")
def runs(tiny_corpus, tmp_path_factory):
    """An eager 6-step run, and a compiled one paused at step 3 and resumed (the shipped compile.yaml)."""
    tmp = tmp_path_factory.mktemp("compile")
    runs, cache = tmp / "runs", tmp / "inductor"
    cfg = no_dropout_config(tiny_corpus, tmp, max_steps=6)
    compiled = ["fit", "--config", cfg, "--config", COMPILE, "--run_name", "compiled",
                "--trainer.callbacks.init_args.cache_dir", str(cache)]
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # TorchCompile sets it for the process: restore after
        assert run_main(["fit", "--config", cfg, "--run_name", "eager"], runs) == 0
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        assert run_main([*compiled, "--stop_at_step", "3"], runs) == 0
        assert run_main([*compiled, "--ckpt_path", "last"], runs) == 0
        compiled_graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs
    return runs, cache, compiled_graphs


def test_compiled_run_matches_eager_and_resumes(runs):
    runs, _, compiled_graphs = runs
    assert compiled_graphs >= 1  # dynamo really compiled something
    eager, compiled = logged_losses(runs / "eager"), logged_losses(runs / "compiled")
    assert sorted(eager) == sorted(compiled) == list(range(6))
    for step in range(6):
        assert compiled[step] == pytest.approx(eager[step], rel=1e-4), step


def test_checkpoint_loads_uncompiled_and_exports(runs, tmp_path):
    from ptm_app.objectives import MaskedLMModule

    runs, _, _ = runs
    eager = torch.load(runs / "eager" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    ckpt = runs / "compiled" / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, weights_only=True)["state_dict"]
    assert list(state) == list(eager)  # no "_orig_mod." anywhere
    for key, value in state.items():
        torch.testing.assert_close(value, eager[key], rtol=1e-3, atol=1e-4, msg=key)
    module = MaskedLMModule.load_from_checkpoint(ckpt)
    assert not any(m._compiled_call_impl is not None for m in module.modules())
    assert all(torch.equal(module.state_dict()[k], v) for k, v in state.items())
    out = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(runs / "compiled"), "--output_dir", str(out)], runs) == 0
    assert (out / "config.json").is_file()


def test_cache_dir_is_populated(runs):
    _, cache, _ = runs
    for kind in ("fxgraph", "aotautograd"):  # inductor's compiled-graph and AOTAutograd caches
        files = [p for p in (cache / kind).rglob("*") if p.is_file()]
        assert files, kind


def test_compile_units_are_the_blocks_wherever_they_are():
    from ptm_app.adaptation.classification import SequenceClassificationModule
    from ptm_app.objectives import CausalLMModule, MaskedLMModule

    bert = MaskedLMModule(backbone_config={**TINY_BERT, "vocab_size": 50}).build()
    assert [type(m).__name__ for m in compile_units(bert)] == ["BertLayer", "BertLayer"]
    gpt2 = CausalLMModule(backbone_config={**TINY_GPT2, "vocab_size": 50}).build()
    assert [type(m).__name__ for m in compile_units(gpt2)] == ["GPT2Block", "GPT2Block"]
    lora = SequenceClassificationModule(backbone_config={**TINY_BERT, "vocab_size": 50}, labels=["a", "b"],
                                        delta={"method": "lora", "r": 2}).build()
    units = compile_units(lora)  # inside the peft wrapper, with the LoRA layers in them
    assert len(units) == 2 and all(any("lora_A" in n for n, _ in u.named_parameters()) for u in units)
    albert = MaskedLMModule(backbone_config={"model_type": "albert", "vocab_size": 50, "embedding_size": 16,
                                            "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                                            "intermediate_size": 64}).build()
    assert compile_units(albert) == [albert.backbone.albert]  # no repeated block class: the base model whole


def one_line_error(capsys) -> str:
    """The one ``error:`` line on stderr, which is also the last thing said (as tests/cli/test_bad_input.py)."""
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1 and err[-1] == errors[0], err
    return errors[0]


def test_no_cpp_compiler_is_refused_in_one_line(tiny_corpus, tmp_path, monkeypatch, capsys):
    from torch._inductor import config as inductor_config

    monkeypatch.setattr(inductor_config.cpp, "cxx", ("ptm-no-such-compiler",))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    cfg = no_dropout_config(tiny_corpus, tmp_path, max_steps=1)
    assert run_main(["fit", "--config", cfg, "--config", COMPILE, "--run_name", "nocc"], tmp_path / "runs") == 2
    assert "TorchCompile: no C++ compiler found" in one_line_error(capsys)


def test_cuda_graphs_mode_is_refused_on_cpu(tiny_corpus, tmp_path, capsys):
    cfg = no_dropout_config(tiny_corpus, tmp_path, max_steps=1)
    argv = ["fit", "--config", cfg, "--config", COMPILE, "--run_name", "ro",
            "--trainer.callbacks.init_args.mode", "reduce-overhead"]
    assert run_main(argv, tmp_path / "runs") == 2
    assert "mode='reduce-overhead') is CUDA graphs, which need a GPU" in one_line_error(capsys)


def test_deepspeed_is_refused(monkeypatch):

    from ptm_app.objectives import MaskedLMModule
    from ptm_app.training.strategies import DeepSpeed

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # DeepSpeed() sets it for the process: restored after
    trainer = PtmTrainer(strategy=DeepSpeed(stage=2), accelerator="cpu", devices=1, logger=False)
    with pytest.raises(PtmError, match="TorchCompile is not supported with DeepSpeed"):
        TorchCompile().setup(trainer, MaskedLMModule(backbone_config={**TINY_BERT, "vocab_size": 50}), "fit")


def test_compile_config_appends_to_a_run_configs_callbacks(capsys):
    from ptm_app.main import main

    run = ROOT / "configs" / "adapt" / "minilm_ulmfit_classifier_bbc.yaml"  # has its own trainer.callbacks
    with pytest.raises(SystemExit) as done:
        main(["fit", "--config", str(run), "--config", COMPILE, "--print_config"])
    assert done.value.code in (0, None)
    callbacks = yaml.safe_load(capsys.readouterr().out)["trainer"]["callbacks"]
    assert [c["class_path"].split(".")[-1] for c in callbacks] == ["GradualUnfreezing", "TorchCompile"]
