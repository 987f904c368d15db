"""``main.py compress-report``: the compression table measured from tiny models of different kinds (a tiny 6-layer
BERT teacher as a plain export, its dynamic int8 and top-3-layers-dropped versions made by the rows' own ``make``
commands, an early-exit run at two exit rules); every number is checked against the models themselves.  The shipped
report configs: their make commands parse and write their rows' models, and (slow) they run as shipped with every
row substituted by a tiny model of its kind."""
import json
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import TINY_BERT, run_main

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES, MAX_LENGTH = 12, 32


def early_exit_run(runs: Path, tmp: Path, source: str = "bbc") -> Path:
    """A tiny 6-layer PABEE run on ``source`` (MiniLM's tokenizer), 2 steps."""
    cfg = {"seed_everything": 3,
           "trainer": {"max_steps": 2, "max_epochs": 1, "accelerator": "cpu", "limit_val_batches": 1,
                       "num_sanity_val_steps": 0, "enable_progress_bar": False, "enable_model_summary": False,
                       "logger": False},
           "model": {"class_path": "EarlyExitModule",
                     "init_args": {"backbone_config": {**TINY_BERT, "num_hidden_layers": 6}, "method": "pabee",
                                   "entropy_thresholds": [1.6], "patiences": [1]}},
           "data": {"class_path": "TaskDataModule",
                    "init_args": {"source": source, "tokenizer": {"pretrained": "minilm"}, "max_length": MAX_LENGTH,
                                  "batch_size": 4}}}
    path = tmp / "exit.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert run_main(["fit", "--config", str(path)], runs) == 0
    return runs / "exit"


def params_of(model) -> int:
    return sum(p.numel() for p in model.parameters())


def plain_teacher(tmp: Path, source: str = "bbc") -> Path:
    """A tiny 6-layer BERT classifier over ``source``'s labels with MiniLM's tokenizer, as a plain export
    directory."""
    import transformers

    from ptm_app.backbones.model_classes import from_config
    from ptm_app.data.sources import prepared_dir
    from ptm_app.inference.loading import EXPORT_INFO
    from ptm_app.compression.quantize import eval_records

    labels = sorted({r["label"] for r in eval_records(source, "test", 0)})
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(**{**TINY_BERT, "num_hidden_layers": 6}, vocab_size=30522,
                                               num_labels=len(labels), id2label=dict(enumerate(labels)),
                                               label2id={label: i for i, label in enumerate(labels)})
    out = tmp / "teacher"
    from_config("sequence_classification", config).save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(prepared_dir("minilm")).save_pretrained(out)
    (out / EXPORT_INFO).write_text(json.dumps({"model_class": "sequence_classification"}))
    return out


def report_config(tmp: Path, teacher: str, rows: list[dict], targets: list[dict] = (), **more) -> Path:
    cfg = {"source": "bbc", "examples": EXAMPLES, "max_length": MAX_LENGTH, "repeats": 3, "run_name": "table",
           "teacher": {"name": "teacher", "model": teacher}, "rows": rows, "targets": list(targets), **more}
    config = tmp / "report.yaml"
    config.write_text(yaml.safe_dump(cfg))
    return config


def scored_records() -> list[dict]:
    from ptm_app.analysis.representations import sample_indices
    from ptm_app.compression.quantize import eval_records

    records = eval_records("bbc", "test", 0)
    return [records[i] for i in sample_indices(len(records), EXAMPLES, 0)]


def check_table(out: Path, names: list[str]) -> dict:
    """The table's rows by name, after the checks every row passes: metric % and speed-ups from its own numbers."""
    rows = json.loads((out / "compression.json").read_text())
    assert [r["model"] for r in rows] == names
    assert (out / "compression.png").stat().st_size > 0 and f"| {names[-1]} |" in (out / "compression.md").read_text()
    teacher = rows[0]
    for r in rows:
        assert r["metric_pct_of_teacher"] == pytest.approx(100 * r["metric"] / teacher["metric"], abs=0.01)
        for b in ("b1", "b32"):
            assert r[f"latency_{b}_ms"] > 0
            assert r[f"speedup_{b}"] == pytest.approx(teacher[f"latency_{b}_ms"] / r[f"latency_{b}_ms"], abs=2e-3)
    return {r["model"]: r for r in rows}


