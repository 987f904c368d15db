"""GPU smoke (``make gpu-check``, issue 24): every recipe a GPU user would start with, a few steps each, one line each.

``python -m benchmarks.gpu_check`` runs, each through ``main.py`` in its own subprocess and its own runs directory
(``PTM_RUNS_DIR`` under a temporary directory), with ``--trainer.accelerator gpu --trainer.precision auto
--trainer.devices 1`` and a few steps (one validation batch at the last step):

- every pre-training recipe in ``configs/pretrain/`` (``pretrain/<name>``);
- every strategy preset in ``configs/strategy/`` and every overlay in ``configs/memory/`` (``torch.compile``,
  low memory), each layered on ``configs/pretrain/bert_mlm_bbc.yaml`` at one device (``strategy/<name>``,
  ``memory/<name>``);
- ``chain``: ``fit`` of ``bert_mlm_bbc`` → ``export`` → ``fit`` of ``configs/demo/demo_mlm_full_bbc.yaml`` from the export
  → ``predict --text``.

It prints one line per check (name, ``ok``/``FAIL``, seconds, the precision the run chose, and on failure the
error's one line), then a summary, and exits 1 if any failed.  Each check's full output goes to
``<out>/logs/<name>.log`` and the lines to ``<out>/gpu_check.json``.  ``--accelerator cpu`` runs the same checks on
the CPU (the tests use it on a subset, ``--only``); with ``accelerator gpu`` and no CUDA device it says so in one
line and runs nothing.
"""
from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
CONFIGS = ROOT / "configs"
OVERLAY_BASE = CONFIGS / "pretrain" / "bert_mlm_bbc.yaml"  # a small recipe for the strategy and memory overlays
CHAIN_PRETRAIN = OVERLAY_BASE  # from scratch: the chain needs no pretrained weights
CHAIN_FINETUNE = CONFIGS / "demo" / "demo_mlm_full_bbc.yaml"
CHAIN_TEXT = "Shares in the bank rose after it reported record profits for the year."
FEW_DOCUMENTS = 64  # documents a pre-training run tokenizes (PretrainDataModule.limit_documents)
_PRECISION = re.compile(r"^model: .*?\bprecision ([\w-]+)", re.MULTILINE)  # RunConsole's model line
_ERROR = re.compile(r"^(error: .+|\w+(\.\w+)*(Error|Exception|Interrupt)\b.*)$")
RUNNING: set = set()  # the commands running now (their process groups end with this process: ``_stop``)
STOPPING = threading.Event()


@dataclass
class Check:
    """One line of the report: ``main.py`` command lines run in order (each after the previous succeeded)."""

    name: str
    commands: list[list[str]]
    needs: str | None = None  # an optional package the check needs (an extra): skipped, not failed, without it


@dataclass
class Result:
    name: str
    ok: bool
    seconds: float
    precision: str | None = None
    reason: str | None = None
    commands: list[str] = field(default_factory=list)
    log: str | None = None
    skipped: bool = False

    @property
    def status(self) -> str:
        return "skip" if self.skipped else "ok" if self.ok else "FAIL"

    def line(self, width: int = 28) -> str:
        text = f"{self.name:<{width}} {self.status:<4} {self.seconds:7.1f} s  precision {self.precision or '?'}"
        return text if self.ok and not self.skipped else f"{text}  {self.reason}"


def _data_class(config: Path) -> str:
    return str((yaml.safe_load(config.read_text()).get("data") or {}).get("class_path", ""))


