"""The command table: every subcommand is a typed function (litgpt's ``__main__``), parsed by jsonargparse from its
signature and docstring, so ``--help`` (top level and per command) is generated and a bad option is one line.
fit, validate, test and predict ``--config`` are LightningCLI runs (``training.cli.run_lightning``).

A command's parameters are ``--options`` (``--key value``; a list takes several values or repeats, ``--text a
--text b``; a bool may stand alone, ``--normalize``); the one named ``positional`` also takes the leading bare values
(``report RUN ...``).  Every command takes ``--config FILE.yaml`` with any of its settings.  A function's int result
is the exit status; a returned path is printed as ``wrote PATH``.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Union, get_args, get_origin


@dataclass(frozen=True)
class Command:
    """One row of the table: ``target`` is ``module:function``; ``positional`` the parameter the leading bare values
    fill; ``trust`` adds ``--trust_checkpoint`` (held for every checkpoint the command reads) and keeps the known
    third-party notices off the console, as a training run does; ``extra``: the optional package the command needs
    and the ``pyproject.toml`` extra that installs it."""

    target: str
    positional: Optional[str] = None
    trust: bool = False
    extra: Optional[tuple[str, str]] = None

    def function(self) -> Callable[..., Any]:
        import importlib
        import importlib.util

        module, _, name = self.target.partition(":")
        if self.extra is not None and importlib.util.find_spec(self.extra[0]) is None:
            from ptm_app.errors import PtmError

            raise PtmError(f"{name} needs the {self.extra[1]} extra: pip install -c constraints-cpu.txt "
                           f"-e '.[{self.extra[1]}]'")
        return getattr(importlib.import_module(module), name)


LIGHTNING = ("fit", "validate", "test", "predict")  # LightningCLI: --config FILE.yaml [--key value ...]

COMMANDS: dict[str, Union[Command, dict[str, Command]]] = {
    "data": {"prepare": Command("ptm_app.data.prepare:prepare", positional="names"),
             "list": Command("ptm_app.data.prepare:list_sources")},
    "export": Command("ptm_app.inference.export_command:export_command"),
    "predict": Command("ptm_app.inference.predict:predict"),  # given texts; with --config: LightningCLI's
    "embed": Command("ptm_app.inference.embed:embed"),
    "generate": Command("ptm_app.inference.generate:generate"),
    "serve": Command("ptm_app.inference.serve:serve", extra=("litserve", "serve")),
    "quantize": Command("ptm_app.inference.compress_commands:quantize"),
    "prune": Command("ptm_app.inference.compress_commands:prune"),
    "report": Command("ptm_app.experiments.report:report", positional="runs"),
    "sweep": Command("ptm_app.experiments.sweep:sweep", positional="plan"),
    "knowledge-report": Command("ptm_app.experiments.knowledge_report:knowledge_report", positional="plan"),
    "translation-report": Command("ptm_app.experiments.translation_report:translation_report", positional="plan"),
    "taxonomy-report": Command("ptm_app.experiments.taxonomy:taxonomy_report", positional="plan"),
    "multimodal": Command("ptm_app.experiments.multimodal_report:multimodal", positional="plan"),
    "crosslingual": Command("ptm_app.experiments.crosslingual:crosslingual", trust=True),
    "compress-report": Command("ptm_app.experiments.compression_report:compress_report", trust=True),
    "configs": Command("ptm_app.experiments.config_catalogue:configs"),
    "plot": Command("ptm_app.analysis.plot:plot", positional="runs"),
    "probe": Command("ptm_app.analysis.probing:probe", trust=True),
    "contextuality": Command("ptm_app.analysis.contextuality:contextuality", trust=True),
    "attention": Command("ptm_app.analysis.attention:attention", trust=True),
    "knowledge-probe": Command("ptm_app.analysis.knowledge_probe:knowledge_probe", trust=True),
    "robustness": Command("ptm_app.analysis.robustness:robustness", trust=True),
    "attack": Command("ptm_app.analysis.attack:attack", trust=True),
}

DESCRIPTION = ("ptm_app: pre-train, adapt, compress, analyse and serve language models.  'python main.py COMMAND "
               "--help' lists a command's options; 'python main.py fit --help' every config key.")


def main(argv: list[str]) -> int:
    from ptm_app.errors import guarded

    if not argv or argv[0] in ("-h", "--help", "help"):
        print_help()
        return 0
    name_cpu_for_deepspeed()
    return guarded(_dispatch, argv)


def name_cpu_for_deepspeed() -> None:
    """On a machine without CUDA, ``DS_ACCELERATOR=cpu`` (as the DeepSpeed strategy sets it): DeepSpeed, which
    transformers and accelerate import when it is installed, otherwise prints "Setting accelerator to CPU ..." to
    the console of every command that saves or loads a model."""
    import os

    if "DS_ACCELERATOR" not in os.environ:
        import torch

        if not torch.cuda.is_available():
            os.environ["DS_ACCELERATOR"] = "cpu"


def _dispatch(argv: list[str]) -> int:
    from ptm_app.checkpoint_io.module_classes import check_class_paths
    from ptm_app.errors import check_config_files

    name, rest = argv[0], argv[1:]
    for path, settings in check_config_files(rest).items():
        check_class_paths(settings, path)
    if name in LIGHTNING and not (name == "predict" and given_texts(rest)):
        from ptm_app.training.cli import run_lightning

        return run_lightning(argv)
    entry = COMMANDS.get(name)
    if isinstance(entry, dict):  # a group: data prepare | list
        if not rest or rest[0] in ("-h", "--help"):
            return _print_parser(_group_parser(name, entry))
        if rest[0] not in entry:
            _unknown(rest[0], entry, f"{name} command", f"python main.py {name} --help")
        name, entry, rest = f"{name} {rest[0]}", entry[rest[0]], rest[1:]
    if entry is None:
        _unknown(name, {**dict.fromkeys(LIGHTNING), **COMMANDS}, "command", "python main.py --help")
    return run(name, entry, rest)


def given_texts(argv: list[str]) -> bool:
    """``predict`` on given inputs (``--text`` / ``--input`` / ``--question``, or ``--ckpt_path`` or ``--help``
    without ``--config``): ptm_app's own command, not LightningCLI's ``predict --config`` (the data's test split)."""
    names = {a.split("=", 1)[0] for a in argv}
    if names & {"--text", "--input", "--question", "--image"}:
        return True
    return not names & {"--config", "-c"} and bool(names & {"--ckpt_path", "--help", "-h"})


def run(name: str, entry: Command, argv: list[str]) -> int:
    """Parse ``argv`` into ``entry``'s function's arguments and call it."""
    from jsonargparse import ArgumentError

    from ptm_app.errors import option_error
    from ptm_app.errors import PtmError

    function = entry.function()
    parser = command_parser(name, entry, function)
    try:
        namespace = parser.parse_args(command_argv(function, argv, entry.positional))
    except ArgumentError as exc:
        raise PtmError(option_error(exc, name, parameter_kinds(function), entry.positional)) from None
    except SystemExit as exc:  # --help printed it
        return int(exc.code or 0)
    settings = namespace.as_dict()
    for key in ("config", "__path__"):
        settings.pop(key, None)
    if not entry.trust:
        return _result(function(**settings))
    from ptm_app.checkpoint_io.reading import trusting
    from ptm_app.training.console import quiet_third_party

    trust = settings.pop("trust_checkpoint", False)
    quiet_third_party()
    with trusting(trust):
        return _result(function(**settings))


def _result(value: Any) -> int:
    if isinstance(value, Path):
        print(f"wrote {value}")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def command_parser(name: str, entry: Command, function: Optional[Callable[..., Any]] = None):
    """The jsonargparse parser of one command: ``--config`` and the function's parameters, help from its docstring."""
    from jsonargparse import ArgumentParser

    function = function or entry.function()
    lead = f" [{entry.positional.upper()} ...]" if entry.positional else ""
    parser = ArgumentParser(prog=f"main.py {name}", description=f"{_summary(function)}.", exit_on_error=False,
                            default_env=False,
                            usage=f"python main.py {name}{lead} [--config FILE.yaml] [--option value ...]")
    parser.add_argument("--config", action="config", help="a YAML file with any of the options below")
    if entry.trust:
        parser.add_argument("--trust_checkpoint", type=bool, default=False,
                            help="read checkpoints you made yourself even if they hold more than plain data or name "
                                 "a module class outside ptm_app (their loading can run code)")
    parser.add_function_arguments(function, as_positional=False, fail_untyped=True, as_group=False)
    return parser


def _group_parser(name: str, group: dict[str, Command]):
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(prog=f"main.py {name}", exit_on_error=False)
    sub = parser.add_subcommands(required=True, dest="subcommand")
    for key, entry in group.items():
        sub.add_subcommand(key, ArgumentParser(), help=_entry_summary(entry))
    return parser


LIGHTNING_HELP = {"fit": "Train a model", "validate": "One evaluation epoch over the validation set",
                  "test": "One evaluation epoch over the test set",
                  "predict": "Predictions for the data's predict split"}


def top_parser():
    """The top-level parser: one subcommand per row of the table, its help the function's first docstring line, read
    from the source (``_entry_summary``) so that ``--help`` imports no command module."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(prog="main.py", description=DESCRIPTION, exit_on_error=False,
                            usage="python main.py COMMAND [--config FILE.yaml] [--option value ...]")
    sub = parser.add_subcommands(required=True, dest="command")
    for name in LIGHTNING:
        sub.add_subcommand(name, ArgumentParser(), help=f"{LIGHTNING_HELP[name]} (LightningCLI: --config FILE.yaml "
                                                        f"[--key value ...] [--ckpt_path last|best|FILE])")
    for name, entry in COMMANDS.items():
        if name in LIGHTNING:
            continue
        if isinstance(entry, dict):
            lines = "; ".join(f"{key}: {_entry_summary(e)}" for key, e in entry.items())
            sub.add_subcommand(name, ArgumentParser(), help=f"{' | '.join(entry)}: {lines}")
        else:
            sub.add_subcommand(name, ArgumentParser(), help=_entry_summary(entry))
    return parser


def _entry_summary(entry: Command) -> str:
    """The first paragraph of the function's docstring, read from its module's source without importing it."""
    import ast

    module, _, name = entry.target.partition(":")
    source = Path(__file__).resolve().parents[1].joinpath(*module.split(".")).with_suffix(".py")
    tree = ast.parse(source.read_text(encoding="utf-8"))
    function = next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name)
    return _first_paragraph(ast.get_docstring(function) or "")


def print_help() -> None:
    _print_parser(top_parser())
    print("\npredict with --ckpt_path and --text / --input / --question labels given inputs "
          "('python main.py predict --help'); with --config it is LightningCLI's ('predict --config FILE --help').")


def _print_parser(parser) -> int:
    parser.print_help()
    return 0


def _summary(function: Callable[..., Any]) -> str:
    """The first paragraph of the function's docstring, on one line, without its final full stop."""
    return _first_paragraph(function.__doc__ or "")


def _first_paragraph(doc: str) -> str:
    return " ".join(doc.strip().split("\n\n")[0].split()).rstrip(".")


def _unknown(name: str, known: dict, what: str, hint: str) -> None:
    import difflib

    from ptm_app.errors import PtmError

    close = difflib.get_close_matches(name, list(known), n=1)
    suggestion = f"did you mean '{close[0]}'? " if close else ""
    raise PtmError(f"unknown {what} '{name}'; {suggestion}use one of {', '.join(known)} ({hint})")


# -- argv into jsonargparse's form ------------------------------------------------------------------------------

def parameter_kinds(function: Callable[..., Any]) -> dict[str, Any]:
    """Parameter name -> its type (postponed annotations resolved)."""
    import inspect
    import typing

    try:
        hints = typing.get_type_hints(function)
    except Exception:  # an annotation that cannot be resolved here: jsonargparse reports it
        hints = {}
    return {name: hints.get(name, p.annotation) for name, p in inspect.signature(function).parameters.items()}


def _is(kind: Any, wanted: type) -> bool:
    """``kind`` is ``wanted`` or an Optional/Union holding it (``list``: any ``list[...]``)."""
    import types

    if kind is wanted or get_origin(kind) is wanted:
        return True
    return get_origin(kind) in (Union, types.UnionType) and any(_is(a, wanted) for a in get_args(kind))


def command_argv(function: Callable[..., Any], argv: list[str], positional: Optional[str]) -> list[str]:
    """``argv`` as jsonargparse takes it: leading bare values -> ``--<positional>``; a list option's values (several
    after one option, or the option repeated) -> one JSON list; a bool option standing alone -> ``true``."""
    kinds = parameter_kinds(function)
    lists = {name for name, kind in kinds.items() if _is(kind, list)}
    bools = {name for name, kind in kinds.items() if _is(kind, bool)} | {"trust_checkpoint"}
    out: list[Any] = []  # tokens, and for a list option the list its values are gathered in
    gathered: dict[str, list[str]] = {}

    def add_list(key: str, values: list[str]) -> None:
        if key not in gathered:
            gathered[key] = []
            out.extend([f"--{key}", gathered[key]])
        gathered[key].extend(values)

    i = 0
    if positional is not None:
        lead = []
        while i < len(argv) and not argv[i].startswith("-"):
            lead.append(argv[i])
            i += 1
        if lead and positional in lists:
            add_list(positional, lead)
        elif len(lead) > 1:
            from ptm_app.errors import PtmError

            raise PtmError(f"one {positional.upper()} is expected, got {len(lead)}: {' '.join(lead)}")
        elif lead:
            out += [f"--{positional}", lead[0]]
    while i < len(argv):
        token = argv[i]
        i += 1
        option, eq, value = token.partition("=")
        key = option[2:] if option.startswith("--") else None
        if key in lists:
            values = [value] if eq else []
            while not eq and i < len(argv) and not argv[i].startswith("--"):
                values.append(argv[i])
                i += 1
            add_list(key, values)
            continue
        out.append(token)
        if key in bools and not eq and (i == len(argv) or argv[i].startswith("--")):
            out.append("true")
    return [_list_value(t) if isinstance(t, list) else t for t in out]


def _list_value(values: list[str]) -> str:
    """One JSON list; a single value that is already a YAML list (``[a, b]``) or ``null`` is kept as it is."""
    if len(values) == 1:
        import yaml

        try:
            loaded = yaml.safe_load(values[0])
        except yaml.YAMLError:
            loaded = values[0]
        if loaded is None or isinstance(loaded, list):
            return values[0]
    return json.dumps(values)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
