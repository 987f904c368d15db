"""Early exit and BERT-of-Theseus as policies of task modules (``compression.early_exit_policy``,
``compression.theseus_policy``): the old classes' checkpoints (written by 9ce82a8, before the change) load with
identical outputs and without the predecessor; the old classes and the policies train step for step alike; a
tagger's off-ramps exit per sentence with real numbers; Theseus compresses a tagger to the successor's layer count;
QA refuses off-ramps in one line.  Everything trains through main.py."""
import csv
import json
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import TINY_BERT, run_main

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints"
QUIET = {"accelerator": "cpu", "devices": 1, "enable_progress_bar": False, "enable_model_summary": False,
         "log_every_n_steps": 1, "num_sanity_val_steps": 0}
WORDPIECE = {"train": "wordpiece", "vocab_size": 100, "min_frequency": 1}


def write_config(tmp_path, name: str, model: dict, data: dict, steps: int, seed: int = 3, every: int = 2) -> str:
    cfg = {"seed_everything": seed, "trainer": {"max_steps": steps, "val_check_interval": every,
                                                "limit_val_batches": 2, **QUIET},
           "model": model, "data": data}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def sequence_data(corpus) -> dict:
    return {"class_path": "TaskDataModule",
            "init_args": {"source": str(corpus), "batch_size": 8, "max_length": 32, "tokenizer": WORDPIECE}}


def logged(run: Path, prefix: str = "train/") -> list[dict]:
    rows = list(csv.DictReader(open(run / "logs" / "metrics.csv")))
    return [{k: float(v) for k, v in r.items() if k.startswith(prefix) and v} for r in rows
            if any(k.startswith(prefix) and v for k, v in r.items())]


# -- checkpoints of the old classes ----------------------------------------------------------------------------------
def test_an_early_exit_checkpoint_of_the_old_class_loads_with_identical_outputs():
    from ptm_app.adaptation import EarlyExitModule
    from ptm_app.compression.early_exit_policy import EarlyExit

    expected = json.loads((FIXTURES / "early_exit_9ce82a8.json").read_text())
    module = EarlyExitModule.load_from_checkpoint(FIXTURES / "early_exit_9ce82a8.ckpt").eval()
    assert isinstance(module.policy(EarlyExit), EarlyExit) and module.style() == "early exit (pabee)"
    batch = {k: torch.tensor(v) for k, v in expected["batch"].items()}
    with torch.no_grad():
        layers = module.layer_logits(batch)
        logits, exits, run = module.exit_forward(batch)  # its predict_exit, entropy:0.6
    assert len(layers) == 3 and module.exit_rule == ("entropy", 0.6)
    for got, old in zip(layers, expected["layer_logits"]):
        torch.testing.assert_close(got, torch.tensor(old), rtol=0, atol=1e-6)
    torch.testing.assert_close(logits, torch.tensor(expected["exit_forward_entropy_0.6"]["logits"]), rtol=0, atol=1e-6)
    assert exits.tolist() == expected["exit_forward_entropy_0.6"]["exits"]


def test_a_theseus_checkpoint_of_the_old_class_loads_without_its_predecessor(monkeypatch):
    """The predecessor the fixture names (a temporary run of 9ce82a8) is never read: the successor is rebuilt from
    the checkpoint's own config."""
    from ptm_app.adaptation import TheseusModule
    from ptm_app.compression import teacher

    def refuse(*args, **kwargs):
        raise AssertionError("the predecessor was loaded")

    monkeypatch.setattr(teacher, "load_teacher", refuse)
    expected = json.loads((FIXTURES / "theseus_9ce82a8.json").read_text())
    module = TheseusModule.load_from_checkpoint(FIXTURES / "theseus_9ce82a8.ckpt").eval()
    assert module.backbone.config.num_hidden_layers == 2 and module.replacing.frozen._model is None
    batch = {k: torch.tensor(v) for k, v in expected["batch"].items()}
    with torch.no_grad():
        torch.testing.assert_close(module(batch), torch.tensor(expected["logits"]), rtol=0, atol=1e-6)