def fit_args(configs: list[Path], run_name: str, args) -> list[str]:
    """``fit`` of ``configs`` (layered in order) for ``args.steps`` steps on ``args.accelerator``, one device."""
    steps = str(args.steps)
    argv = ["fit", *[a for c in configs for a in ("--config", str(c))], "--run_name", run_name,
            "--trainer.accelerator", args.accelerator, "--trainer.precision", args.precision, "--trainer.devices", "1",
            "--trainer.max_steps", steps, "--trainer.max_epochs", "1", "--trainer.val_check_interval", steps,
            "--trainer.limit_val_batches", "1", "--trainer.limit_test_batches", "1",
            "--trainer.num_sanity_val_steps", "0", "--trainer.log_every_n_steps", "1",
            "--trainer.enable_progress_bar", "false"]
    if _data_class(configs[0]).endswith("PretrainDataModule"):
        argv += ["--data.init_args.limit_documents", str(FEW_DOCUMENTS)]
    return argv


def all_checks(args) -> list[Check]:
    """Every check, in report order: the pre-training recipes, the strategies, the memory overlays, the chain."""
    checks = [Check(f"pretrain/{c.stem}", [fit_args([c], c.stem, args)])
              for c in sorted((CONFIGS / "pretrain").glob("*.yaml"))]
    for kind in ("strategy", "memory"):
        checks += [Check(f"{kind}/{c.stem}", [fit_args([OVERLAY_BASE, c], f"{kind}_{c.stem}", args)],
                         needs="deepspeed" if "deepspeed" in c.read_text().lower() else None)
                   for c in sorted((CONFIGS / kind).glob("*.yaml"))]
    runs = "{runs}"  # filled in per check (its own runs directory)
    export = f"{runs}/chain_mlm/export"
    checks.append(Check("chain", [
        fit_args([CHAIN_PRETRAIN], "chain_mlm", args),
        ["export", "--ckpt_path", f"{runs}/chain_mlm", "--output_dir", export],
        fit_args([CHAIN_FINETUNE], "chain_finetune", args) + ["--model.init_args.backbone", export,
                                                               "--data.init_args.tokenizer.pretrained", export],
        ["predict", "--ckpt_path", f"{runs}/chain_finetune", "--text", CHAIN_TEXT],
    ]))
    return checks


def select(checks: list[Check], patterns: list[str] | None) -> list[Check]:
    """The checks whose name matches one of ``patterns`` (shell-style: ``pretrain/*``, ``chain``)."""
    if not patterns:
        return checks
    chosen = [c for c in checks if any(fnmatch.fnmatchcase(c.name, p) for p in patterns)]
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(c.name, p) for c in checks)]
    if unmatched:
        raise SystemExit(f"gpu-check: --only {' '.join(unmatched)} matches no check; "
                         f"the checks are: {' '.join(c.name for c in checks)}")
    return chosen


def error_line(output: str) -> str:
    """The one line that says why a run failed: ptm_app's ``error: ...`` line, else the exception line of a
    traceback, else the last line printed."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        if _ERROR.match(line):
            return line
    return lines[-1] if lines else "no output"


def failure(output: str, returncode: int, command: str) -> str:
    """The reason of a failed command: its error line and exit status (or the signal that killed it)."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        killed = f"killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
        return f"{killed} during {command}; last line: {error_line(output)}"
    return f"{error_line(output)} (exit {returncode}, {command})"


