"""Multitask learning (MT-DNN heads, T5 §3.5.2 mixing): mixing rates and sampled proportions, exact resume of
the task sampler, per-task + macro metrics from YAML through main.py, then per-task fine-tuning from the
multitask checkpoint (T5 §3.5.3)."""
import csv
import random
from pathlib import Path

import pytest
import torch
import yaml

from ptm_app.data.multitask import MultitaskLoader, TaskSchedule, mixing_rates
from ptm_app.errors import PtmError
from tests.conftest import TINY_BERT, run_main, write_jsonl

FILLER = "the cat sat on a mat while dogs ran in park and every morning".split()
CUES = {"pos": ["rose", "joy", "grew"], "neg": ["fell", "lost", "sank"]}


# -- mixing -------------------------------------------------------------------------------------------
def test_mixing_rates_follow_t5_formulas():
    sizes = [1000, 100, 10]
    assert mixing_rates(sizes, "proportional") == pytest.approx([1000 / 1110, 100 / 1110, 10 / 1110])
    t2 = [(s / 1110) ** 0.5 for s in sizes]
    assert mixing_rates(sizes, "temperature", temperature=2) == pytest.approx([w / sum(t2) for w in t2])
    assert mixing_rates(sizes, "uniform") == pytest.approx([1 / 3] * 3)
    assert mixing_rates(sizes, "proportional", size_limit=100) == pytest.approx([100 / 210, 100 / 210, 10 / 210])
    # T -> infinity approaches uniform; T = 1 is proportional
    assert mixing_rates(sizes, "temperature", temperature=1) == pytest.approx(mixing_rates(sizes, "proportional"))
    assert max(mixing_rates(sizes, "temperature", temperature=1000)) < 0.34
    with pytest.raises(PtmError):
        mixing_rates([10, 0])


def test_sampled_task_proportions_match_the_rates():
    rates = [0.7, 0.2, 0.1]
    order = TaskSchedule(rates, 20_000, seed=3).order(0)
    for task, rate in enumerate(rates):
        share, sigma = order.count(task) / len(order), (rate * (1 - rate) / len(order)) ** 0.5
        assert abs(share - rate) < 4 * sigma, (task, share, rate)
    assert TaskSchedule(rates, 50, 3).order(1) != TaskSchedule(rates, 50, 3).order(0)  # a new draw per epoch
    assert TaskSchedule(rates, 50, 3).order(1) == TaskSchedule(rates, 50, 3).order(1)  # ... fixed by the seed


class _Items(torch.utils.data.Dataset):
    def __init__(self, n, tag):
        self.n, self.tag = n, tag

    def __len__(self):
        return self.n

    def __getitem__(self, key):
        return (self.tag, key[0], key[1])  # task, task epoch, index


def _loader(sizes=(10, 7), length=12, seed=5):
    from ptm_app.data.loader import ResumableLoader

    loaders = {f"t{i}": ResumableLoader(_Items(n, f"t{i}"), batch_size=2, shuffle=True, seed=seed,
                                        collate_fn=lambda items: items) for i, n in enumerate(sizes)}
    return MultitaskLoader(loaders, mixing_rates(list(sizes)), length, seed)


def _run(loader, epochs):
    out = []
    for epoch in epochs:
        loader.sampler.set_epoch(epoch)
        for batch in loader:
            out.append(batch)
            loader.consumed += 1
    return out


def test_each_task_walks_its_own_epochs_without_repeats():
    batches = _run(_loader(), range(4))  # 48 batches of 2: each task rolls over several of its epochs
    for task, size in (("t0", 10), ("t1", 7)):
        items = [item for b in batches for item in b if item[0] == task]
        by_epoch = {}
        for _, epoch, index in items:
            by_epoch.setdefault(epoch, []).append(index)
        complete = [e for e in by_epoch if e < max(by_epoch)]
        assert complete, task
        for e in complete:  # every finished task epoch is a permutation of the task's examples
            assert sorted(by_epoch[e]) == list(range(size)), (task, e)