def test_report_on_an_export_its_int8_and_its_dropped_layers(tmp_path, capfd):
    """The rows' make commands (quantize, prune) run first; parameters, size and accuracy are the models' own; the
    texts longer than max_length are named once, not once per row."""
    from ptm_app.compression.quantization import QUANT_WEIGHTS
    from ptm_app.inference.loading import load_for_inference
    from ptm_app.inference.compress_commands import accuracy

    runs = tmp_path / "runs"
    teacher = plain_teacher(tmp_path)
    int8, pruned = tmp_path / "int8", tmp_path / "pruned"
    config = report_config(tmp_path, str(teacher), [
        {"name": "int8", "model": str(int8),
         "make": f"python main.py quantize --ckpt_path {teacher} --output_dir {int8} --repeats 1"},
        {"name": "3 layers", "model": str(pruned),
         "make": f"python main.py prune --ckpt_path {teacher} --output_dir {pruned} --drop_layers top:3 --repeats 1"}],
        targets=[{"row": "int8", "min_speedup_b1": 0.01, "max_metric_drop": 100},
                 {"row": "3 layers", "min_metric_pct": 1000, "min_speedup_b32": 1.2, "beats": "int8"}],
        readme=str(tmp_path / "README.md"))
    (tmp_path / "README.md").write_text("intro\n<!-- table:start -->\n<!-- table:end -->\nend\n")
    assert run_main(["compress-report", "--config", str(config), "--make_missing", "true"], runs) == 0
    said = capfd.readouterr().err
    notes = [line for line in said.splitlines() if "longer than max_length" in line]
    assert len(notes) == 1 and notes[0].startswith("note: ") and f"of {EXAMPLES} bbc/test texts" in notes[0], notes
    assert "Token indices sequence length" not in said
    by = check_table(runs / "table", ["teacher", "int8", "3 layers"])
    judged = [(r["row"], r["target"], r["met"]) for r in json.loads((runs / "table" / "compression_targets.json")
                                                                   .read_text())]
    yes = {True: "yes", False: "no"}
    assert judged == [  # each condition judged from the table's own numbers
        ("int8", "at most 100 point(s) below the teacher", "yes"), ("int8", "batch-1 speed-up >= 0.01x", "yes"),
        ("3 layers", "metric >= 1000 % of the teacher's", "no"),
        ("3 layers", "batch-32 speed-up >= 1.2x", yes[by["3 layers"]["speedup_b32"] >= 1.2]),
        ("3 layers", "metric above 'int8' (McNemar p < 0.05)", "no")]  # a 2-step tiny model: never significantly
    assert "| 3 layers | metric >= 1000 % of the teacher's |" in (runs / "table" / "compression_targets.md").read_text()
    both = "\n".join((runs / "table" / f).read_text() for f in ("compression.md", "compression_targets.md"))
    assert (tmp_path / "README.md").read_text() == f"intro\n<!-- table:start -->\n{both.rstrip()}\n<!-- table:end -->\nend\n"
    records = scored_records()
    fp32, small, quant = (load_for_inference(str(d)) for d in (teacher, pruned, int8))
    assert by["teacher"]["params"] == params_of(fp32.model)
    assert by["int8"]["params"] == params_of(fp32.model)  # the int8 weights counted as weights
    assert by["3 layers"]["params"] == params_of(small.model) < params_of(fp32.model)
    assert by["int8"]["size_mb"] == round((int8 / QUANT_WEIGHTS).stat().st_size / 2**20, 3) < by["teacher"]["size_mb"]
    for name, loaded in (("teacher", fp32), ("int8", quant), ("3 layers", small)):
        assert by[name]["metric"] == pytest.approx(accuracy(loaded, records, MAX_LENGTH))