def run_check(check: Check, work: Path, logs: Path, env: dict, timeout: float, own_cache: bool = False) -> Result:
    """Run the check's commands in order in a fresh runs directory; the first failure ends it.  ``own_cache``: a
    cache directory of its own too (``PTM_CACHE_DIR``: tokenizers, tokenized corpora, the peak probe), for checks
    run at the same time, which would otherwise build the same cache entries at once and probe a shared GPU's peak."""
    if check.needs and importlib.util.find_spec(check.needs) is None:
        return Result(check.name, True, 0.0, None, f"{check.needs} is not installed (the {check.needs} extra: "
                      f"pip install -c constraints-cpu.txt -e '.[{check.needs}]')", skipped=True)
    slug = check.name.replace("/", "_")
    runs = work / slug
    runs.mkdir(parents=True, exist_ok=True)
    child_env = {**env, "PTM_RUNS_DIR": str(runs), **({"PTM_CACHE_DIR": str(runs / "cache")} if own_cache else {})}
    log_path = logs / f"{slug}.log"
    start, precision, commands = time.time(), None, []
    with open(log_path, "w", encoding="utf-8") as log:
        for argv in check.commands:
            if STOPPING.is_set():
                return Result(check.name, False, time.time() - start, precision,
                              "stopped (gpu-check was cut short)", commands, str(log_path))
            argv = [a.replace("{runs}", str(runs)) for a in argv]
            commands.append(" ".join(["python main.py", *argv]))
            log.write(f"$ {commands[-1]}\n")
            log.flush()
            left = timeout - (time.time() - start)
            proc = subprocess.Popen([sys.executable, "main.py", *argv], cwd=ROOT, env=child_env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True)  # its own process group: a timeout ends all of it
            RUNNING.add(proc)
            try:
                output, _ = proc.communicate(timeout=max(left, 1))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                output, _ = proc.communicate()
                log.write(output)
                return Result(check.name, False, time.time() - start, precision,
                              f"timed out after {timeout:.0f} s in: {commands[-1]}", commands, str(log_path))
            finally:
                RUNNING.discard(proc)
            log.write(output)
            log.flush()
            found = _PRECISION.findall(output)
            precision = found[0] if found and precision is None else precision
            if proc.returncode != 0:
                reason = (f"stopped (gpu-check was cut short) during {argv[0]}" if STOPPING.is_set()
                          else failure(output, proc.returncode, argv[0]))
                return Result(check.name, False, time.time() - start, precision, reason, commands, str(log_path))
    return Result(check.name, True, time.time() - start, precision, None, commands, str(log_path))


def _stop(signum, frame) -> None:
    """SIGTERM (``timeout``, a scheduler): end the running commands' process groups, start no more, exit."""
    STOPPING.set()
    for proc in list(RUNNING):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    raise SystemExit(128 + signum)


def cuda_missing(accelerator: str) -> str | None:
    """The one line to print when ``accelerator`` asks for a GPU this machine does not have."""
    if accelerator not in ("gpu", "cuda"):
        return None
    import torch

    if torch.cuda.is_available():
        return None
    return f"gpu-check: no CUDA GPU here ({no_cuda_reason()}); run it on a machine with one, or pass --accelerator cpu"


def no_cuda_reason() -> str:
    """Why torch sees no CUDA device: a CPU build of torch (``make setup`` installs one), or no GPU / driver."""
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build: install a CUDA build of torch"
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no GPU or driver"


def markdown(report: dict) -> str:
    """The report as the ``gpu-check`` section of ``benchmarks/README.md``: the device, then one row per check."""
    lines = [f"Run by `make gpu-check` on {report['date']}: **{report['device']}**, torch {report['torch']}, "
             f"accelerator {report['accelerator']}, precision {report['precision']}, {report['steps']} steps each.  "
             f"{report['summary'].removeprefix('gpu-check: ')}.", "",
             "| check | result | seconds | precision chosen | reason |", "|---|---|---|---|---|"]
    for r in report["results"]:
        result = Result(**r)
        reason = (result.reason or "").replace("|", "\\|")
        lines.append(f"| {result.name} | {result.status} | {result.seconds:.1f} | {result.precision or '-'} | "
                     f"{reason if result.status != 'ok' else ''} |")
    return "\n".join(lines) + "\n"


