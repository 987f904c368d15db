"""Bad input gives a non-zero exit and exactly one clear line on stderr, never a traceback."""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ptm_app.main import main
from tests.conftest import TINY_BERT, tiny_mlm_config, write_jsonl

ROOT = Path(__file__).resolve().parents[2]


def run(argv, capsys) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1 and err[-1] == errors[0], err  # one line, and the last thing said
    return errors[0]


def override(tmp_path, base: Path, **sections) -> Path:
    cfg = yaml.safe_load(base.read_text())
    for section, values in sections.items():
        target = cfg[section]["init_args"] if "init_args" in cfg.get(section, {}) else cfg[section]
        target.update(values)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture
def base(tiny_corpus, tmp_path) -> Path:
    return tiny_mlm_config(tiny_corpus, tmp_path, max_steps=2)


def test_unknown_config_key_is_named(base, tmp_path, capsys):
    cfg = override(tmp_path, base, model={"mlm_probabilty": 0.2})
    line = run(["fit", "--config", str(cfg)], capsys)
    assert "mlm_probabilty" in line and "unknown config key" in line


def test_unknown_class_is_named(base, tmp_path, capsys):
    cfg = yaml.safe_load(base.read_text())
    cfg["model"]["class_path"] = "MaskedLMModul"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    line = run(["fit", "--config", str(tmp_path / "c.yaml")], capsys)
    assert "MaskedLMModul" in line


def test_missing_prepared_data_says_how_to_prepare(base, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PTM_DATA_DIR", str(tmp_path / "empty-data-root"))
    cfg = override(tmp_path, base, data={"source": "tweets"})
    line = run(["fit", "--config", str(cfg)], capsys)
    assert "python main.py data prepare tweets" in line


def test_missing_model_says_how_to_prepare(base, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PTM_DATA_DIR", str(tmp_path / "empty-data-root"))
    cfg = override(tmp_path, base, model={"backbone": "minilm", "backbone_config": None})
    line = run(["fit", "--config", str(cfg)], capsys)
    assert "minilm" in line and "data prepare" in line


def test_malformed_jsonl_line_gives_file_and_line(base, tmp_path, capsys):
    corpus = tmp_path / "corpus"
    write_jsonl(corpus / "train.jsonl", [{"text": "a fine line of text"}] * 5)
    with open(corpus / "train.jsonl", "a") as fh:
        fh.write('{"text": "broken\n')
    cfg = override(tmp_path, base, data={"source": str(corpus)})
    line = run(["fit", "--config", str(cfg)], capsys)
    assert "train.jsonl:6: malformed JSON" in line


def test_empty_corpus(base, tmp_path, capsys):
    corpus = tmp_path / "corpus"
    write_jsonl(corpus / "train.jsonl", [{"text": ""}, {"text": "  "}])
    cfg = override(tmp_path, base, data={"source": str(corpus),
                                         "tokenizer": {"pretrained": None, "train": "wordpiece", "vocab_size": 100}})
    line = run(["fit", "--config", str(cfg)], capsys)
    assert "empty" in line or "no text" in line


def test_label_outside_label_set(tiny_corpus, tmp_path, capsys):
    corpus = tmp_path / "task"
    write_jsonl(corpus / "train.jsonl", [{"text": "good film", "label": "pos"}, {"text": "bad film", "label": "neg"}])
    write_jsonl(corpus / "validation.jsonl", [{"text": "fine", "label": "pos"}, {"text": "meh", "label": "meh"}])
    cfg = {
        "trainer": {"max_steps": 1, "accelerator": "cpu", "enable_progress_bar": False},
        "model": {"class_path": "SequenceClassificationModule", "init_args": {"backbone_config": TINY_BERT}},
        "data": {"class_path": "TaskDataModule", "init_args": {
            "source": str(corpus), "tokenizer": {"train": "wordpiece", "vocab_size": 60, "min_frequency": 1}}},
    }
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(cfg))
    line = run(["fit", "--config", str(tmp_path / "t.yaml")], capsys)
    assert "validation.jsonl:2" in line and "'meh'" in line


def test_sequence_longer_than_backbone(base, tmp_path, capsys):
    cfg = override(tmp_path, base, data={"max_length": 100})  # TINY_BERT has 64 positions
    line = run(["fit", "--config", str(cfg)], capsys)
    assert "max_length=100" in line and "64" in line


def test_fp16_on_cpu_is_refused(base, capsys):
    line = run(["fit", "--config", str(base), "--trainer.precision", "16-mixed"], capsys)
    assert "bf16-mixed" in line


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="asks for a GPU that is not there")
def test_a_gpu_that_is_not_there_is_refused(base, capsys):
    line = run(["fit", "--config", str(base), "--trainer.accelerator", "gpu"], capsys)
    assert "no CUDA GPU is visible here" in line and "accelerator: auto" in line