def test_report_names_a_missing_row_and_times_early_exit_by_exiting(tmp_path, capsys, monkeypatch):
    from ptm_app.compression.early_exit_policy import EarlyExit
    from ptm_app.inference.loading import load_for_inference
    from ptm_app.inference.compress_commands import accuracy

    runs = tmp_path / "runs"
    teacher = plain_teacher(tmp_path)
    exit_run = early_exit_run(runs, tmp_path)
    int8 = tmp_path / "int8"
    make = f"python main.py quantize --ckpt_path {teacher} --output_dir {int8} --repeats 1"
    config = report_config(tmp_path, str(teacher), [  # the early exit: a run name under the runs directory
        {"name": "int8", "model": str(int8), "make": make},
        {"name": "exit entropy", "model": "exit", "exit": "entropy:1.6"},
        {"name": "exit patience", "model": "exit", "exit": "patience:1"}])
    capsys.readouterr()
    assert run_main(["compress-report", "--config", str(config)], runs) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'int8'" in err[0] and make in err[0], err
    assert run_main(["quantize", "--ckpt_path", str(teacher), "--output_dir", str(int8), "--repeats", "1"], runs) == 0

    sizes = []  # the timed forwards of the early-exit rows: the forward that stops (the early_exit policy's)
    real_exit_forward = EarlyExit.exit_forward
    monkeypatch.setattr(EarlyExit, "exit_forward",
                        lambda self, module, batch, rule=None: sizes.append(len(batch["input_ids"])) or
                        real_exit_forward(self, module, batch, rule))
    assert run_main(["compress-report", "--config", str(config)], runs) == 0
    assert 32 in sizes and 1 in sizes  # batch 32 and batch 1 timed through exit_forward
    by = check_table(runs / "table", ["teacher", "int8", "exit entropy", "exit patience"])
    records = scored_records()
    fp32, early = load_for_inference(str(teacher)), load_for_inference(str(exit_run))
    assert by["teacher"]["params"] == by["int8"]["params"] == params_of(fp32.model)
    assert by["teacher"]["metric"] == pytest.approx(accuracy(fp32, records, MAX_LENGTH))
    assert by["exit patience"]["params"] == params_of(early.model) + params_of(early.module.exits)
    labels = list(early.module.hparams.labels)
    for name, rule in (("exit entropy", ("entropy", 1.6)), ("exit patience", ("patience", 1))):
        exits, correct = [], 0
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


@pytest.mark.parametrize("target,said", [({"row": "int9", "min_speedup_b1": 1.5}, "names row 'int9', which is not"),
                                         ({"row": "t", "beats": "nobody"}, "names row 'nobody', which is not"),
                                         ({"row": "t"}, "sets no condition"),
                                         (None, "nothing.md not found")])
def test_bad_targets_are_one_line_before_anything_runs(tmp_path, capsys, target, said):
    runs = tmp_path / "runs"
    cfg = {"source": "bbc", "teacher": {"name": "t", "model": "nowhere"}, "rows": [], "targets": [target] if target
           else [], "readme": str(tmp_path / "nothing.md")}
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump(cfg))
    assert run_main(["compress-report", "--config", str(config)], runs) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err


def made_by(argv: list[str]) -> str:
    """The directory a make step writes: a fit's run directory, a quantize / prune output directory."""
    flags = dict(zip(argv[1::2], argv[2::2]))  # every option of these commands takes one value
    if argv[0] == "fit":
        return f"checkpoints/{flags.get('--run_name') or Path(flags['--config']).stem}"
    return flags["--output_dir"]