# -- the old classes moved up to adaptation (issue 27): their old names still load -------------------------------------
OLD_MODULES = {"DistillationModule": "distillation", "TheseusModule": "theseus", "EarlyExitModule": "early_exit",
               "PruningModule": "pruning", "QuantAwareModule": "quantization"}


def test_the_old_names_of_the_moved_classes_resolve_through_the_registry():
    """Checkpoints and exports name these classes where they were defined (``ptm_app.module``) and by their package
    (``_class_path``): both resolve to the class in ``adaptation.compressed`` without ``--trust_checkpoint``."""
    import ptm_app.adaptation as adaptation
    from ptm_app.checkpoint_io.module_classes import RENAMED_MODULE_CLASSES, check_module_name, module_class, registered

    for name, old_module in OLD_MODULES.items():
        cls = getattr(adaptation, name)
        assert cls.__module__ == "ptm_app.adaptation.compressed" and registered(name) is cls
        for old in (f"ptm_app.compression.{old_module}.{name}", f"ptm_app.compression.{name}"):
            check_module_name(old, "x", trust=False)  # would raise CheckpointUnsafe for an unknown name
            assert registered(old) is cls and module_class(old, "x", trust=False) is cls
    assert len([k for k in RENAMED_MODULE_CLASSES if k.startswith("ptm_app.compression.")]) == 2 * len(OLD_MODULES)
    assert registered("ptm_app.compression.CausalDistillationModule") is not None  # still there
    assert registered("ptm_app.compression.distillation.CausalDistillationModule") is None  # no blanket mapping


def test_an_early_exit_checkpoint_of_the_old_class_loads_by_its_record():
    """predict and export take the class from the checkpoint (``module_from_checkpoint``: Lightning reads an
    in-memory file whose ``_class_path`` names the old place); the moved class loads it with identical outputs."""
    from ptm_app.adaptation import EarlyExitModule
    from ptm_app.backbones.from_checkpoint import module_from_checkpoint
    from ptm_app.checkpoint_io.reading import CKPT_KEY, read_checkpoint

    ckpt = read_checkpoint(FIXTURES / "early_exit_9ce82a8.ckpt", trust=False)
    assert ckpt[CKPT_KEY]["module"] == "ptm_app.compression.early_exit.EarlyExitModule"
    assert ckpt["hyper_parameters"]["_class_path"] == "ptm_app.compression.EarlyExitModule"
    module = module_from_checkpoint(ckpt, trust=False).eval()
    assert type(module) is EarlyExitModule
    expected = json.loads((FIXTURES / "early_exit_9ce82a8.json").read_text())
    with torch.no_grad():
        layers = module.layer_logits({k: torch.tensor(v) for k, v in expected["batch"].items()})
    for got, old in zip(layers, expected["layer_logits"], strict=True):
        torch.testing.assert_close(got, torch.tensor(old), rtol=0, atol=1e-6)


def test_compression_imports_nothing_of_adaptation():
    """The task modules import compression's policies, so compression must not import adaptation (a cycle)."""
    import subprocess
    import sys

    code = ("import pkgutil, importlib, sys, ptm_app.compression as c\n"
            "names = [m.name for m in pkgutil.iter_modules(c.__path__)]\n"
            "[importlib.import_module(f'ptm_app.compression.{n}') for n in names]\n"
            "print(len(names), sorted(m for m in sys.modules if m.startswith('ptm_app.adaptation')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2]).stdout.split(maxsplit=1)
    assert int(out[0]) >= 15 and out[1].strip() == "[]"


# -- the old classes train as the policies do --------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["pabee", "deebert"])
def test_early_exit_module_and_the_early_exit_policy_train_step_for_step_alike(tiny_corpus, tmp_path, method):
    settings = {"method": method, "final_steps": 2 if method == "deebert" else 0, "entropy_thresholds": [0.3],
                "patiences": [1]}
    common = {"backbone_config": {**TINY_BERT, "num_hidden_layers": 3}, "optim": {"lr": 1e-3}}
    old = {"class_path": "EarlyExitModule", "init_args": {**common, **settings}}
    new = {"class_path": "SequenceClassificationModule", "init_args": {**common, "early_exit": settings}}
    runs = tmp_path / "runs"
    for name, model in (("old", old), ("new", new)):
        path = write_config(tmp_path, f"{method}_{name}", model, sequence_data(tiny_corpus), steps=4)
        assert run_main(["fit", "--config", path, "--run_name", name], runs) == 0
    before, after = logged(runs / "old"), logged(runs / "new")
    assert len(before) == len(after) == 4
    assert [sorted(r) for r in before] == [sorted(r) for r in after]  # the same terms (layer_1 ... from the ramps)
    for a, b in zip(before, after):
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-5), key
    assert ("train/layer_1" in before[0]) == (method == "pabee")  # DeeBERT's first 2 steps: the task's own loss
    val_old, val_new = logged(runs / "old", "val/")[-1], logged(runs / "new", "val/")[-1]
    assert "val/entropy_0.3/exit_layer" in val_new
    for key in val_old:
        assert val_new[key] == pytest.approx(val_old[key], rel=1e-5), key