@pytest.mark.parametrize("stop", [0, 5, 11, 12, 17])
def test_sampler_state_resumes_exactly(stop):
    full = _run(_loader(), range(2))
    first = _loader()
    seen = []
    for epoch in range(2):
        first.sampler.set_epoch(epoch)
        for batch in first:
            if len(seen) == stop:
                break
            seen.append(batch)
            first.consumed += 1
        if len(seen) == stop:
            break
    state = first.state_dict()
    resumed = _loader()
    resumed.load_state_dict(state)
    rest = []
    for epoch in range(state["epoch"] + (state["consumed"] >= 12), 2):
        resumed.sampler.set_epoch(epoch)
        for batch in resumed:
            rest.append(batch)
            resumed.consumed += 1
    assert seen + rest == full


def test_resume_with_other_mixing_is_refused():
    state = _loader().state_dict()
    with pytest.raises(PtmError, match="mixing"):
        _loader(sizes=(10, 30)).load_state_dict(state)


# -- end to end through main.py ----------------------------------------------------------------------
def _sentence(rng, label):
    words = [rng.choice(FILLER) for _ in range(rng.randint(4, 8))]
    for _ in range(2):
        words.insert(rng.randrange(len(words) + 1), rng.choice(CUES[label]))
    return words


def _task_files(root: Path) -> dict[str, Path]:
    rng = random.Random(0)
    cue_tags = {w: tag for tag, ws in (("POS", CUES["pos"]), ("NEG", CUES["neg"])) for w in ws}
    splits = {"train": 96, "validation": 24, "test": 16}
    dirs = {name: root / name for name in ("sentiment", "tagging", "qa")}
    for split, n in splits.items():
        sent, tags, qa = [], [], []
        for i in range(n):
            label = ("pos", "neg")[i % 2]
            words = _sentence(rng, label)
            sent.append({"id": f"s{split}{i}", "text": " ".join(words), "label": label})
            tags.append({"id": f"t{split}{i}", "words": words, "tags": [cue_tags.get(w, "O") for w in words]})
            context = " ".join(words)
            cue = next(w for w in words if w in cue_tags)
            qa.append({"id": f"q{split}{i}", "question": "which word is the cue", "context": context,
                       "answers": {"text": [cue], "answer_start": [context.index(cue) if context.startswith(cue)
                                                                   else context.index(" " + cue) + 1]}})
        write_jsonl(dirs["sentiment"] / f"{split}.jsonl", sent)
        write_jsonl(dirs["tagging"] / f"{split}.jsonl", tags)
        write_jsonl(dirs["qa"] / f"{split}.jsonl", qa)
    return dirs


def _config(tmp: Path, dirs: dict[str, Path], steps: int, mixing: str = "temperature") -> Path:
    cfg = {
        "seed_everything": 11,
        "trainer": {"max_steps": steps, "accelerator": "cpu", "val_check_interval": steps,
                    "check_val_every_n_epoch": None, "log_every_n_steps": 1, "num_sanity_val_steps": 0,
                    "enable_progress_bar": False, "enable_model_summary": False},
        "model": {"class_path": "MultitaskModule",
                  "init_args": {"backbone_config": TINY_BERT, "optim": {"lr": 3e-3, "warmup": 5}}},
        "data": {"class_path": "MultitaskDataModule",
                 "init_args": {"mixing": mixing, "batch_size": 8, "seed": 2,
                               "tokenizer": {"train": "wordpiece", "vocab_size": 120, "min_frequency": 1},
                               "tasks": {
                                   "sentiment": {"class_path": "TaskDataModule",
                                                 "init_args": {"source": str(dirs["sentiment"]), "max_length": 24}},
                                   "tagging": {"class_path": "TokenTaskDataModule",
                                               "init_args": {"source": str(dirs["tagging"]), "max_length": 24}},
                                   "qa": {"class_path": "QADataModule",
                                          "init_args": {"source": str(dirs["qa"]), "max_length": 40}}}}},
    }
    path = tmp / "multitask.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _rows(run: Path) -> list[dict]:
    return list(csv.DictReader(open(run / "logs" / "metrics.csv")))


@pytest.fixture(scope="module")
def multitask_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("multitask")
    dirs = _task_files(root / "data")
    cfg, runs = _config(root, dirs, steps=90), root / "runs"
    assert run_main(["fit", "--config", str(cfg)], runs) == 0
    return root, dirs, cfg, runs