@pytest.mark.parametrize("name", ["minilm_report_bbc", "minilm_report_tweets"])
def test_shipped_report_names_the_teacher_command_first(name, tmp_path, capsys, monkeypatch):
    """As shipped, with no runs: one line naming the teacher's fine-tuning command.  Every row's make command is a
    main.py command whose last step writes the row's model, and every fit step parses (``--print_config``: the
    overrides that retarget a BBC recipe are real keys)."""
    from ptm_app.experiments.compression_report import CompressionRow, make_steps, make_text

    path = ROOT / "configs" / "compress" / f"{name}.yaml"
    cfg = yaml.safe_load(path.read_text())
    monkeypatch.chdir(ROOT)  # the make commands name configs by their paths in the repository
    for row in [cfg["teacher"], *cfg["rows"]]:
        steps = make_steps(CompressionRow(**row))
        assert made_by(steps[-1]) == row["model"], row
        for argv in steps:
            assert argv[0] in ("fit", "quantize", "prune"), argv
            if argv[0] == "fit":
                capsys.readouterr()
                with pytest.raises(SystemExit) as stop:
                    run_main([*argv, "--print_config"], tmp_path / "runs")
                assert stop.value.code in (0, None), argv
                printed = yaml.safe_load(capsys.readouterr().out)
                assert printed["run_name"] in (None, made_by(argv).rpartition("/")[2]) and (
                    (ROOT / argv[argv.index("--config") + 1]).is_file())
    monkeypatch.chdir(tmp_path)  # the rows' relative paths must not find runs a developer made in the repo
    assert run_main(["compress-report", "--config", str(path)], tmp_path / "runs") == 2
    err = capsys.readouterr().err.strip().splitlines()
    teacher = make_text(CompressionRow(**cfg["teacher"]))
    assert teacher == f"python main.py fit --config {cfg['teacher']['make'][0]['fit']['config']}"
    assert len(err) == 1 and f"make it with: {teacher} (" in err[0] and f"{len(cfg['rows'])} more" in err[0], err


def test_make_steps_are_mappings_and_old_command_strings_still_load():
    """A row's make is a list of {command: options} (options as a sweep plan's overrides); a report written before
    (one command string, several joined by &&) gives the same argument lists; a malformed step is one line."""
    from ptm_app.errors import PtmError
    from ptm_app.experiments.compression_report import CompressionRow, make_steps, make_text

    new = CompressionRow(name="qat", model="checkpoints/int8", make=[
        {"fit": {"config": "configs/compress/minilm_qat_bbc.yaml", "run_name": "q", "trainer.max_epochs": 1,
                 "model.init_args.qat.activations": True}},
        {"quantize": {"ckpt_path": "checkpoints/q", "output_dir": "checkpoints/int8", "backend": "q8bert_static"}}])
    old = CompressionRow(name="qat", model="checkpoints/int8", make=(
        "python main.py fit --config configs/compress/minilm_qat_bbc.yaml --run_name q --trainer.max_epochs 1 "
        "--model.init_args.qat.activations true && python main.py quantize --ckpt_path checkpoints/q "
        "--output_dir checkpoints/int8 --backend q8bert_static"))
    assert make_steps(new) == make_steps(old) == [
        ["fit", "--config", "configs/compress/minilm_qat_bbc.yaml", "--run_name", "q", "--trainer.max_epochs", "1",
         "--model.init_args.qat.activations", "true"],
        ["quantize", "--ckpt_path", "checkpoints/q", "--output_dir", "checkpoints/int8", "--backend", "q8bert_static"]]
    assert make_text(new) == old.make
    for bad in ([{"fit": "a.yaml"}], [{"fit": {}, "quantize": {}}], ["python main.py fit"]):
        with pytest.raises(PtmError, match=r"row 'qat': make step .* is not one command and its options; write e\.g\. "
                                           r"make: \[\{fit: \{config: "):
            make_steps(CompressionRow(name="qat", model="m", make=bad))


