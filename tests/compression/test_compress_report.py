"""``main.py compress-report``: the compression table measured from tiny runs of different kinds (a tiny 6-layer
BERT teacher fine-tuned 2 steps on BBC, its dynamic int8 and top-3-layers-dropped versions made by the rows' own
``make`` commands, an early-exit run at two exit rules); every number is checked against the models themselves."""
import json
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import TINY_BERT, run_main

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES, MAX_LENGTH = 12, 32


def early_exit_run(runs: Path, tmp: Path) -> Path:
    """A tiny 6-layer PABEE run on BBC (MiniLM's tokenizer), 2 steps."""
    cfg = {"seed_everything": 3,
           "trainer": {"max_steps": 2, "max_epochs": 1, "accelerator": "cpu", "limit_val_batches": 1,
                       "num_sanity_val_steps": 0, "enable_progress_bar": False, "enable_model_summary": False,
                       "logger": False},
           "model": {"class_path": "EarlyExitModule",
                     "init_args": {"backbone_config": {**TINY_BERT, "num_hidden_layers": 6}, "method": "pabee",
                                   "entropy_thresholds": [1.6], "patiences": [1]}},
           "data": {"class_path": "TaskDataModule",
                    "init_args": {"source": "bbc", "tokenizer": {"pretrained": "minilm"}, "max_length": MAX_LENGTH,
                                  "batch_size": 4}}}
    path = tmp / "exit.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert run_main(["fit", "--config", str(path)], runs) == 0
    return runs / "exit"