def test_more_devices_than_present_is_refused(base, capsys):
    from ptm_app.training.precision import _cpu_cores

    more = _cpu_cores() + 1  # one more than there is (if the check failed, Lightning would start that many ranks)
    line = run(["fit", "--config", str(base), "--trainer.devices", str(more)], capsys)
    assert line.startswith(f"error: trainer.devices {more}: this machine has {more - 1} CPU cores") and "or fewer" in line


def test_resume_without_checkpoint_is_an_error(base, capsys):
    line = run(["fit", "--config", str(base), "--ckpt_path", "last"], capsys)
    assert "no checkpoint" in line


@pytest.mark.parametrize("section,values,expected", [
    ("model", {"nonsense_key": 1}, "error: unknown config key 'model.init_args.nonsense_key'"),
    ("data", {"source": "no-such-dataset"}, "error: data source 'no-such-dataset' not found"),
])
def test_exit_code_and_single_line_from_a_real_process(base, tmp_path, section, values, expected):
    cfg = override(tmp_path, base, **{section: values})
    out = subprocess.run([sys.executable, str(ROOT / "main.py"), "fit", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith(expected), out.stderr[-1500:]
    assert "Traceback" not in out.stderr


def test_a_lightning_settings_clash_is_one_line(tmp_path, tiny_corpus, capsys):
    # validation counted per epoch (the user's own check_val_every_n_epoch): 500 batches do not fit in one
    cfg = tiny_mlm_config(tiny_corpus, tmp_path, val_check_interval=500, max_steps=600, check_val_every_n_epoch=1)
    assert main(["fit", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: trainer settings:") and "val_check_interval" in err[-1], err[-3:]


@pytest.mark.parametrize("key,value", [("batch_size", "0"), ("batch_size", "-4"), ("eval_batch_size", "0")])
def test_a_batch_size_below_one_is_one_line(base, capsys, key, value):
    line = run(["fit", "--config", str(base), f"--data.init_args.{key}", value], capsys)
    assert line.startswith(f"error: data.init_args.{key}={value}: a batch holds at least one example"), line


def test_every_data_module_refuses_a_batch_size_below_one():
    """The shared check (``datamodules.check_batch_sizes``) runs in every data module that takes a batch size, and
    the registry of config classes holds every data module."""
    import inspect

    import lightning.pytorch as pl

    from ptm_app.checkpoint_io.module_classes import config_classes
    from ptm_app.errors import PtmError

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    import importlib
    import pkgutil

    import ptm_app

    for info in pkgutil.walk_packages(ptm_app.__path__, "ptm_app."):  # every module, so none is missed below
        if info.name.startswith(("ptm_app.data", "ptm_app.knowledge", "ptm_app.training")):
            importlib.import_module(info.name)
    modules = {c for c in subclasses(pl.LightningDataModule) if c.__module__.startswith("ptm_app")
               and not c.__name__.startswith("_") and "batch_size" in inspect.signature(c).parameters}
    assert modules <= set(config_classes().values())  # each of them can be named by a config
    assert {"PretrainDataModule", "TaskDataModule", "MultitaskDataModule", "MLMPairsDataModule", "QADataModule",
            "KeplerDataModule"} <= {c.__name__ for c in modules}
    for cls in modules:
        required = {name: "x" for name, p in inspect.signature(cls).parameters.items()
                    if p.default is inspect.Parameter.empty}
        required.update({"tokenizer": {"train": "wordpiece"}} if "tokenizer" in required else {})
        for key, value in (("batch_size", 0), ("batch_size", -2), ("eval_batch_size", 0)):
            with pytest.raises(PtmError, match=f"data.init_args.{key}={value}: a batch holds at least one"):
                cls(**required, **{key: value})


def test_a_missing_config_file_is_named(tmp_path, capsys):
    missing = tmp_path / "no_such.yaml"
    assert run(["fit", "--config", str(missing)], capsys) == \
        f"error: config file {missing} does not exist; check the path"  # was "error: config: "
    assert run(["probe", "--config", str(missing)], capsys) == \
        f"error: config file {missing} does not exist; check the path"


def test_an_old_dotted_class_path_of_a_moved_class_is_one_line_naming_its_short_name(base, tmp_path, capsys):
    """An old run's config.yaml names its classes dotted; a class that moved since (LIBERT to knowledge/, the
    compression classes to adaptation/) is one line naming the short name, not jsonargparse's attribute error."""
    settings = yaml.safe_load(Path(base).read_text())
    settings["model"]["class_path"] = "ptm_app.compression.distillation.DistillationModule"
    old = tmp_path / "old_run_config.yaml"
    old.write_text(yaml.safe_dump(settings))
    assert run(["fit", "--config", str(old)], capsys) == (
        f"error: {old}: class_path ptm_app.compression.distillation.DistillationModule is not there any more (ptm_app "
        f"moved it); write its short name, class_path: DistillationModule")
    from ptm_app.checkpoint_io.module_classes import check_class_paths

    for there in ("ptm_app.objectives.mlm.MaskedLMModule", "ptm_app.adaptation.DistillationModule", "MaskedLMModule"):
        check_class_paths({"model": {"class_path": there}}, "c.yaml")  # today's names pass


def test_a_config_including_another_is_one_line_naming_repeated_config(base, tmp_path, capsys):
    """jsonargparse loads a ``config:`` key inside a file, then replaces whole groups with the including file's
    (``trainer: {max_steps: 3}`` silently dropped the base's other trainer settings): refused, naming the order of
    two ``--config`` files, which merge key by key."""
    including = tmp_path / "short.yaml"
    including.write_text(f"config: {base}\ntrainer:\n  max_steps: 3\n")
    assert run(["fit", "--config", str(including)], capsys) == (
        f"error: {including}: a config does not include another ('config: {base}'): jsonargparse would replace whole "
        f"groups such as trainer: with this file's; give both in order instead: --config {base} --config {including}")


@pytest.mark.parametrize("text,where,problem", [
    ("model:\n  init_args:\n    lr: [1, 2\n    warmup: 3\n", ":4:11:", "(while parsing a flow sequence that began at "
                                                                         "line 3)"),
    ("trainer:\n  max_steps: 2\n\tdevices: 1\n", ":3:1:", "found character '\\t' that cannot start any token"),
])
def test_a_yaml_error_names_the_file_and_the_line(base, tmp_path, capsys, text, where, problem):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    line = run(["fit", "--config", str(base), "--config", str(bad)], capsys)  # the second of two files
    assert line.startswith(f"error: {bad}{where} invalid YAML: ") and problem in line, line


def test_a_sharded_checkpoint_directory_under_a_single_device_run_is_one_line(base, tmp_path, capsys):
    """An FSDP ``torch.distributed.checkpoint`` directory given to a single-device fit / test (an IsADirectoryError
    traceback from inside Lightning before)."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    shards = tmp_path / "last.ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save({"state_dict": {"w": torch.randn(3, 4)}}, checkpoint_id=shards, no_dist=True)
    torch.save({"global_step": 3}, shards / "meta.pt")
    for command in ("fit", "test"):
        line = run([command, "--config", str(base), "--ckpt_path", str(shards)], capsys)
        assert f"--ckpt_path {shards} is a sharded (FSDP) checkpoint directory" in line
        assert f"python main.py export --ckpt_path {shards}" in line


@pytest.mark.parametrize("key,value,expected", [
    ("optim.name", "sgd", "model.init_args.optim.name: expected one of 'adamw', 'lamb', 'adafactor', got sgd"),
    ("optim.lr", "fast", "model.init_args.optim.lr: expected float, got fast"),
    ("targets", '[{"class_path": "MaskedLM", "init_args": {"masking": "words"}}]',
     "masking: expected one of 'token', 'whole_word', 'span', 'knowledge', got words"),
])
def test_a_bad_nested_value_names_the_full_key_and_what_it_accepts(base, capsys, key, value, expected):
    assert expected in run(["fit", "--config", str(base), f"--model.init_args.{key}", value], capsys)
