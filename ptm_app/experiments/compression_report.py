"""``python main.py compress-report --config configs/compress/minilm_report_bbc.yaml``: the compression table, in the
style of Qiu et al. 2020's Table 3 (§4.5), measured here and never typed by hand.

Every row is a trained model named in the config: a run directory, ``.ckpt``, export, ``prune`` or ``quantize``
directory (``inference.loading``), and for an early-exit run an exit rule (``entropy:S`` / ``patience:t``), with
which it is timed and scored through ``EarlyExitModule.exit_forward``, the forward that really stops.  A row whose
model is missing, or was made by an earlier recipe than its make steps give now (each made model records the recipe
that made it, its upstream models' included: ``recipe_fingerprints``), is one line naming its ``make`` command
(``make_missing: true`` runs those commands first, in the rows' order: ``make compress``).  For each row, all in one process:

* parameters (int8 weights counted as weights) and non-zero parameters, the weights' size on disk (the int8
  safetensors file of a quantized directory, else the safetensors of the model and any off-ramps);
* CPU latency at batch 1 (per text, over 32 texts each alone: their own lengths and, for early exit, their own
  exit layers) and batch 32 (32 texts padded together; an early exit stops when every text has exited): the median
  of ``repeats`` rounds, every row timed in turn within each round (``compression.quantize.alternating_medians``),
  and the speed-up against the teacher;
* the task metric (accuracy or macro F1) on the same examples of ``source``'s ``split``, computed in fp32 as the
  rows are timed, and its percentage of the teacher's; an early-exit row also gets its mean exit layer.

Writes ``compression.md|csv|json``, ``compression.png`` (size and batch-32 latency against the metric) and
``settings.json`` into the report's run directory; with ``targets`` (issue 14's: a 3-layer student keeps 95 % of
the teacher's metric at 1.8x its batch-32 speed, dynamic int8 is 1.5x faster at batch 1 for at most one point, the
distilled BiLSTM beats the same BiLSTM trained alone), also ``compression_targets.md|csv|json``, each condition
judged from the measured rows.
"""
from __future__ import annotations

import functools
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Optional, Union

import torch

from ptm_app.errors import PtmError
from ptm_app.paths import require_markers, run_name_for, run_path, runs_root, write_between_markers, write_json

COLUMNS = ["model", "params", "nonzero_params", "block_sparsity", "size_mb", "latency_b1_ms", "latency_b32_ms",
           "speedup_b1",
           "speedup_b32", "metric", "metric_pct_of_teacher", "exit_layer"]


@dataclass
class CompressionRow:
    """Args:
        name: the row's label in the table.
        model: a run directory (or run name under the runs directory), ``.ckpt``, export, ``prune`` or
            ``quantize`` output directory.
        make: the ``main.py`` commands that produce ``model``, in order: a list of one-key mappings, the command and
            its options as in a sweep plan (``- fit: {config: configs/adapt/minilm_full_bbc.yaml, run_name: x,
            trainer.max_epochs: 1}``); named when the model is missing, run by ``make_missing``.  Reports written
            before this were command strings (``python main.py fit --config ...``, several joined by ``&&``): they
            still load.
        exit: for an early-exit run: ``entropy:S`` (DeeBERT) or ``patience:t`` (PABEE).
    """

    name: str
    model: str
    make: Union[str, list[dict[str, dict[str, Any]]]] = ""
    exit: Optional[str] = None


@dataclass
class CompressionTarget:
    """A target the table is judged on; every condition that is set must hold for ``row``.

    Args:
        row: the name of the row judged.
        min_metric_pct: its metric is at least this % of the teacher's.
        max_metric_drop: its metric is at most this many points (metric x 100) below the teacher's.
        min_speedup_b1: its batch-1 speed-up against the teacher is at least this.
        min_speedup_b32: its batch-32 speed-up against the teacher is at least this.
        beats: the name of another row whose metric its own must exceed, significantly: the exact McNemar test on the
            two rows' per-example correctness on the same test examples (``mcnemar_p``) must give p < 0.05.
    """

    row: str
    min_metric_pct: Optional[float] = None
    max_metric_drop: Optional[float] = None
    min_speedup_b1: Optional[float] = None
    min_speedup_b32: Optional[float] = None
    beats: Optional[str] = None


def as_target(target) -> CompressionTarget:
    return target if isinstance(target, CompressionTarget) else CompressionTarget(**target)


