"""Shared fixtures: isolated caches and run dirs, a tiny labelled corpus, tiny model configs."""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# precision auto answers as on a CPU without bf16 instructions (fp32), on every machine: the suite's numbers and times
# do not depend on the host's CPU (tests of the choice itself clear this; PTM_CPU_BF16=1 runs the suite in bf16)
os.environ.setdefault("PTM_CPU_BF16", "0")

TINY_BERT = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
             "intermediate_size": 64, "max_position_embeddings": 64}
TINY_GPT2 = {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64}
WORDS = ("the cat sat on a mat while dogs ran in the park and birds sang songs of joy every morning "
         "markets rose as shares fell after the bank said profits would grow").split()


@pytest.fixture(scope="session", autouse=True)
def isolated_cache(tmp_path_factory) -> Path:
    """Tokenizer/tokenization caches go to a session temp dir; the prepared real data stays shared."""
    cache = tmp_path_factory.mktemp("cache")
    os.environ["PTM_CACHE_DIR"] = str(cache)
    return cache


@pytest.fixture(autouse=True)
def runs_dir(tmp_path, monkeypatch) -> Path:
    runs = tmp_path / "runs"
    monkeypatch.setenv("PTM_RUNS_DIR", str(runs))
    return runs


def native_bf16_cpu() -> bool:
    """Does this CPU run bf16 natively (its own answer, not the suite's ``PTM_CPU_BF16=0``)?  Tests that run in bf16
    skip where it is only emulated, about 70x slower (``training.precision``)."""
    from ptm_app.training import precision

    saved = os.environ.pop(precision.SEAM, None)
    try:
        return precision.cpu_has_native_bf16()
    finally:
        if saved is not None:
            os.environ[precision.SEAM] = saved


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def make_docs(n: int, seed: int, labels=("pos", "neg")) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for d in range(n):
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 15))) for _ in range(rng.randint(2, 5))]
        rows.append({"id": f"doc{seed}-{d}", "text": "\n".join(lines), "label": labels[d % len(labels)]})
    return rows


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    """A directory with train/validation/test JSONL splits (text + label)."""
    root = tmp_path_factory.mktemp("tiny_corpus")
    write_jsonl(root / "train.jsonl", make_docs(60, 1))
    write_jsonl(root / "validation.jsonl", make_docs(10, 2))
    write_jsonl(root / "test.jsonl", make_docs(10, 3))
    return root


def tiny_mlm_config(corpus: Path, tmp: Path, **trainer) -> Path:
    """A YAML for a tiny BERT MLM run on the fixture corpus (2 blocks of 4 per 6-step epoch)."""
    import yaml

    cfg = {
        "seed_everything": 7,
        "trainer": {"max_steps": 20, "accelerator": "cpu", "devices": 1, "val_check_interval": 3,
                    "log_every_n_steps": 1, "enable_progress_bar": False, "enable_model_summary": False,
                    **trainer},
        "model": {"class_path": "MaskedLMModule",
                  "init_args": {"backbone_config": TINY_BERT, "optim": {"lr": 1e-3, "warmup": 2}}},
        "data": {"class_path": "PretrainDataModule",
                 "init_args": {"source": str(corpus), "max_length": 32, "batch_size": 4, "limit_documents": 20,
                               "tokenizer": {"train": "wordpiece", "vocab_size": 200, "min_frequency": 1}}},
    }
    path = tmp / "tiny_mlm.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_main(argv: list[str], runs: Path) -> int:
    """``main.py`` in-process with ``PTM_RUNS_DIR`` pointing at ``runs`` for this call only."""
    from ptm_app.main import main

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PTM_RUNS_DIR", str(runs))
        return main(argv)


def logged_losses(run: Path) -> dict[int, float]:
    """``train/loss`` by step from a run's ``logs/metrics.csv``."""
    import csv

    return {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(open(run / "logs" / "metrics.csv"))
            if r.get("train/loss")}


def assert_resumes_exactly(argv: list[str], runs: Path, stop: int, steps: int) -> None:
    """Run ``argv`` (a ``fit`` command) whole as run ``full`` and paused at ``stop`` then resumed as ``part``:
    both must log the same losses at every step after the pause."""
    assert run_main([*argv, "--run_name", "full"], runs) == 0
    assert run_main([*argv, "--run_name", "part", "--stop_at_step", str(stop)], runs) == 0
    assert run_main([*argv, "--run_name", "part", "--ckpt_path", "last"], runs) == 0
    full, part = logged_losses(runs / "full"), logged_losses(runs / "part")
    assert sorted(full) == sorted(part) == list(range(steps))
    for step in range(stop, steps):
        assert part[step] == pytest.approx(full[step], rel=1e-5, abs=1e-6), step