def params_of(model) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.slow  # ~30 s on 2 shared cores: two tiny fits, quantize, prune, the report
def test_report_measures_every_row_and_names_the_command_of_a_missing_one(tmp_path, capsys, monkeypatch):
    from ptm_app.analysis.representations import sample_indices
    from ptm_app.compression.early_exit import EarlyExitModule
    from ptm_app.compression.quantization import QUANT_WEIGHTS
    from ptm_app.inference.loading import load_for_inference
    from ptm_app.inference.quantize import accuracy, eval_records
    from tests.compression.test_compress_configs import tiny_teacher

    runs = tmp_path / "runs"
    teacher = tiny_teacher(runs, "teacher", tmp_path)
    exit_run = early_exit_run(runs, tmp_path)
    int8, pruned = tmp_path / "int8", tmp_path / "pruned"
    cfg = {"source": "bbc", "examples": EXAMPLES, "max_length": MAX_LENGTH, "repeats": 3, "run_name": "table",
           "teacher": {"name": "teacher", "model": "teacher"},
           "rows": [{"name": "int8", "model": str(int8),
                     "make": f"python main.py quantize --ckpt_path {teacher} --output_dir {int8} --repeats 1"},
                    {"name": "3 layers", "model": str(pruned),
                     "make": f"python main.py prune --ckpt_path {teacher} --output_dir {pruned} "
                             f"--drop_layers top:3 --repeats 1"},
                    {"name": "exit entropy", "model": "exit", "exit": "entropy:1.6"},
                    {"name": "exit patience", "model": "exit", "exit": "patience:1"}]}
    config = tmp_path / "report.yaml"
    config.write_text(yaml.safe_dump(cfg))
    capsys.readouterr()
    assert run_main(["compress-report", "--config", str(config)], runs) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'int8'" in err[0] and cfg["rows"][0]["make"] in err[0] and "1 more" in err[0], err

    sizes = []  # the timed forwards of the early-exit rows: the forward that stops
    real_exit_forward = EarlyExitModule.exit_forward
    monkeypatch.setattr(EarlyExitModule, "exit_forward",
                        lambda self, batch, rule=None: sizes.append(len(batch["input_ids"])) or
                        real_exit_forward(self, batch, rule))
    assert run_main(["compress-report", "--config", str(config), "--make_missing", "true"], runs) == 0
    assert int8.is_dir() and pruned.is_dir()  # made by the rows' commands
    out = runs / "table"
    rows = json.loads((out / "compression.json").read_text())
    assert [r["model"] for r in rows] == ["teacher", "int8", "3 layers", "exit entropy", "exit patience"]
    assert (out / "compression.png").stat().st_size > 0 and "| exit patience |" in (out / "compression.md").read_text()
    assert 32 in sizes and 1 in sizes  # batch 32 and batch 1 timed through exit_forward
    by = {r["model"]: r for r in rows}

    records = eval_records("bbc", "test", 0)
    records = [records[i] for i in sample_indices(len(records), EXAMPLES, 0)]
    fp32, small = load_for_inference(str(teacher)), load_for_inference(str(pruned))
    early = load_for_inference(str(exit_run))
    assert by["teacher"]["params"] == params_of(fp32.model)
    assert by["int8"]["params"] == params_of(fp32.model)  # the int8 weights counted as weights
    assert by["3 layers"]["params"] == params_of(small.model) < params_of(fp32.model)
    assert by["exit patience"]["params"] == params_of(early.model) + params_of(early.module.exits)
    assert by["int8"]["size_mb"] == round((int8 / QUANT_WEIGHTS).stat().st_size / 2**20, 3)
    assert by["int8"]["size_mb"] < by["teacher"]["size_mb"]

    teacher_acc = accuracy(fp32, records, MAX_LENGTH)
    assert by["teacher"]["metric"] == pytest.approx(teacher_acc)
    assert by["3 layers"]["metric"] == pytest.approx(accuracy(small, records, MAX_LENGTH))
    for r in rows:
        assert r["metric_pct_of_teacher"] == pytest.approx(100 * r["metric"] / teacher_acc, abs=0.01)
        for b in ("b1", "b32"):
            assert r[f"latency_{b}_ms"] > 0
            assert r[f"speedup_{b}"] == pytest.approx(by["teacher"][f"latency_{b}_ms"] / r[f"latency_{b}_ms"],
                                                      abs=2e-3)
    for name, rule in (("exit entropy", ("entropy", 1.6)), ("exit patience", ("patience", 1))):
        exits, correct = [], 0
        labels = list(early.module.hparams.labels)
        with torch.no_grad():
            for r in records:  # one at a time: each example's own exit
                enc = early.tokenizer([r["text"]], truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
                logits, layers, _ = early.module.exit_forward(dict(enc), rule)
                exits.append(int(layers[0]))
                correct += labels[int(logits.argmax(-1)[0])] == r["label"]
        assert by[name]["exit_layer"] == pytest.approx(sum(exits) / len(exits))
        assert by[name]["metric"] == pytest.approx(correct / len(records))
    assert by["exit patience"]["exit_layer"] < 6  # it does leave early


def test_bad_rows_are_one_line(tmp_path, capsys):
    runs = tmp_path / "runs"
    cfg = {"source": "bbc", "teacher": {"name": "t", "model": "nowhere", "make": "rm -rf /"}, "rows": []}
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(cfg))
    assert run_main(["compress-report", "--config", str(config)], runs) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a 'python main.py COMMAND ...' command" in err[0], err


@pytest.mark.parametrize("name", ["report_bbc", "report_tweets"])
def test_shipped_report_names_the_teacher_command_first(name, tmp_path, capsys):
    """As shipped, with no runs: one line naming the teacher's fine-tuning command; every row's make command is a
    main.py command whose configs exist."""
    from ptm_app.compression.report import CompressionRow, make_steps

    path = ROOT / "configs" / "compress" / f"{name}.yaml"
    cfg = yaml.safe_load(path.read_text())
    for row in [cfg["teacher"], *cfg["rows"]]:
        for argv in make_steps(CompressionRow(**row)):
            for i, word in enumerate(argv[:-1]):
                if word == "--config":
                    assert (ROOT / argv[i + 1]).is_file(), argv
    assert run_main(["compress-report", "--config", str(path)], tmp_path / "runs") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and cfg["teacher"]["make"] in err[0] and f"{len(cfg['rows'])} more" in err[0], err