@pytest.mark.slow  # ~30 s: an early-exit fit, 16 tiny models scored and timed
@pytest.mark.parametrize("name", ["minilm_report_bbc", "minilm_report_tweets"])
def test_shipped_report_runs_as_shipped_on_tiny_substitutes(name, tmp_path, monkeypatch):
    """Every row of the shipped config SUBSTITUTED under its run name by a tiny model of its kind (a plain export,
    its int8 directory, an early-exit run): the config runs with only the repeats, examples and length changed."""
    from ptm_app.compression.quantization import quantize_dynamic_int8, save_quantized
    from ptm_app.inference.loading import load_for_inference

    path = ROOT / "configs" / "compress" / f"{name}.yaml"
    cfg = yaml.safe_load(path.read_text())
    runs = tmp_path / "runs"
    plain = plain_teacher(tmp_path, cfg["source"])
    loaded = load_for_inference(str(plain))
    int8 = save_quantized(quantize_dynamic_int8(loaded.model), "torch_ao", tmp_path / "int8", loaded.model_class,
                          loaded.tokenizer)
    exit_run = early_exit_run(runs, tmp_path, cfg["source"])
    for row in [cfg["teacher"], *cfg["rows"]]:
        target = exit_run if row.get("exit") else int8 if Path(row["model"]).name.startswith("int8_") else plain
        link = runs / Path(row["model"]).name
        if not link.exists():
            link.symlink_to(target, target_is_directory=True)
    argv = ["compress-report", "--config", str(path), "--repeats", "1", "--examples", "6", "--max_length", "16"]
    monkeypatch.chdir(tmp_path)  # the rows' relative paths must not find runs a developer made in the repo
    assert run_main(argv, runs) == 0
    rows = json.loads((runs / cfg["run_name"] / "compression.json").read_text())
    assert [r["model"] for r in rows] == [cfg["teacher"]["name"]] + [r["name"] for r in cfg["rows"]]
    assert all(r["exit_layer"] is not None for r, c in zip(rows[1:], cfg["rows"]) if c.get("exit"))


@pytest.mark.slow  # ~40 s: two tiny student fits, three int8 conversions, two reports' worth of timing
def test_seeds_train_each_student_per_seed_and_report_its_interval(tmp_path):
    """seeds: [1, 2]: the row whose make fits a model is trained once per seed (--seed_everything N, run name
    -seed<N>) and so is the int8 made from it; the teacher and its int8 are one model each.  A seeded row's metric is
    the mean over its seeds with the t interval, and ``beats`` between two seeded rows is their paired difference."""
    from ptm_app.experiments.stats import paired, summarize
    from ptm_app.inference.compress_commands import accuracy
    from ptm_app.inference.loading import load_for_inference

    runs = tmp_path / "runs"
    teacher = plain_teacher(tmp_path)
    cfg = {"trainer": {"max_steps": 2, "max_epochs": 1, "limit_val_batches": 1, "num_sanity_val_steps": 0,
                       "enable_progress_bar": False},
           "model": {"class_path": "SequenceClassificationModule",
                     "init_args": {"backbone_config": {**TINY_BERT, "num_hidden_layers": 2}}},
           "data": {"class_path": "TaskDataModule",
                    "init_args": {"source": "bbc", "tokenizer": {"pretrained": "minilm"}, "max_length": MAX_LENGTH,
                                  "batch_size": 4, "limit_train": 16}}}
    student_config = tmp_path / "student.yaml"
    student_config.write_text(yaml.safe_dump(cfg))
    int8, student_int8 = tmp_path / "int8", tmp_path / "student_int8"
    config = report_config(tmp_path, str(teacher), [
        {"name": "int8", "model": str(int8),
         "make": [{"quantize": {"ckpt_path": str(teacher), "output_dir": str(int8), "repeats": 1}}]},
        {"name": "student", "model": "student", "make": [{"fit": {"config": str(student_config)}}]},
        {"name": "student int8", "model": str(student_int8),
         "make": [{"quantize": {"ckpt_path": str(runs / "student"), "output_dir": str(student_int8),
                                "repeats": 1}}]}],
        targets=[{"row": "student", "beats": "student int8"}], seeds=[1, 2])
    assert run_main(["compress-report", "--config", str(config), "--make_missing", "true"], runs) == 0
    assert not (runs / "student").exists() and not student_int8.exists()  # only the seeded ones are made
    for seed in (1, 2):
        made = yaml.safe_load((runs / f"student-seed{seed}" / "config.yaml").read_text())
        assert made["seed_everything"] == seed
        assert (tmp_path / f"student_int8-seed{seed}").is_dir()
    by = check_table(runs / "table", ["teacher", "int8", "student", "student int8"])
    assert [by[n]["seeds"] for n in ("teacher", "int8", "student", "student int8")] == [1, 1, 2, 2]
    assert by["int8"]["metric_over_seeds"] == "one model (not seeded)"
    records = scored_records()
    scores = {name: [accuracy(load_for_inference(str(path(seed))), records, MAX_LENGTH) for seed in (1, 2)]
              for name, path in (("student", lambda s: runs / f"student-seed{s}"),
                                 ("student int8", lambda s: tmp_path / f"student_int8-seed{s}"))}
    for name, values in scores.items():
        assert by[name]["metric"] == pytest.approx(sum(values) / 2)
        assert by[name]["metric_over_seeds"] == summarize(values).text()
    assert by["teacher"]["metric"] == pytest.approx(accuracy(load_for_inference(str(teacher)), records, MAX_LENGTH))
    judged = json.loads((runs / "table" / "compression_targets.json").read_text())
    p = paired(scores["student"], scores["student int8"])
    assert judged == [{"row": "student", "target": "metric above 'student int8' (paired over seeds, interval above 0)",
                       "measured": p.text(), "met": "yes" if p.diff.interval[0] > 0 else "no"}]