@pytest.fixture(scope="module")
def predecessor(tiny_corpus, tmp_path_factory) -> Path:
    """A 4-layer tiny BERT classifier trained 4 steps: its run directory."""
    tmp = tmp_path_factory.mktemp("predecessor")
    model = {"class_path": "SequenceClassificationModule",
             "init_args": {"backbone_config": {**TINY_BERT, "num_hidden_layers": 4}, "optim": {"lr": 1e-3}}}
    path = write_config(tmp, "predecessor", model, sequence_data(tiny_corpus), steps=4, every=4)
    assert run_main(["fit", "--config", path], tmp / "runs") == 0
    return tmp / "runs" / "predecessor"


def test_theseus_module_and_the_theseus_policy_train_step_for_step_alike(tiny_corpus, predecessor, tmp_path):
    settings = {"predecessor": str(predecessor), "curriculum_k": 0.25, "curriculum_b": 0.25}
    old = {"class_path": "TheseusModule", "init_args": {**settings, "optim": {"lr": 1e-3}}}
    new = {"class_path": "SequenceClassificationModule", "init_args": {"theseus": settings, "optim": {"lr": 1e-3}}}
    runs = tmp_path / "runs"
    for name, model in (("old", old), ("new", new)):
        path = write_config(tmp_path, f"theseus_{name}", model, sequence_data(tiny_corpus), steps=5, seed=5)
        assert run_main(["fit", "--config", path, "--run_name", name], runs) == 0
    before, after = logged(runs / "old"), logged(runs / "new")
    assert [r["train/replace_rate"] for r in after] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0])
    for a, b in zip(before, after, strict=True):
        assert sorted(a) == sorted(b)
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-5), key
    new_ckpt = torch.load(runs / "new" / "checkpoints" / "last.ckpt", weights_only=True)
    assert new_ckpt["hyper_parameters"]["theseus"]["predecessor"] == str(predecessor.resolve())
    assert not any("predecessor" in k for k in new_ckpt["state_dict"])


# -- early exit on a tagger --------------------------------------------------------------------------------------------
def tag_data(root) -> dict:
    return {"class_path": "TokenTaskDataModule",
            "init_args": {"source": str(root), "max_length": 16, "batch_size": 8, "tokenizer": WORDPIECE}}


def after_the(n: int, seed: int) -> list[dict]:
    """``D`` for the/a, ``N`` for the word after one, ``O`` otherwise: a tag read off the word itself and one that
    needs the word before (a layer must look left for it), so the layers' confidence differs."""
    import random

    from tests.conftest import WORDS

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 9))]
        tags = ["D" if w in ("the", "a") else "N" if j and words[j - 1] in ("the", "a") else "O"
                for j, w in enumerate(words)]
        rows.append({"id": f"s{seed}-{i}", "words": words, "tags": tags})
    return rows


