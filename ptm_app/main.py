"""Dispatch: data/export subcommands are plain functions; fit/validate/test/predict go to LightningCLI."""
from __future__ import annotations

import os
import sys


USAGE = """usage: python main.py COMMAND [options]

commands:
  fit | validate | test | predict   LightningCLI runs: --config FILE.yaml [--key value ...] [--ckpt_path last|best|FILE]
  data prepare [NAME ...] [--force]  fetch, verify and convert the real datasets and models (data list: status)
  export --ckpt_path RUN_OR_CKPT --output_dir DIR
                                     write a transformers save_pretrained directory with the tokenizer
  report RUN_DIR_OR_GLOB ... [--output results]
                                     results table (.md + .csv) from the runs' summary.json files
  sweep PLAN.yaml [--only GLOB ...] [--list]
                                     run a grid of configs (fit + test), then its results table

'python main.py fit --help' lists every config key; see README.md for the config catalogue."""


def main(argv: list[str]) -> int:
    from ptm_app.errors import PtmError

    command = argv[0] if argv else "--help"
    if command in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    try:
        if command == "data":
            from ptm_app.data.prepare import data_command

            return data_command(argv[1:])
        if command == "export":
            from ptm_app.export import export_command

            return export_command(argv[1:])
        if command == "report":
            from ptm_app.report import report_command

            return report_command(argv[1:])
        if command == "sweep":
            from ptm_app.sweep import sweep_command

            return sweep_command(argv[1:])
        from ptm_app.cli import run_lightning

        return run_lightning(argv)
    except _sigterm() as exc:  # Lightning stops on SIGTERM after LastCheckpoint wrote last.ckpt
        print("stopped by SIGTERM; last.ckpt is written, resume with --ckpt_path last", file=sys.stderr)
        return 143
    except PtmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:  # config errors from jsonargparse: one line, no traceback
        from jsonargparse import ArgumentError

        wrapped = PtmError.last
        if wrapped is not None and str(wrapped) in str(exc).replace("\n", " "):
            print(f"error: {wrapped}", file=sys.stderr)  # our error, raised while the config was instantiated
            return wrapped.exit_code
        if isinstance(exc, ArgumentError):
            from ptm_app.config_errors import one_line

            print(f"error: {one_line(exc)}", file=sys.stderr)
            return 2
        if _lightning_config_error(exc):
            message = " ".join(str(exc).split())
            print(f"error: trainer settings: {message}", file=sys.stderr)
            return 2
        raise


def _lightning_config_error(exc: BaseException) -> bool:
    """A ValueError / MisconfigurationException raised inside Lightning itself: a settings clash such as
    ``val_check_interval`` longer than the epoch, not a bug of ours."""
    if "lightning" not in sys.modules:
        return False
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    if not isinstance(exc, (ValueError, MisconfigurationException)):
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}lightning{os.sep}" in tb.tb_frame.f_code.co_filename



def _sigterm() -> type[BaseException]:
    if "lightning" not in sys.modules:
        return _Never
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    return SIGTERMException


class _Never(BaseException):
    """Placeholder exception type that is never raised."""