def test_seeds_remake_what_the_shipped_report_trains_and_keep_the_teacher(monkeypatch):
    """On the shipped BBC report: every row whose make fits (and the int8 made from the distilled student) is
    remade per seed under -seed<N> names with --seed_everything; the teacher and its int8 are not."""
    from ptm_app.experiments.compression_report import (as_row, make_steps, names_output, seeded_outputs,
                                                         with_seed)

    monkeypatch.chdir(ROOT)
    cfg = yaml.safe_load((ROOT / "configs" / "compress" / "minilm_report_bbc.yaml").read_text())
    rows = {r["name"]: as_row(r) for r in cfg["rows"]}
    outputs = seeded_outputs(list(rows.values()))
    assert not names_output(cfg["teacher"]["model"], outputs)
    assert [name for name, r in rows.items() if not names_output(r.model, outputs)] == ["dynamic int8"]
    assert with_seed(rows["dynamic int8"], 2, outputs) is rows["dynamic int8"]
    heads = with_seed(rows["heads pruned 25 %"], 2, outputs)
    assert heads.model == "checkpoints/prune_heads_bbc_25-seed2"
    assert make_steps(heads) == [["fit", "--config", "configs/compress/minilm_prune_heads_bbc.yaml",
                                  "--model.init_args.pruning.heads.target", "0.25", "--seed_everything", "2",
                                  "--run_name", "prune_heads_bbc_25-seed2"]]
    both = with_seed(rows["distilled 3 layers + dynamic int8"], 3, outputs)
    assert make_steps(both) == [["quantize", "--ckpt_path", "checkpoints/minilm_distill_3layer_bbc-seed3",
                                 "--output_dir", "checkpoints/int8_distill_bbc_3layer-seed3"]]
    qat = make_steps(with_seed(rows["QAT int8 (Q8BERT, static)"], 1, outputs))
    assert qat[0][-4:] == ["--seed_everything", "1", "--run_name", "minilm_qat_bbc-seed1"]
    assert qat[1][1:5] == ["--ckpt_path", "checkpoints/minilm_qat_bbc-seed1", "--output_dir",
                           "checkpoints/int8_qat_static_bbc-seed1"]