def test_a_tagger_exits_per_sentence_and_at_threshold_zero_scores_as_its_last_layer(tmp_path):
    """PABEE-trained tag ramps on a 3-layer tagger (tags of the word before, ``after_the``): logged through main.py, at S = 0 no
    sentence exits early and the accuracy is the last layer's ``val/acc``; at S above ln(3) every sentence leaves at
    layer 1 with the first ramp's accuracy; the exits taken per layer move to earlier layers as S grows; predict
    writes each sentence's exit layer, the one the evaluation's rule gives, through Lightning and --input alike."""
    from ptm_app.adaptation.token_classification import TokenClassificationModule
    from ptm_app.compression.early_exit_policy import EarlyExit, first_under, scored_tokens, unit_facts
    from tests.task_kinds.test_every_kind import splits

    root = splits(tmp_path / "tags", after_the, sizes=(("train", 1, 48), ("validation", 2, 16), ("test", 3, 16)))
    thresholds = [0.0, 0.2, 0.5, 1.2]
    model = {"class_path": "TokenClassificationModule",
             "init_args": {"backbone_config": {**TINY_BERT, "num_hidden_layers": 3}, "optim": {"lr": 1e-2, "warmup": 0},
                           "early_exit": {"method": "pabee", "entropy_thresholds": thresholds, "patiences": [1],
                                          "predict_exit": "entropy:0.5"}}}
    path = write_config(tmp_path, "tag_exit", model, tag_data(root), steps=24, every=24)
    runs = tmp_path / "runs"
    assert run_main(["fit", "--config", path], runs) == 0
    train = logged(runs / "tag_exit")
    for r in train:  # PABEE's weighted sum of the three tag layers' losses
        total = (r["train/layer_1"] + 2 * r["train/layer_2"] + 3 * r["train/layer_3"]) / 6
        assert r["train/loss"] == pytest.approx(total, rel=1e-4)
    val = logged(runs / "tag_exit", "val/")[-1]
    assert val["val/entropy_0/exit_layer"] == 3.0 and val["val/entropy_0/speedup"] == 1.0
    assert val["val/entropy_0/acc"] == pytest.approx(val["val/acc"], abs=1e-6)
    assert val["val/entropy_1.2/exit_layer"] == 1.0  # ln 3 = 1.099 < 1.2: three tags are never that uncertain
    exit_layers = [val[f"val/entropy_{s:g}/exit_layer"] for s in thresholds]
    assert exit_layers == sorted(exit_layers, reverse=True)

    module = TokenClassificationModule.load_from_checkpoint(runs / "tag_exit" / "checkpoints" / "last.ckpt").eval()
    policy = module.policy(EarlyExit)
    assert len(module.exits) == 2 and module.style() == "early exit (pabee)"
    from ptm_app.data.contract import connect
    from ptm_app.data.tagging_data import TokenTaskDataModule

    from ptm_app.data.tokenizer import TokenizerSpec

    data = TokenTaskDataModule(source=str(root), max_length=16, batch_size=8, tokenizer=TokenizerSpec(**WORDPIECE))
    connect(module, data)
    data.setup("validate")
    facts, last = [], []
    with torch.no_grad():
        for batch in data.val_dataloader():
            layers = torch.stack(policy.layer_logits(module, batch), 1)
            facts.append(unit_facts(layers, batch["labels"], scored_tokens(batch)))
            keep = batch["labels"] != -100
            last.append(((module(batch).argmax(-1) == batch["labels"]) & keep).sum())
    joined = {k: torch.cat([f[k] for f in facts]) for k in facts[0]}
    per_layer = {s: torch.bincount(first_under(joined["score"], s), minlength=4)[1:].tolist() for s in thresholds}
    assert per_layer[0.0] == [0, 0, 16] and per_layer[1.2] == [16, 0, 0]
    for s in thresholds:  # the logged table is these exits
        assert val[f"val/entropy_{s:g}/exit_layer"] == pytest.approx(float(first_under(joined["score"], s).float()
                                                                             .mean()), abs=1e-6)
    middle = float(joined["score"][:, 0].median()) + 1e-6  # half the sentences are that sure at layer 1
    per_layer["median"] = torch.bincount(first_under(joined["score"], middle), minlength=4)[1:].tolist()
    assert 4 <= per_layer["median"][0] <= 12, per_layer
    assert len({tuple(v) for v in per_layer.values()}) >= 3, per_layer  # the exits move with the threshold
    first_ramp = float(joined["correct"][:, 0].sum() / joined["count"].sum())
    assert val["val/entropy_1.2/acc"] == pytest.approx(first_ramp, abs=1e-6)
    assert float(sum(last) / joined["count"].sum()) == pytest.approx(val["val/acc"], abs=1e-6)

    assert run_main(["predict", "--config", path, "--ckpt_path", "last"], runs) == 0
    rows = [json.loads(line) for line in (runs / "tag_exit" / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 16 and all(1 <= r["exit_layer"] <= 3 for r in rows)
    data.setup("test")
    expected = []
    with torch.no_grad():
        for batch in data.test_dataloader():
            layers = torch.stack(policy.layer_logits(module, batch), 1)
            expected += first_under(unit_facts(layers, batch["labels"], scored_tokens(batch))["score"], 0.5).tolist()
    assert sorted(r["exit_layer"] for r in rows) == sorted(expected)
    out = tmp_path / "rows.jsonl"  # main.py predict --input: the same tags and exit layers
    assert run_main(["predict", "--ckpt_path", str(runs / "tag_exit"), "--input", str(root / "test.jsonl"),
                     "--output", str(out)], runs) == 0
    mine = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["words"], r["tags"], r["exit_layer"]) for r in mine) == \
        sorted((r["words"], r["tags"], r["exit_layer"]) for r in rows)