def check_targets(targets: list[CompressionTarget], names: list[str]) -> None:
    """Refuse, before anything runs, a target naming a row the report does not have, or setting no condition."""
    for t in targets:
        for name in (t.row, t.beats):
            if name is not None and name not in names:
                raise PtmError(f"compression target names row {name!r}, which is not in the report; use one of "
                               f"{names}")
        if all(v is None for k, v in asdict(t).items() if k != "row"):
            raise PtmError(f"compression target for {t.row!r} sets no condition; set min_metric_pct, "
                           f"max_metric_drop, min_speedup_b1, min_speedup_b32 or beats")


def mcnemar_p(first: list[bool], second: list[bool]) -> float:
    """Two-sided exact McNemar p-value of two classifiers' correctness on the same examples (McNemar 1947): under
    equal accuracy the discordant examples split as Binomial(b + c, 1/2)."""
    from math import comb

    b = sum(x and not y for x, y in zip(first, second))
    c = sum(y and not x for x, y in zip(first, second))
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(comb(n, k) for k in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def judge(targets: list[CompressionTarget], measured: list[dict], correct: Optional[dict] = None,
          over_seeds: Optional[dict[str, list[float]]] = None) -> list[dict]:
    """One line per condition: the target, what was measured and whether it is met (teacher: the first row);
    ``correct``: per row, whether each test example was right (for ``beats``: McNemar); ``over_seeds``: per seeded
    row its metric per seed (``beats`` between two seeded rows: the paired difference over seeds, whose 95 % t
    interval must lie above 0)."""
    rows, teacher = {r["model"]: r for r in measured}, measured[0]
    judged = []
    for t in targets:
        r = rows[t.row]
        checks = []
        if t.min_metric_pct is not None:
            pct = r["metric_pct_of_teacher"]
            checks.append((f"metric >= {t.min_metric_pct:g} % of the teacher's",
                           "n/a" if pct is None else f"{pct:.1f} %", pct is not None and pct >= t.min_metric_pct))
        if t.max_metric_drop is not None:
            drop = 100.0 * (teacher["metric"] - r["metric"])
            checks.append((f"at most {t.max_metric_drop:g} point(s) below the teacher", f"{drop:.1f} points",
                           drop <= t.max_metric_drop))
        for batch, floor in (("b1", t.min_speedup_b1), ("b32", t.min_speedup_b32)):
            if floor is not None:
                got = r[f"speedup_{batch}"]
                checks.append((f"batch-{batch[1:]} speed-up >= {floor:g}x", f"{got:.2f}x", got >= floor))
        if t.beats is not None and over_seeds and len(over_seeds.get(t.row, [])) > 1 \
                and len(over_seeds.get(t.beats, [])) == len(over_seeds[t.row]):
            from ptm_app.experiments.stats import paired

            p = paired(over_seeds[t.row], over_seeds[t.beats])
            checks.append((f"metric above {t.beats!r} (paired over seeds, interval above 0)", p.text(),
                           p.diff.interval[0] > 0))
        elif t.beats is not None:
            other = rows[t.beats]
            p = mcnemar_p(correct[t.row], correct[t.beats]) if correct else None
            shown = f"{r['metric']:.3f} vs {other['metric']:.3f}" + (f", McNemar p = {p:.3g}" if p is not None else "")
            checks.append((f"metric above {t.beats!r} (McNemar p < 0.05)", shown,
                           r["metric"] > other["metric"] and p is not None and p < 0.05))
        judged += [{"row": t.row, "target": name, "measured": got, "met": "yes" if met else "no"}
                   for name, got, met in checks]
    return judged


def as_row(row) -> CompressionRow:
    """A row from its settings (the parsed YAML gives a mapping)."""
    return row if isinstance(row, CompressionRow) else CompressionRow(**row)


MAKE_EXAMPLE = "make: [{fit: {config: configs/adapt/minilm_full_bbc.yaml}}]"


def make_steps(row: CompressionRow) -> list[list[str]]:
    """The ``main.py`` argument lists of ``row.make``: one per step of the list (``{command: {option: value}}``, the
    options as ``sweep.override_args`` writes them), or, for an old command string, one per ``python main.py ...``
    command joined by ``&&``."""
    from ptm_app.experiments.sweep import override_args

    if not isinstance(row.make, str):
        steps = []
        for step in row.make if isinstance(row.make, list) else [row.make]:
            if not (isinstance(step, dict) and len(step) == 1 and isinstance(next(iter(step)), str)
                    and isinstance(next(iter(step.values())), (dict, type(None)))):
                raise PtmError(f"row {row.name!r}: make step {step!r:.80} is not one command and its options; write "
                               f"e.g. {MAKE_EXAMPLE}")
            (command, options), = step.items()
            steps.append([command, *override_args(options or {})])
        return steps
    steps = []
    for part in row.make.split("&&"):
        words = shlex.split(part)
        if len(words) < 3 or words[0] not in ("python", "python3") or Path(words[1]).name != "main.py":
            raise PtmError(f"row {row.name!r}: make {row.make!r} is not a 'python main.py COMMAND ...' command "
                           f"(several joined by &&); write the commands that produce {row.model}")
        steps.append(words[2:])
    return steps


def unfinished(path: Path) -> bool:
    """A run directory whose fit has not ended (checkpoints, but no ``summary.json``: stopped or still running)."""
    return (path / "checkpoints").is_dir() and not (path / "summary.json").is_file()


def locate(row: CompressionRow) -> Optional[str]:
    """The row's model as a local path (as given or under the runs directory) or prepared name; None if missing
    or an unfinished run."""
    from ptm_app.compression.teacher import resolve_teacher

    try:
        found = resolve_teacher(row.model)
    except PtmError:
        return None
    return None if unfinished(Path(found)) else found


def fit_run_dir(argv: list[str]) -> Path:
    """The run directory a ``fit`` step writes (``cli``'s rule, ``paths.run_name_for``; the report's steps give
    one ``--config``), under the runs directory."""
    import yaml

    flags = {flag: value for flag, value in zip(argv, argv[1:]) if flag.startswith("--")}
    name, config = flags.get("--run_name"), Path(flags.get("--config", "run"))
    if name is None and config.is_file():
        name = (yaml.safe_load(config.read_text()) or {}).get("run_name")
    return runs_root() / run_name_for(name, [config])


def resumable(argv: list[str]) -> Optional[list[str]]:
    """A make step as it should run now: a ``fit`` whose run has finished is skipped (None), one that stopped
    resumes exactly (``--ckpt_path last``), anything else runs as written."""
    if argv[0] != "fit" or "--ckpt_path" in argv:
        return argv
    run = fit_run_dir(argv)
    if (run / "summary.json").is_file():
        return None
    return [*argv, "--ckpt_path", "last"] if (run / "checkpoints" / "last.ckpt").is_file() else argv


def step_output(argv: list[str]) -> Optional[Path]:
    """Where a make step writes, resolved: a ``fit``'s run directory, another command's ``--output_dir``; None for
    a step that writes neither."""
    if argv[0] == "fit":
        return absolute(fit_run_dir(argv))
    flags = step_flags(argv)
    return absolute(Path(flags["--output_dir"])) if "--output_dir" in flags else None


def step_flags(argv: list[str]) -> dict[str, str]:
    """A make step's ``--flag value`` pairs after its command (``make_steps`` writes them so); {} when the words do
    not pair up."""
    return dict(zip(argv[1::2], argv[2::2])) if len(argv) % 2 else {}


def absolute(path: Path) -> Path:
    """``path`` made absolute and normal, links not followed: two run names linked to one directory stay two
    outputs."""
    import os

    return Path(os.path.abspath(path.expanduser()))


def split_configs(argv: list[str]) -> tuple[list[str], list[str]]:
    """A step's ``--config`` files, and its other words (command first)."""
    configs, rest, i = [], [argv[0]], 1
    while i < len(argv):
        flag, eq, value = argv[i].partition("=")
        if flag == "--config":
            if not eq:
                value, i = (argv[i + 1] if i + 1 < len(argv) else ""), i + 1
            configs.append(value)
        else:
            rest.append(argv[i])
        i += 1
    return configs, rest


def strings_in(value) -> list[str]:
    """Every string in a parsed config (a teacher's path, a checkpoint to start from, ...)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings_in(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings_in(v)]
    return []


def recipe_fingerprints(rows: list[CompressionRow]) -> dict[Path, str]:
    """Each make step's output -> the fingerprint of the recipe that makes it: the command, its configs' settings
    (parsed: comments and layout do not count), its other options, and the fingerprints of the other steps' outputs
    it reads (a ``quantize``'s ``--ckpt_path``, a distillation config's ``teacher``), hashed.  So a changed
    teacher recipe makes its students stale too, and a changed fit the int8 made from it (as ``sweep``'s chains)."""
    import yaml

    from ptm_app.experiments.sweep import recipe_digest

    steps: dict[Path, list[str]] = {}
    for row in rows:
        for argv in make_steps(row) if row.make else []:
            out = step_output(argv)
            if out is not None and steps.setdefault(out, argv) != argv:
                raise PtmError(f"row {row.name!r} makes {out} with 'python main.py {shlex.join(argv)}', another row "
                               f"with 'python main.py {shlex.join(steps[out])}'; give each its own run_name or "
                               f"output_dir")
    parsed = {out: split_configs(argv) for out, argv in steps.items()}
    settings = {out: [yaml.safe_load(Path(c).read_text(encoding="utf-8")) if Path(c).is_file() else c
                      for c in configs] for out, (configs, _) in parsed.items()}
    found: dict[Path, str] = {}

    def fingerprint(out: Path, seen: tuple[Path, ...] = ()) -> str:
        if out in seen:
            raise PtmError(f"the rows' make steps read each other's outputs in a circle ({out}); a step can only "
                           f"read what an earlier one makes")
        if out not in found:
            rest = parsed[out][1]
            reads = {names_output(s, set(steps)) for s in [*rest[1:], *strings_in(settings[out])]} - {None, out}
            recipe = {"args": rest, "configs": settings[out],
                      "upstream": sorted(fingerprint(o, (*seen, out)) for o in reads)}
            found[out] = recipe_digest(recipe)
        return found[out]

    return {out: fingerprint(out) for out in steps}


def current_model(row: CompressionRow, fingerprints: dict[Path, str]) -> Optional[str]:
    """``locate(row)``, or None when the model there was made by another recipe than the rows' make steps give now
    (``sweep.is_current`` on the ``cell.json`` that ``run_make`` wrote; a model made before is trusted)."""
    from ptm_app.experiments.sweep import is_current

    found = locate(row)
    out = names_output(row.model, set(fingerprints)) if found is not None else None
    return None if out is not None and not is_current(Path(found), fingerprints[out]) else found


def run_make(row: CompressionRow, fingerprints: dict[Path, str]) -> None:
    """Run the row's ``make`` commands, each as ``python -m ptm_app ...`` in a child process (its console shows
    through; its memory is freed before the next row); a finished fit is not run again and a stopped one resumes
    (``resumable``); a failing command stops the report.  An output made by an earlier recipe
    (``recipe_fingerprints``) is kept as ``<name>.stale-N`` and made afresh; each output records its recipe
    (``<output>/cell.json``)."""
    import subprocess
    import sys

    from ptm_app.experiments.sweep import record_cell, set_aside_if_stale

    for step in make_steps(row):
        out = step_output(step)
        made = fingerprints.get(out) if out is not None else None
        if made is not None:
            moved = set_aside_if_stale(out, made)
            if moved is not None:
                print(f"row {row.name!r}: its recipe changed since {out.name} was made; that is kept as "
                      f"{moved.name} and made afresh", flush=True)
            if step[0] == "fit":  # before it runs: a stopped fit of this recipe resumes
                record_cell(out, made, {"row": row.name, "make": step}, remedy="move it away")
        argv = resumable(step)
        if argv is None:
            continue
        if subprocess.run([sys.executable, "-m", "ptm_app", *argv]).returncode != 0:
            raise PtmError(f"row {row.name!r}: 'python main.py {shlex.join(argv)}' failed (its error is above); "
                           f"fix it and run the report again")
        if made is not None and step[0] != "fit":
            record_cell(out, made, {"row": row.name, "make": step})


def make_text(row: CompressionRow) -> str:
    """``row.make`` as the shell commands it runs (``python main.py ...``, joined by ``&&``)."""
    return " && ".join(f"python main.py {shlex.join(argv)}" for argv in make_steps(row))


def missing_line(rows: list[CompressionRow]) -> str:
    first = rows[0]
    more = f" ({len(rows) - 1} more rows are missing too)" if len(rows) > 1 else ""
    how = f"make it with: {make_text(first)}" if first.make else "give the path of a trained model"
    what = ("was made by an earlier recipe than its make steps give now" if locate(first) is not None
            else f"not found (nor under {runs_root()})")
    return (f"compression row {first.name!r}: {first.model} {what}; {how}{more}; "
            f"or set make_missing: true to run every missing row's commands")


def weight_tensors(model: torch.nn.Module):
    """Every weight of ``model``, an int8 linear layer's weights included (torch.ao's are packed, not parameters)."""
    from ptm_app.compression.quantization import (StaticInt8Linear, WeightOnlyInt8Linear, _dynamic_linear_type,
                                                  torch_ao_available)

    dynamic = _dynamic_linear_type() if torch_ao_available() else ()
    yield from model.parameters()
    for module in model.modules():
        if isinstance(module, dynamic):
            weight, bias = module._weight_bias()
            yield weight.int_repr()
            if bias is not None:
                yield bias
        elif isinstance(module, (WeightOnlyInt8Linear, StaticInt8Linear)):  # int8 buffers, not parameters
            yield from (t for t in (module.weight_int8, module.bias) if t is not None)


def counts(modules: list[torch.nn.Module]) -> tuple[int, int]:
    """``(parameters, non-zero parameters)`` of the modules (each tensor once)."""
    tensors = [t for module in modules for t in weight_tensors(module)]  # all alive: their ids are distinct
    unique = list({id(t): t for t in tensors}.values())
    return sum(t.numel() for t in unique), sum(int((t != 0).sum()) for t in unique)


def block_sparsity(model: torch.nn.Module) -> Optional[float]:
    """The fraction of zeros in the transformer blocks' linear weights (what magnitude pruning prunes:
    ``compression.magnitude.prunable_weights``); None for a model without such blocks (BiLSTM, CNN, int8)."""
    from ptm_app.compression.magnitude import prunable_weights, sparsity_of

    try:
        return round(sparsity_of(prunable_weights(model).values()), 4)
    except PtmError:
        return None


def size_mb(loaded, extra: list[torch.nn.Module]) -> float:
    """The weights on disk: a quantized directory's int8 file, else the safetensors ``export`` would write."""
    from ptm_app.compression.pruning_policy import on_disk_mb
    from ptm_app.compression.quantization import QUANT_WEIGHTS, is_quantized

    if loaded.directory is not None and is_quantized(loaded.directory):
        return round((Path(loaded.directory) / QUANT_WEIGHTS).stat().st_size / 2**20, 3)
    return round(sum(on_disk_mb(m) for m in [loaded.model, *extra]), 3)


def load_row(row: CompressionRow, where: str):
    """``(loaded model, early-exit rule or None)``; an exit rule on anything but an early-exit run is one line."""
    from ptm_app.compression.early_exit_policy import EarlyExit, parse_exit_rule
    from ptm_app.inference.loading import load_for_inference

    loaded = load_for_inference(where)
    if loaded.model_class != "sequence_classification":
        raise PtmError(f"row {row.name!r}: {row.model} is a {loaded.kind} (model class {loaded.model_class}); "
                       f"the compression table "
                       f"compares sequence classifiers")
    exiting = loaded.module.policy(EarlyExit) if loaded.module is not None else None
    if row.exit is None:
        if exiting is not None:
            raise PtmError(f"row {row.name!r}: {row.model} is an early-exit run; give its exit rule (exit: "
                           f"entropy:S or patience:t)")
        return loaded, None
    if exiting is None:
        raise PtmError(f"row {row.name!r}: exit {row.exit!r} needs an early-exit run (EarlyExitModule or "
                       f"early_exit); {row.model} is a {loaded.kind}: drop 'exit' or name an early-exit run")
    spec = exiting.spec
    rule = parse_exit_rule(row.exit, spec.method, spec.entropy_thresholds, spec.patiences)
    return loaded, rule


def forward_call(loaded, rule, inputs: dict):
    """A zero-argument forward of the row on ``inputs``: the early exit that stops, else the head's outputs."""
    if rule is not None:
        from ptm_app.compression.early_exit_policy import EarlyExit

        return functools.partial(loaded.module.policy(EarlyExit).exit_forward, loaded.module, dict(inputs), rule)
    return functools.partial(loaded.head_outputs, dict(inputs), "sequence_classification")


def truncation_note(tokenizer, records: list[dict], max_length: int, what: str) -> Optional[str]:
    """The line saying how many of the scored texts are longer than ``max_length`` tokens of ``tokenizer`` (rows
    score and time them truncated), or None; the report prints each distinct line once, not once per row."""
    lengths = [len(ids) for ids in tokenizer([r["text"] for r in records])["input_ids"]]
    over = sum(n > max_length for n in lengths)
    return (f"note: {over} of {len(lengths)} {what} texts are longer than max_length={max_length} tokens; the rows "
            f"score and time them truncated") if over else None


def scored(loaded, rule, records: list[dict], metric: str, labels: list[str], max_length: int,
           batch_size: int) -> tuple[float, Optional[float], list[bool]]:
    """``(metric, mean exit layer or None, each record right?)`` of the row on ``records`` (an early exit at its
    rule)."""
    from ptm_app.analysis.robustness import scores
    from ptm_app.inference.predict import predict_rows

    if rule is not None:
        loaded.module.exit_rule = rule
    rows = predict_rows(loaded, [r["text"] for r in records], batch_size=batch_size, max_length=max_length,
                        precision="32",  # as timed: fp32 (a bf16 run's autocast would score another model)
                        warn_truncated=False)  # said once per distinct count (compress_report)
    index = {label: i for i, label in enumerate(labels)}
    predicted = [index.setdefault(str(row["label"]), len(index)) for row in rows]
    gold = [index[str(r["label"])] for r in records]
    value = scores(gold, predicted, len(index))[metric]
    exits = [row["exit_layer"] for row in rows if "exit_layer" in row]
    return value, (sum(exits) / len(exits) if rule is not None and exits else None), \
        [p == g for p, g in zip(predicted, gold)]


def draw(rows: list[dict]):
    """Metric (% of the teacher's) against size on disk and against batch-32 latency, one labelled point a row."""
    from ptm_app.analysis.figures import new_figure

    fig, axes = new_figure(2, width=6.0, height=4.5, columns=2)
    for ax, key, label in ((axes[0], "size_mb", "weights on disk (MiB)"),
                           (axes[1], "latency_b32_ms", "CPU latency, batch 32 (ms, median)")):
        for i, r in enumerate(rows):
            if r["metric_pct_of_teacher"] is None:  # a teacher scoring 0 has no percentages
                continue
            ax.scatter(r[key], r["metric_pct_of_teacher"], color=f"C{i % 10}")
            ax.annotate(r["model"], (r[key], r["metric_pct_of_teacher"]), fontsize="x-small",
                        xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel(label)
        ax.set_ylabel("metric, % of the teacher's")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def seeded_outputs(rows: list[CompressionRow]) -> set[Path]:
    """The models the rows' ``make`` steps train (a ``fit``'s run directory) and what is made from one of them (a
    ``quantize`` or ``prune`` whose ``--ckpt_path`` is one: its ``--output_dir``; ``step_output``): what ``seeds``
    remakes once per seed.  Anything else (the teacher, an int8 of the teacher) is one model whatever the seed."""
    out: set[Path] = set()
    for row in rows:
        for argv in make_steps(row):
            made = step_output(argv)
            if made is not None and (argv[0] == "fit" or names_output(step_flags(argv).get("--ckpt_path", ""), out)):
                out.add(made)
    return out


def with_seed(row: CompressionRow, seed: int, outputs: set[Path]) -> CompressionRow:
    """``row`` as seed ``seed`` makes it: every path of ``outputs`` it names (its model, a step's option) gets
    ``-seed<N>``, and every ``fit`` runs with ``--seed_everything N`` under that run name; a row not made from
    ``outputs`` is returned as it is."""
    from dataclasses import replace

    def tag(value: str) -> str:
        return f"{value.rstrip('/')}-seed{seed}" if names_output(value, outputs) else value

    if not names_output(row.model, outputs):
        return row
    steps = []
    for argv in make_steps(row):
        if argv[0] == "fit":
            flags = step_flags(argv)
            kept = [w for flag, value in flags.items() if flag not in ("--run_name", "--seed_everything")
                    for w in (flag, tag(value))]
            argv = ["fit", *kept, "--seed_everything", str(seed), "--run_name", f"{fit_run_dir(argv).name}-seed{seed}"]
        else:
            argv = [argv[0], *(tag(w) for w in argv[1:])]
        steps.append(argv)
    return replace(row, model=tag(row.model), make=" && ".join(f"python main.py {shlex.join(a)}" for a in steps))


def names_output(ref: str, outputs: set[Path]) -> Optional[Path]:
    """The one of ``outputs`` that ``ref`` (a row's model or a step's path) names wherever ``locate`` would look for
    it: as given, or under the runs directory (by its path or its last name: ``teacher.resolve_teacher``); else
    None."""
    if not ref:
        return None
    path = Path(ref).expanduser()
    candidates = [path] if path.is_absolute() else [path, runs_root() / path, runs_root() / path.name]
    return next((absolute(c) for c in candidates if absolute(c) in outputs), None)


def measure(made: list[CompressionRow], records: list[dict], labels: list[str], metric: str, max_length: int,
            batch_size: int, repeats: int, what: str) -> tuple[list[dict], dict]:
    """Each row (the teacher first) loaded, counted, scored on ``records`` and timed with the others in turn
    (``alternating_medians``): the table's rows, and per row whether each record was right."""
    from ptm_app.compression.quantize import alternating_medians, latency_batches, timed_call

    texts = [r["text"] for r in records[:32]]
    measured, calls, correct, notes = [], {}, {}, set()
    for row in made:
        loaded, rule = load_row(row, locate(row))
        note = truncation_note(loaded.tokenizer, records, max_length, what)
        if note and note not in notes:  # rows with the teacher's tokenizer say the same
            print(note, file=sys.stderr)
            notes.add(note)
        extra = [loaded.module.exits] if rule is not None else []
        params, nonzero = counts([loaded.model, *extra])
        value, exit_layer, correct[row.name] = scored(loaded, rule, records, metric, labels, max_length, batch_size)
        measured.append({"model": row.name, "params": params, "nonzero_params": nonzero,
                         "block_sparsity": block_sparsity(loaded.model),
                         "size_mb": size_mb(loaded, extra), "metric": value, "exit_layer": exit_layer})
        calls[row.name] = {b: timed_call(lambda enc: forward_call(loaded, rule, enc), inputs)
                           for b, inputs in latency_batches(loaded.tokenizer, texts, max_length).items()}
    if len(calls) != len(made):
        raise PtmError("compression rows need distinct names; rename the repeated one")
    with torch.inference_mode():
        times = alternating_medians(calls, repeats)
    for r in measured:
        r.update(latency_b1_ms=times[r["model"]]["batch_1"], latency_b32_ms=times[r["model"]]["batch_32"])
    return with_ratios(measured), correct


def with_ratios(measured: list[dict]) -> list[dict]:
    """Speed-ups and metric % against the first row (the teacher)."""
    base = measured[0]
    for r in measured:
        r.update(speedup_b1=round(base["latency_b1_ms"] / r["latency_b1_ms"], 3),
                 speedup_b32=round(base["latency_b32_ms"] / r["latency_b32_ms"], 3),
                 metric_pct_of_teacher=round(100.0 * r["metric"] / base["metric"], 2) if base["metric"] else None)
    return measured


def over_the_seeds(per_seed: dict[int, list[dict]], by_seed: dict[int, list[CompressionRow]]) \
        -> tuple[list[dict], dict[str, list[float]]]:
    """One row per report row from its seeds' measurements: the mean metric, counts and exit layer, the median
    latency, ``seeds`` (how many models it is; 1 for the teacher and what is made from it) and
    ``metric_over_seeds`` (``stats.summarize``); and per seeded row its metric per seed."""
    import statistics

    from ptm_app.experiments.stats import summarize

    seeds = list(per_seed)
    rows, values = [], {}
    for i, first in enumerate(per_seed[seeds[0]]):
        models = {by_seed[s][i].model for s in seeds}
        runs = [per_seed[s][i] for s in seeds] if len(models) > 1 else [first]
        metric = [r["metric"] for r in runs]
        row = {"model": first["model"], "seeds": len(runs), "metric_over_seeds": summarize(metric).text()
               if len(runs) > 1 else "one model (not seeded)"}
        for key in ("params", "nonzero_params", "size_mb", "block_sparsity", "exit_layer", "metric"):
            got = [r[key] for r in runs if r[key] is not None]
            row[key] = (round(statistics.fmean(got), 4) if key != "metric" else statistics.fmean(got)) if got else None
        for key in ("latency_b1_ms", "latency_b32_ms"):
            row[key] = statistics.median(r[key] for r in runs)
        if len(runs) > 1:
            values[row["model"]] = metric
        rows.append(row)
    return with_ratios(rows), values


def compress_report(teacher: CompressionRow, rows: list[CompressionRow], source: str, split: str = "test",
                    examples: Optional[int] = None, metric: Literal["accuracy", "f1_macro"] = "accuracy",
                    max_length: int = 128, batch_size: int = 32, repeats: int = 20, seed: int = 0,
                    make_missing: bool = False, run_name: str = "compress_report",
                    output_dir: Optional[str] = None, targets: Optional[list[CompressionTarget]] = None,
                    readme: Optional[str] = None, seeds: Optional[list[int]] = None) -> Path:
    """The compression table (Qiu et al. 2020, Table 3) measured from trained models.

    Args:
        teacher: the row every other is compared with (name, model, make).
        rows: the compressed models (name, model, make, and exit for an early-exit run).
        source: the prepared classification set (e.g. bbc) whose split scores every row.
        split: the split scored.
        examples: records sampled from the split (null = all); every row gets the same ones.
        metric: accuracy or f1_macro (macro F1 over the classes that occur).
        max_length: tokens per text (longer texts are truncated), for scoring and timing.
        batch_size: texts per forward when scoring.
        repeats: timed rounds per batch size (every row once per round); the median is reported.
        seed: the sample of the split.
        make_missing: run the make commands of missing rows first (in order) instead of stopping.
        run_name: output directory name under the runs root (checkpoints/).
        output_dir: output directory (overrides run_name).
        targets: conditions on rows judged from the measurements (``CompressionTarget``).
        readme: also put both tables into this file (e.g. README.md), between the lines
            ``<!-- <run_name>:start -->`` and ``<!-- <run_name>:end -->``, so the document's numbers are generated.
        seeds: train every row whose ``make`` fits a model (and what is quantized or pruned from it) once per seed
            (``with_seed``: ``--seed_everything N``, run names ``-seed<N>``); the teacher and what is made from it
            are one model.  Each seed's rows are scored and timed together; the table gives per row the mean metric
            (``metric_over_seeds``: mean ± std [95 % t interval]), the median latency over the seeds and the
            speed-ups from those; a ``beats`` target between two seeded rows is judged by their paired difference.
    """
    teacher, rows = as_row(teacher), [as_row(r) for r in rows]
    targets = [as_target(t) for t in targets or []]
    resolved = {**dict(locals()), "teacher": asdict(teacher), "rows": [asdict(r) for r in rows],
                "targets": [asdict(t) for t in targets]}
    from ptm_app.analysis.figures import save_png
    from ptm_app.analysis.representations import sample_indices
    from ptm_app.analysis.tables import write_table
    from ptm_app.compression.quantize import eval_records

    if repeats < 1:
        raise PtmError(f"repeats: {repeats}; time at least 1 round")
    everything = [teacher, *rows]
    check_targets(targets, [row.name for row in everything])
    if seeds is not None:
        from ptm_app.experiments.stats import check_seeds

        seeds = check_seeds(seeds, "compress-report: seeds")
        outputs = seeded_outputs(rows)
        by_seed = {s: [teacher, *(with_seed(r, s, outputs) for r in rows)] for s in seeds}
    else:
        by_seed = {None: everything}
    out = Path(output_dir) if output_dir else run_path(run_name)
    if readme:
        require_markers(readme, out.name)
    for row in everything:
        if row.make:
            make_steps(row)  # a malformed command is refused before anything runs
    to_make = list({(r.model, str(r.make)): r for made in by_seed.values() for r in made}.values())
    fingerprints = recipe_fingerprints(to_make)
    for row in to_make:
        if make_missing and current_model(row, fingerprints) is None and row.make:
            run_make(row, fingerprints)
    missing = list({(r.name, r.model): r for made in by_seed.values() for r in made
                    if current_model(r, fingerprints) is None}.values())
    if missing:
        raise PtmError(missing_line(missing))
    records = eval_records(source, split, 0)
    records = [records[i] for i in sample_indices(len(records), examples, seed)]
    if not records:
        raise PtmError(f"{source}/{split} has no records to score; choose another split")
    labels = sorted({str(r["label"]) for r in records})
    per_seed = {s: measure(made, records, labels, metric, max_length, batch_size, repeats, f"{source}/{split}")
                for s, made in by_seed.items()}
    measured, correct = per_seed[next(iter(per_seed))]
    over_seeds = None
    if seeds:
        measured, over_seeds = over_the_seeds({s: m for s, (m, _) in per_seed.items()}, by_seed)
    write_json(out / "settings.json", {**resolved, "threads": torch.get_num_threads(), "examples_scored":
                                       len(records), "labels": labels,
                                       "resolved": {f"{row.name}" + ("" if s is None else f" (seed {s})"):
                                                    locate(row) for s, made in by_seed.items() for row in made}})
    title = (f"Compression on {source} ({split}, {len(records)} examples, {metric}); CPU latency: median of "
             f"{repeats} rounds, {torch.get_num_threads()} threads, max_length {max_length}")
    if seeds:
        title += f"; seeds {seeds}: rows trained per seed show the mean (metric_over_seeds: ± std [95 % t interval])"
    md = write_table(measured, COLUMNS + (["seeds", "metric_over_seeds"] if seeds else []), out / "compression", title)
    save_png(draw(measured), out / "compression.png")
    print(md.read_text(encoding="utf-8"), end="")
    tables = [md]
    if targets:
        tables.append(write_table(judge(targets, measured, correct, over_seeds), ["row", "target", "measured", "met"],
                                  out / "compression_targets", f"Targets ({source})"))
        print("\n" + tables[-1].read_text(encoding="utf-8"), end="")
    if readme:
        write_between_markers(readme, out.name, "\n".join(t.read_text(encoding="utf-8") for t in tables))
    return out