def write_readme(report: dict, readme: Path = HERE / "README.md") -> None:
    from ptm_app.paths import write_between_markers

    if not write_between_markers(readme, "gpu-check", markdown(report)):
        raise SystemExit(f"gpu-check: {readme} has no <!-- gpu-check:start --> / <!-- gpu-check:end --> markers")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--accelerator", default="gpu", help="trainer.accelerator of every run (default gpu)")
    parser.add_argument("--precision", default="auto", help="trainer.precision of every run (default auto)")
    parser.add_argument("--steps", type=int, default=3, help="training steps of every fit (default 3)")
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        help="checks whose name matches (shell patterns: pretrain/electra_rtd_brown 'strategy/*' chain)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="checks run at the same time (default 1), each then with a cache directory of its own")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per check (default 900)")
    parser.add_argument("--out", type=Path, default=ROOT / "checkpoints" / "gpu_check",
                        help="where gpu_check.json and logs/<check>.log go (default checkpoints/gpu_check)")
    parser.add_argument("--keep_runs", action="store_true", help="keep the runs' directories (under --out/runs)")
    parser.add_argument("--list", action="store_true", help="print the checks' names and exit")
    parser.add_argument("--readme", type=Path, metavar="GPU_CHECK.JSON",
                        help="only write that report (e.g. one made on a lent GPU machine) into the gpu-check "
                             "section of benchmarks/README.md")
    args = parser.parse_args(argv)
    if args.readme:
        write_readme(json.loads(args.readme.read_text()))
        return 0
    if args.steps < 1 or args.jobs < 1:
        parser.error("--steps and --jobs must be at least 1")
    checks = select(all_checks(args), args.only)
    if args.list:
        print("\n".join(c.name for c in checks))
        return 0
    missing = cuda_missing(args.accelerator)
    if missing:
        print(missing, flush=True)
        return 1
    out = args.out.resolve()
    logs = out / "logs"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    work = out / "runs" if args.keep_runs else Path(tempfile.mkdtemp(prefix="gpu_check_"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    if args.jobs > 1 and "OMP_NUM_THREADS" not in os.environ:  # share the cores between the runs at the same time
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // args.jobs))
    width = max(len(c.name) for c in checks) + 1
    print(f"gpu-check: {len(checks)} checks, accelerator {args.accelerator}, precision {args.precision}, "
          f"{args.steps} steps each, {args.jobs} at a time; logs in {logs}", flush=True)
    started = time.time()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop)
    results, stopped, futures = [], None, []
    try:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            # the longest first (the chain's four commands, compilation), so the others fill in around them
            first = sorted(checks, key=lambda c: not (c.name == "chain" or c.name.startswith("memory/")))
            submitted = {c.name: pool.submit(run_check, c, work, logs, env, args.timeout, args.jobs > 1)
                         for c in first}
            futures = [submitted[c.name] for c in checks]
            for future in futures:  # report order: a later check that finished first waits for its line
                results.append(future.result())
                print(results[-1].line(width), flush=True)
    except SystemExit as exc:  # SIGTERM (_stop): the pool has waited for its threads; report every check's end
        stopped = exc.code
        for future in futures[len(results):]:
            results.append(future.result())
            print(results[-1].line(width), flush=True)
    finally:
        if not args.keep_runs:
            shutil.rmtree(work, ignore_errors=True)
    failed = [r for r in results if not r.ok]
    skipped = [r for r in results if r.skipped]
    precisions = sorted({r.precision for r in results if r.precision})
    summary = (f"gpu-check: {len(results) - len(failed) - len(skipped)} of {len(results)} ok, {len(failed)} failed"
               + (f" ({', '.join(r.name for r in failed)})" if failed else "")
               + (f", {len(skipped)} skipped" if skipped else "")
               + f"; precision chosen: {', '.join(precisions) or '?'}; {time.time() - started:.0f} s"
               + ("; STOPPED by a signal (the checks it cut short are FAIL 'stopped')" if stopped else ""))
    print(summary, flush=True)
    import torch

    device = torch.cuda.get_device_name(0) if args.accelerator in ("gpu", "cuda") else "cpu"
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "device": device, "torch": torch.__version__,
              "accelerator": args.accelerator, "precision": args.precision, "steps": args.steps,
              "summary": summary, "results": [asdict(r) for r in results]}
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    if device != "cpu" and not args.only and not stopped and args.out.resolve() == (ROOT / "checkpoints" / "gpu_check").resolve():
        write_readme(report)  # the whole check on a GPU, as make gpu-check runs it
    return stopped or (1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main())
