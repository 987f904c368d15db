"""`main.py plot`: the runs' logs/metrics.csv curves in one PNG, one line per run per metric; a resumed run
(several metrics.csv versions, repeated steps) is one continuous curve."""
import csv
from pathlib import Path

import pytest

from ptm_app.analysis.plot import draw, read_curves
from tests.conftest import run_main

HEADER = ["epoch", "step", "throughput/tokens_per_s", "train/loss", "val/loss", "val/acc"]


def write_log(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, HEADER)
        writer.writeheader()
        writer.writerows(rows)


def train_rows(steps, loss0: float) -> list[dict]:
    return [{"epoch": 0, "step": s, "throughput/tokens_per_s": 1000 + s, "train/loss": loss0 - 0.1 * s}
            for s in steps]


@pytest.fixture
def two_runs(runs_dir):
    # run a: one log; validation rows share the step of a training row (Lightning's layout)
    write_log(runs_dir / "a" / "logs" / "metrics.csv",
              train_rows(range(6), 5.0) + [{"epoch": 0, "step": 2, "val/loss": 4.0, "val/acc": 0.5},
                                           {"epoch": 0, "step": 5, "val/loss": 3.5, "val/acc": 0.6}])
    # run b: stopped at step 4 (version_0), resumed from its step-3 checkpoint (version_1): steps 3.. again
    write_log(runs_dir / "b" / "logs" / "version_0" / "metrics.csv", train_rows(range(5), 9.0))
    write_log(runs_dir / "b" / "logs" / "version_1" / "metrics.csv",
              train_rows(range(3, 8), 7.0) + [{"epoch": 0, "step": 7, "val/loss": 3.0, "val/acc": 0.7}])
    return runs_dir


def test_resumed_run_is_one_continuous_curve(two_runs):
    steps, losses = read_curves(two_runs / "b")["train/loss"]
    assert steps == list(range(8))  # no step twice
    assert losses[:3] == pytest.approx([9.0, 8.9, 8.8])  # the first segment before the resume point
    assert losses[3:] == pytest.approx([6.7, 6.6, 6.5, 6.4, 6.3])  # the resumed segment wins from step 3 on
    assert read_curves(two_runs / "a")["val/acc"] == ([2, 5], [0.5, 0.6])


def test_one_line_per_run_per_metric(two_runs):
    curves = {name: read_curves(two_runs / name) for name in ("a", "b")}
    fig = draw(curves, ["train/loss", "val/acc", "throughput/tokens_per_s"])
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["train/loss", "val/acc", "throughput/tokens_per_s"]
    for ax in axes:
        assert [line.get_label() for line in ax.get_lines()] == ["a", "b"]
    b_loss = axes[0].get_lines()[1]
    assert list(b_loss.get_xdata()) == list(range(8))
    assert list(axes[1].get_lines()[0].get_ydata()) == [0.5, 0.6]


def test_plot_command_writes_a_png(two_runs, tmp_path, capsys):
    out = tmp_path / "curves.png"
    assert run_main(["plot", "a", str(two_runs / "b"), "--metrics", "train/loss", "val/loss",
                     "--output", str(out)], two_runs) == 0
    import matplotlib.image

    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width = matplotlib.image.imread(out).shape[:2]
    assert width > 600 and height > 200  # two panels side by side
    assert run_main(["plot", "a"], two_runs) == 0  # default metrics, default output next to the run
    assert (two_runs / "a" / "metrics.png").stat().st_size > 1000


@pytest.mark.parametrize("argv, message", [
    (["plot", "a", "--metrics", "val/f1"], "metric val/f1 is not logged by a; logged: throughput/tokens_per_s"),
    (["plot", "nowhere"], "run 'nowhere' not found"),
    (["plot", "a", "--colour", "red"], "unknown command-line argument --colour red"),
    (["plot", "a", "--output", "x.pdf"], "give a .png file name"),
])
def test_bad_input_is_one_line(two_runs, capsys, argv, message):
    assert run_main(argv, two_runs) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


@pytest.mark.slow  # two tiny fits: about 15-30 s on the shared 2 cores
def test_a_real_paused_and_resumed_run_is_one_curve(tiny_corpus, tmp_path):
    """A tiny MLM run stopped at step 4 and resumed: its logs/metrics.csv draws one curve over every step."""
    from tests.conftest import tiny_mlm_config

    runs = tmp_path / "runs"
    config = tiny_mlm_config(tiny_corpus, tmp_path, max_steps=8, val_check_interval=4)
    assert run_main(["fit", "--config", str(config), "--run_name", "r", "--stop_at_step", "4"], runs) == 0
    assert run_main(["fit", "--config", str(config), "--run_name", "r", "--ckpt_path", "last"], runs) == 0
    curves = read_curves(runs / "r")
    assert curves["train/loss"][0] == list(range(8))
    assert curves["val/loss"][0] == sorted(set(curves["val/loss"][0])) and len(curves["val/loss"][0]) >= 2
    out = tmp_path / "r.png"
    assert run_main(["plot", str(runs / "r"), "--output", str(out)], runs) == 0 and out.stat().st_size > 1000