def worker_threads() -> int:
    """Intra-op threads for one pytest-xdist worker: the cores this process may use shared among the workers
    (at least 1).  Two workers with torch's default of one thread per core oversubscribe the cores, and OpenMP's
    spinning threads then run a step up to 10x slower than alone; a lone process keeps the default."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // workers)


def pytest_configure(config):
    """Under pytest-xdist, each worker (and the processes its tests start, through ``OMP_NUM_THREADS``) uses its
    share of the cores: see ``worker_threads``."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        import torch

        threads = int(os.environ.setdefault("OMP_NUM_THREADS", str(worker_threads())))  # a user's setting wins
        torch.set_num_threads(threads)


def pytest_collection_modifyitems(config, items):
    """The longest test files first (``tests/file_seconds.json``; unlisted files after, in collection order), each
    file's tests in their own order: see ``tests.file_seconds``."""
    from tests.file_seconds import read_table

    seconds = read_table()
    rank = {}
    for item in items:
        rank.setdefault(item.nodeid.split("::")[0], len(rank))
    def order(item):
        name = item.nodeid.split("::")[0]
        return name not in seconds, -seconds.get(name, 0.0), rank[name]

    items.sort(key=order)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of tiny models (threads only add contention on 2 shared cores);
    restored afterwards.  Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_runtest_teardown(item):
    """With ``PTM_TEST_RSS_LOG=FILE``: after every test, append ``worker test RSS-MB`` (the process's resident set
    now), to find the test files after which a worker's memory stays high."""
    path = os.environ.get("PTM_TEST_RSS_LOG")
    if not path:
        return
    with open("/proc/self/statm") as fh:
        rss_mb = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    with open(path, "a") as fh:
        fh.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')} {item.nodeid} {rss_mb:.0f}\n")


COLOURS = {"red": (230, 30, 30), "green": (30, 200, 60), "blue": (40, 60, 230), "yellow": (240, 220, 40),
           "black": (10, 10, 10), "purple": (150, 40, 190), "orange": (250, 140, 20), "grey": (128, 128, 128),
           "pink": (250, 150, 200), "brown": (120, 70, 30)}


def image_text_set(root: Path, size: int = 16) -> Path:
    """A tiny prepared image-text set in the layout of ``data prepare emoji``: one concept per colour (a square
    drawn as style ``flat`` and a ring as style ``ring``), captioned "a <colour> square"; concepts split 6/2/2."""
    import numpy as np
    from safetensors.numpy import save_file

    root.mkdir(parents=True, exist_ok=True)
    pixels, splits = [], {"train": [], "validation": [], "test": []}
    yy, xx = np.mgrid[:size, :size]
    ring = np.abs(np.hypot(yy - size / 2 + 0.5, xx - size / 2 + 0.5) - size / 3) < size / 8
    square = (abs(yy - size / 2 + 0.5) < size / 3) & (abs(xx - size / 2 + 0.5) < size / 3)
    for i, (name, rgb) in enumerate(COLOURS.items()):
        split = "train" if i < 6 else "validation" if i < 8 else "test"
        for style, mask in (("flat", square), ("ring", ring)):
            img = np.full((size, size, 3), 255, dtype=np.uint8)
            img[mask] = rgb
            splits[split].append({"id": f"{style}/{name}", "image": len(pixels), "caption": f"a {name} square",
                                  "concept": name, "style": style, "skin_tone": False,
                                  "group": "warm" if i % 2 else "cool", "subgroup": f"shade-{i % 3}"})
            pixels.append(img)
    save_file({"pixels": np.stack(pixels)}, str(root / "images.safetensors"))
    for split, rows in splits.items():
        write_jsonl(root / f"{split}.jsonl", rows)
    (root / "manifest.json").write_text(json.dumps({"name": "colours", "image_size": size}))
    return root


TINY_VIT = {"model_type": "vit", "image_size": 16, "patch_size": 4, "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 2, "intermediate_size": 64}