def test_off_ramps_on_qa_and_with_a_second_loss_are_one_line():
    from ptm_app.adaptation.classification import SequenceClassificationModule
    from ptm_app.adaptation.qa import QuestionAnsweringModule
    from ptm_app.errors import PtmError

    with pytest.raises(PtmError, match="the qa kind cannot exit early: a QA answer is a span") as refused:
        QuestionAnsweringModule(backbone_config=TINY_BERT, early_exit={"method": "pabee"})
    assert "\n" not in str(refused.value)
    with pytest.raises(PtmError, match="distill and early_exit each replace the training loss"):
        SequenceClassificationModule(backbone_config=TINY_BERT, labels=["a", "b"], distill={"teacher": "x"},
                                     early_exit={})
    with pytest.raises(PtmError, match="theseus builds the successor .* pruning also changes"):
        SequenceClassificationModule(labels=["a", "b"], theseus={"predecessor": "x"},
                                     pruning={"layers": {"drop": "top", "k": 1}})


# -- Theseus on a tagger -----------------------------------------------------------------------------------------------
def test_theseus_compresses_a_tagger_and_exports_the_successor(tmp_path, capsys):
    """A 4-layer tagger is the predecessor; the successor (2 layers) trains through main.py with the mixed model
    (p_t = 0.25 + 0.25·t), its successor alone once p reaches 1; the export is a 2-layer transformers tagger giving
    the module's logits, and the summary reports both sizes; data read with another vocabulary is one line."""
    from transformers import AutoModelForTokenClassification

    from ptm_app.adaptation.token_classification import TokenClassificationModule
    from tests.task_kinds.test_every_kind import splits, tagged

    root = splits(tmp_path / "tags", tagged)
    runs = tmp_path / "runs"
    teacher = {"class_path": "TokenClassificationModule",
               "init_args": {"backbone_config": {**TINY_BERT, "num_hidden_layers": 4}, "optim": {"lr": 1e-2}}}
    assert run_main(["fit", "--config", write_config(tmp_path, "tagger", teacher, tag_data(root), steps=4, every=4)],
                    runs) == 0
    model = {"class_path": "TokenClassificationModule",
             "init_args": {"theseus": {"predecessor": str(runs / "tagger"), "curriculum_k": 0.25,
                                       "curriculum_b": 0.25, "successor_init": [1, 3]},
                           "optim": {"lr": 1e-2, "warmup": 0}}}
    path = write_config(tmp_path, "tag_theseus", model, tag_data(root), steps=6, every=3)
    assert run_main(["fit", "--config", path], runs) == 0
    rows = logged(runs / "tag_theseus")
    assert [r["train/replace_rate"] for r in rows] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    assert [r["train/replaced"] for r in rows][3:] == [1.0, 1.0, 1.0]
    assert all(r["train/loss"] > 0 for r in rows)
    summary = json.loads((runs / "tag_theseus" / "summary.json").read_text())
    assert summary["style"] == "module replacing (BERT-of-Theseus)"
    assert summary["teacher_params"] > summary["student_params"]
    module = TokenClassificationModule.load_from_checkpoint(runs / "tag_theseus" / "checkpoints" / "last.ckpt").eval()
    assert module.backbone.config.num_hidden_layers == 2
    assert run_main(["export", "--ckpt_path", str(runs / "tag_theseus"), "--output_dir", str(tmp_path / "x")],
                    runs) == 0
    exported = AutoModelForTokenClassification.from_pretrained(tmp_path / "x").eval()
    assert exported.config.num_hidden_layers == 2
    batch = {"input_ids": torch.tensor([[2, 10, 11, 12, 3]]), "attention_mask": torch.ones(1, 5, dtype=torch.long)}
    with torch.no_grad():
        torch.testing.assert_close(exported(**batch).logits, module(batch), rtol=0, atol=1e-5)
    other = tag_data(root)  # data read with another vocabulary than the predecessor's: one line
    other["init_args"]["tokenizer"] = {**WORDPIECE, "vocab_size": 80}
    capsys.readouterr()
    assert run_main(["fit", "--config", write_config(tmp_path, "other_vocab", model, other, steps=1)], runs) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "theseus (the successor keeps the predecessor's embeddings) needs one vocabulary" in err[0]