def test_multitask_logs_per_task_and_macro_metrics_and_learns_every_task(multitask_run):
    _, _, _, runs = multitask_run
    rows = _rows(runs / "multitask")
    val = [r for r in rows if r.get("val/macro")][-1]
    metrics = {k: float(v) for k, v in val.items() if v and k.startswith("val/")}
    for key in ("val/sentiment/acc", "val/sentiment/mcc", "val/tagging/acc", "val/qa/f1", "val/qa/em"):
        assert key in metrics, sorted(metrics)
    main = [metrics["val/sentiment/acc"], metrics["val/tagging/acc"], metrics["val/qa/f1"]]
    assert metrics["val/macro"] == pytest.approx(sum(main) / 3, abs=1e-6)
    # chance: 0.5 for sentiment, ~0.55 majority tag; every task is learnt from the shared encoder
    assert metrics["val/sentiment/acc"] > 0.8 and metrics["val/tagging/acc"] > 0.9, metrics
    assert metrics["val/qa/f1"] > 0.3, metrics
    trained = {t for r in rows for t in ("sentiment", "tagging", "qa") if r.get(f"train/{t}/loss")}
    assert trained == {"sentiment", "tagging", "qa"}


def test_multitask_run_resumes_exactly(multitask_run, tmp_path):
    root, dirs, _, _ = multitask_run
    cfg, runs = _config(tmp_path, dirs, steps=24), tmp_path / "runs"
    assert run_main(["fit", "--config", str(cfg), "--run_name", "full"], runs) == 0
    assert run_main(["fit", "--config", str(cfg), "--run_name", "part", "--stop_at_step", "10"], runs) == 0
    assert run_main(["fit", "--config", str(cfg), "--run_name", "part", "--ckpt_path", "last"], runs) == 0

    def per_step(run):
        return {int(r["step"]): (float(r["train/loss"]), int(float(r["train/task"])))
                for r in _rows(run) if r.get("train/loss")}

    full, part = per_step(runs / "full"), per_step(runs / "part")
    assert sorted(part) == list(range(24))
    assert {task for _, task in full.values()} == {0, 1, 2}  # the schedule mixes all three tasks
    for step in range(10, 24):
        assert part[step][1] == full[step][1] and part[step][0] == pytest.approx(full[step][0], rel=1e-5), step


def test_per_task_fine_tuning_starts_from_the_multitask_encoder(multitask_run):
    root, dirs, _, runs = multitask_run
    ckpt = runs / "multitask" / "checkpoints" / "last.ckpt"
    cfg = {
        "seed_everything": 11,
        "trainer": {"max_steps": 3, "accelerator": "cpu", "val_check_interval": 3, "log_every_n_steps": 1,
                    "enable_progress_bar": False, "enable_model_summary": False},
        "model": {"class_path": "SequenceClassificationModule",
                  "init_args": {"backbone_config": TINY_BERT, "init_from": {"path": str(ckpt), "strict": False}}},
        "data": {"class_path": "TaskDataModule",
                 "init_args": {"source": str(dirs["sentiment"]), "max_length": 24, "batch_size": 8,
                               "tokenizer": {"pretrained": str(runs / "multitask" / "tokenizer")}}},
    }
    path = root / "sentiment_after_multitask.yaml"
    path.write_text(yaml.safe_dump(cfg))
    # one step at learning rate 0: the checkpoint holds the weights as init_from loaded them
    assert run_main(["fit", "--config", str(path), "--trainer.max_steps", "1", "--model.init_args.optim.lr", "0"],
                    runs) == 0
    multitask = torch.load(ckpt, weights_only=True)["state_dict"]
    single = torch.load(runs / "sentiment_after_multitask" / "checkpoints" / "last.ckpt",
                        weights_only=True)["state_dict"]
    shared = [k for k in multitask if k.startswith("backbone.") and k.replace("backbone.", "backbone.bert.", 1) in single]
    assert len(shared) > 20
    for key in shared:
        assert torch.equal(single[key.replace("backbone.", "backbone.bert.", 1)], multitask[key]), key