@pytest.mark.slow  # ~60 s: a tiny teacher fit, three student fits, the report
def test_report_on_distilled_and_theseus_runs(tmp_path):
    """Students of other structures as rows: the shipped BiLSTM, CNN and Theseus recipes, shortened, from a tiny
    teacher run; their parameters are their own backbones' (the teacher is not counted)."""
    from ptm_app.inference.loading import load_for_inference
    from tests.compression.test_compress_configs import QUICK, tiny_teacher

    runs = tmp_path / "runs"
    tiny_teacher(runs, "minilm_full_bbc", tmp_path)
    recipes = ["minilm_distill_bilstm_bbc", "minilm_distill_cnn_bbc", "minilm_theseus_bbc"]
    for recipe in recipes:
        config = ROOT / "configs" / "compress" / f"{recipe}.yaml"
        assert run_main(["fit", "--config", str(config), *QUICK], runs) == 0
    config = report_config(tmp_path, "minilm_full_bbc", [{"name": r, "model": r} for r in recipes])
    assert run_main(["compress-report", "--config", str(config)], runs) == 0
    by = check_table(runs / "table", ["teacher", *recipes])
    for recipe in recipes:
        assert by[recipe]["params"] == params_of(load_for_inference(str(runs / recipe)).model)


def test_mcnemar_p_is_the_exact_binomial_of_the_discordant_examples():
    """b = 9 examples only the first gets right, c = 1 only the second: p = 2 * P(X <= 1), X ~ Bin(10, 1/2) =
    2 * 11 / 1024; agreement everywhere gives 1; the test is symmetric."""
    from ptm_app.experiments.compression_report import mcnemar_p

    first = [True] * 9 + [False] + [True] * 5 + [False] * 5
    second = [False] * 9 + [True] + [True] * 5 + [False] * 5
    assert mcnemar_p(first, second) == pytest.approx(22 / 1024)
    assert mcnemar_p(second, first) == mcnemar_p(first, second)
    assert mcnemar_p(first, first) == 1.0
    assert mcnemar_p([True] * 3 + [False], [False] * 3 + [True]) == pytest.approx(2 * 5 / 16)  # 3 vs 1: P(X<=1)=5/16


def test_make_skips_finished_fits_and_resumes_stopped_ones(tmp_path, monkeypatch):
    """A row whose run stopped (checkpoints, no summary.json) is missing, and its make command resumes it exactly
    (``--ckpt_path last``); a finished fit step (a QAT run before its quantize step) is not run again."""
    from ptm_app.experiments.compression_report import CompressionRow, locate, resumable

    monkeypatch.setenv("PTM_RUNS_DIR", str(tmp_path / "runs"))
    stopped, finished = tmp_path / "runs" / "prune_heads_bbc_25", tmp_path / "runs" / "minilm_qat_bbc"
    for run in (stopped, finished):
        (run / "checkpoints").mkdir(parents=True)
        (run / "checkpoints" / "last.ckpt").write_bytes(b"x")
    (finished / "summary.json").write_text("{}")
    config = str(ROOT / "configs" / "compress" / "minilm_prune_heads_bbc.yaml")
    assert locate(CompressionRow(name="p", model="checkpoints/prune_heads_bbc_25")) is None
    assert locate(CompressionRow(name="q", model="checkpoints/minilm_qat_bbc")) == str(finished.resolve())
    step = ["fit", "--config", config, "--run_name", "prune_heads_bbc_25"]
    assert resumable(step) == [*step, "--ckpt_path", "last"]
    qat = ["fit", "--config", str(ROOT / "configs" / "compress" / "minilm_qat_bbc.yaml")]  # run name: the stem
    assert resumable(qat) is None
    fresh = ["fit", "--config", config]  # minilm_prune_heads_bbc: never started
    assert resumable(fresh) == fresh
    quantize = ["quantize", "--ckpt_path", "checkpoints/minilm_qat_bbc", "--output_dir", "x"]
    assert resumable(quantize) == quantize


def chain_rows(tmp: Path, lr: float = 0.1, comment: str = "") -> list:
    """A teacher fit, a student distilled from it (its config names the teacher's run), and the student's int8."""
    from ptm_app.experiments.compression_report import CompressionRow

    (tmp / "teacher.yaml").write_text(f"{comment}\noptimizer: {{lr: {lr}}}\n")
    (tmp / "student.yaml").write_text("model: {init_args: {teacher: checkpoints/teacher}}\n")
    return [CompressionRow(name="teacher", model="teacher", make=[{"fit": {"config": str(tmp / "teacher.yaml")}}]),
            CompressionRow(name="student", model="student", make=[{"fit": {"config": str(tmp / "student.yaml")}}]),
            CompressionRow(name="int8", model=str(tmp / "int8"),
                           make=[{"quantize": {"ckpt_path": "checkpoints/student", "output_dir": str(tmp / "int8")}}])]