@pytest.mark.parametrize("kind", ["qa", "choice"])
def test_theseus_on_qa_and_choice_mixes_successor_and_predecessor_blocks(tmp_path, kind):
    """The successor of a 4-layer QA / multiple-choice model has 2 layers; with no module replaced the mixed model
    is the predecessor, with all replaced the successor, and the training loss is the kind's own on the mix."""
    from ptm_app.adaptation.choice import MultipleChoiceModule
    from ptm_app.adaptation.qa import QuestionAnsweringModule
    from ptm_app.compression.theseus_policy import Theseus

    cls, extra = (QuestionAnsweringModule, {}) if kind == "qa" else (MultipleChoiceModule, {"num_choices": 2})
    config = {**TINY_BERT, "num_hidden_layers": 4, "vocab_size": 60}
    torch.manual_seed(0)
    cls(backbone_config=config, **extra).build().backbone.save_pretrained(tmp_path / "predecessor")
    module = cls(theseus={"predecessor": str(tmp_path / "predecessor")}, **extra).build().eval()
    policy = module.policy(Theseus)
    assert module.backbone.config.num_hidden_layers == 2 and module.style() == "module replacing (BERT-of-Theseus)"
    ids = torch.randint(5, 60, (4, 9), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if kind == "qa":
        batch.update(start_positions=torch.tensor([1, 2, 3, 4]), end_positions=torch.tensor([2, 2, 5, 6]))
    else:
        batch["labels"] = torch.tensor([0, 1])
    with torch.no_grad():
        alone, none = module(batch), policy.mixed_outputs(module, batch, torch.tensor([False, False]))
        every = policy.mixed_outputs(module, batch, torch.tensor([True, True]))
        reference = module.outputs(policy.predecessor(**module.backbone_inputs(batch)))
    flat = (lambda x: torch.cat(x, -1)) if kind == "qa" else (lambda x: x)
    torch.testing.assert_close(flat(none), flat(reference), rtol=0, atol=1e-5)
    torch.testing.assert_close(flat(every), flat(alone), rtol=0, atol=0)
    assert not torch.allclose(flat(alone), flat(reference), atol=1e-4)
    loss, parts = policy.training_loss(module, batch)  # step 0: p = 0.3
    assert torch.isfinite(loss) and float(parts["replace_rate"]) == pytest.approx(0.3)