def test_a_models_recipe_fingerprint_covers_its_upstream_models(tmp_path, monkeypatch):
    """The teacher's changed setting makes its student and the student's int8 stale too (the student's config names
    the teacher, the quantize step the student); a comment changes nothing; the student's own change leaves the
    teacher alone.  Two rows making one output two ways is one line."""
    from ptm_app.errors import PtmError
    from ptm_app.experiments.compression_report import CompressionRow, recipe_fingerprints

    monkeypatch.setenv("PTM_RUNS_DIR", str(tmp_path / "checkpoints"))
    monkeypatch.chdir(tmp_path)
    runs, int8 = (tmp_path / "checkpoints").resolve(), (tmp_path / "int8").resolve()
    names = [runs / "teacher", runs / "student", int8]
    first = recipe_fingerprints(chain_rows(tmp_path))
    assert sorted(first) == sorted(names)
    assert recipe_fingerprints(chain_rows(tmp_path, comment="# a note")) == first
    changed = recipe_fingerprints(chain_rows(tmp_path, lr=0.2))
    assert all(changed[n] != first[n] for n in names)
    rows = chain_rows(tmp_path)
    (tmp_path / "student.yaml").write_text("model: {init_args: {teacher: checkpoints/teacher, alpha: 0.5}}\n")
    student = recipe_fingerprints(rows)
    assert [student[n] == first[n] for n in names] == [True, False, False]
    twice = [*rows, CompressionRow(name="again", model="teacher",
                                   make=[{"fit": {"config": str(tmp_path / "student.yaml"), "run_name": "teacher"}}])]
    with pytest.raises(PtmError, match="'again' makes .*teacher with .*give each its own run_name or output_dir"):
        recipe_fingerprints(twice)


def test_make_remakes_a_model_made_by_an_earlier_recipe_and_keeps_the_old_one(tmp_path, monkeypatch):
    """A finished fit whose recorded recipe differs from the row's now is not current (the report's missing line
    says so); make_missing sets it aside as <run>.stale-1 (kept) and fits afresh, not resuming it, and records the
    new recipe; a current finished fit is skipped, and a run made before recipes were recorded is trusted."""
    import subprocess

    from ptm_app.experiments.compression_report import current_model, missing_line, recipe_fingerprints, run_make
    from ptm_app.experiments.sweep import recorded_fingerprint

    monkeypatch.setenv("PTM_RUNS_DIR", str(tmp_path / "checkpoints"))
    monkeypatch.chdir(tmp_path)
    teacher_row = chain_rows(tmp_path)[0]
    run = (tmp_path / "checkpoints" / "teacher").resolve()
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"x")
    (run / "summary.json").write_text("{}")
    old = recipe_fingerprints(chain_rows(tmp_path))
    assert current_model(teacher_row, old) == str(run)  # no cell.json yet: made before recipes were recorded
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: calls.append(argv[3:]) or
                        subprocess.CompletedProcess(argv, 0))
    run_make(teacher_row, old)  # finished: adopted (its cell.json written), not run
    assert calls == [] and recorded_fingerprint(run) == old[run]
    assert current_model(teacher_row, old) == str(run)
    rows = chain_rows(tmp_path, lr=0.2)
    new = recipe_fingerprints(rows)
    assert current_model(rows[0], new) is None
    assert "'teacher': teacher was made by an earlier recipe than its make steps give now" in missing_line(rows[:1])
    run_make(rows[0], new)
    assert calls == [["fit", "--config", str(tmp_path / "teacher.yaml")]]  # afresh: no --ckpt_path last
    stale = run.with_name("teacher.stale-1")
    assert (stale / "summary.json").is_file() and recorded_fingerprint(stale) == old[run]
    assert recorded_fingerprint(run) == new[run] and not (run / "summary.json").exists()
