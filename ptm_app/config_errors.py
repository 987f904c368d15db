"""Errors as one line: ``guarded`` runs a command and turns what the user caused (our ``PtmError``s, jsonargparse's
multi-line validation errors, Lightning settings clashes) into one ``error:`` line and an exit status."""
from __future__ import annotations

import os
import re
import sys
from typing import Any, Callable, Optional

_HELP = "python main.py fit --help lists the keys"


def one_line(exc: Exception, help_hint: str = _HELP) -> str:
    """jsonargparse's multi-line message as one line: the key, what was expected and what was given; ``help_hint``
    says where the keys are listed."""
    text = str(exc)
    group = re.search(r'Parser key "([^"]+)"', text)
    prefix = f"{group.group(1)}." if group else ""
    if group and "class_path" in text:
        prefix += "init_args."
    option = re.search(r"Option '([^']+)' is not accepted", text) or re.search(r"Key '([^']+)' is not expected", text)
    if option:
        return f"unknown config key '{prefix}{option.group(1)}'; check its spelling ({help_hint})"
    unrecognized = re.search(r"[Uu]nrecognized arguments: (.+)", text)
    if unrecognized:
        return f"unknown command-line argument {unrecognized.group(1).strip()}; check its spelling ({help_hint})"
    absent = re.search(r"File does not exist: '([^']+)'", text)
    if absent:
        what = "config file" if not group or group.group(1) == "config" else f"{group.group(1)}: file"
        return f"{what} {absent.group(1)} does not exist; check the path"
    missing = re.search(r'[Kk]ey "([^"]+)" is required', text)
    if missing:
        return f"{missing.group(1)} is required; {help_hint}"
    klass = re.search(r"import path string: ([\w.]+)", text) or re.search(r"[Ii]mport path '([\w.]+)'", text)
    if klass:
        where = group.group(1) if group else "config"
        return f"unknown class '{klass.group(1)}' for '{where}'; use one of ptm_app's modules (configs/README.md lists the shipped recipes)"
    keys = re.findall(r'Parser key "([^"]+)"', text)
    wrong = re.search(r"Expected an? (.+?)\. Got value: (.+)", text)
    if len(keys) > 1 and wrong:  # a bad value of a nested setting: name the full key and what it accepts
        wanted = re.sub(r"<class '([\w.]+)'>", r"\1", wrong.group(1).replace("typing.", ""))
        choices = re.fullmatch(r"Literal\[(.*)\]", wanted)
        wanted = f"one of {choices.group(1)}" if choices else wanted
        return f"{prefix}{keys[-1]}: expected {wanted}, got {wrong.group(2).strip()}; {help_hint}"
    lines = [ln.strip(" -") for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("Parser key")]
    detail = [ln for ln in lines if not ln.startswith(("Subtypes", "Given value", "Errors", "Expected a"))] or lines
    message = " ".join(detail[:3]).replace("typing.", "")[:400]
    return (prefix.rstrip(".") + ": " if prefix else "") + message + ("" if help_hint == _HELP else f"; {help_hint}")


def option_error(exc: Exception, command: str, kinds: dict[str, Any], positional: Optional[str] = None) -> str:
    """jsonargparse's error for a command of the table (``main.COMMANDS``) as one line naming the option and the fix:
    an unknown option (with the closest known one), a missing one, a value of the wrong type (what is expected)."""
    import difflib

    text = str(exc)
    hint = f"python main.py {command} --help lists the options"
    shown = {name: (name.upper() if name == positional else f"--{name}") for name in kinds}
    unrecognized = re.search(r"[Uu]nrecognized arguments: (.+)", text)
    if unrecognized:
        given = unrecognized.group(1).strip()
        name = given.split()[0].lstrip("-").split("=")[0]
        close = difflib.get_close_matches(name, [*kinds, "config"], n=1) if given.startswith("--") else []
        return (f"unknown command-line argument {given}; {f'did you mean --{close[0]}? ' if close else ''}"
                f"options are --name value ({hint})")
    required = re.search(r"arguments are required: (.+)", text) or re.search(r'[Kk]ey "([^"]+)" is required', text)
    if required:
        names = [shown.get(n.strip().lstrip("-"), n.strip()) for n in required.group(1).split(",")]
        return f"{command} needs {' and '.join(names)}; {hint}"
    key = re.search(r'Parser key "([^"]+)"', text)
    if key and key.group(1) in kinds:
        given = re.search(r"Given value: (.*)", text) or re.search(r"Got value: (.*)", text)
        value = given.group(1).strip() if given else "the value given"
        return f"{key.group(1)}: {value} is not {expected(kinds[key.group(1)])} ({hint})"
    return one_line(exc, hint)


def expected(kind: Any) -> str:
    """A type hint in words: ``Optional[Literal['cls', 'mean']]`` -> ``one of cls, mean``."""
    import types
    from typing import Literal, Union, get_args, get_origin

    origin, args = get_origin(kind), get_args(kind)
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return " or ".join(expected(a) for a in inner) if inner else "null"
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin is list:
        return f"a list whose items are {expected(args[0])}" if args else "a list"
    if origin is dict:
        return "a mapping"
    words = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    if kind in words:
        return words[kind]
    return f"a {getattr(kind, '__name__', str(kind))} mapping" if isinstance(kind, type) else str(kind)


def read_yaml(path: str | os.PathLike):
    """The YAML file ``path`` parsed (safely); a syntax error is one line naming the file and the line where the
    parser found it (``file:line:column``), with where the construct it was reading began."""
    import yaml

    from ptm_app.errors import PtmError

    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except UnicodeDecodeError:
        from ptm_app.data.formats import not_utf8

        raise not_utf8(path) from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = exc.problem or exc.context or "cannot parse it"
        started = (f" ({exc.context} that began at line {exc.context_mark.line + 1})"
                   if exc.problem and exc.context and exc.context_mark is not None else "")
        raise PtmError(f"{where}: invalid YAML: {problem}{started}; fix the YAML there") from None
    except yaml.YAMLError as exc:
        raise PtmError(f"{path}: invalid YAML: {' '.join(str(exc).split())}; fix the file") from None


def check_config_files(argv: list[str]) -> None:
    """Every ``--config FILE`` / ``-c FILE`` that exists is valid YAML (``read_yaml``: the file and line of an
    error, which jsonargparse's message lacks); a missing one is left to the parser (``one_line`` names it)."""
    for i, arg in enumerate(argv):
        value = arg.split("=", 1)[1] if arg.startswith("--config=") else \
            argv[i + 1] if arg in ("--config", "-c") and i + 1 < len(argv) else None
        if value is not None and os.path.isfile(value):
            read_yaml(value)


def guarded(command: Callable[[list[str]], int], argv: list[str]) -> int:
    """``command(argv)``; bad input is printed as one ``error: ...`` line (exit 2), never a traceback; a SIGTERM
    stop (``last.ckpt`` written) exits 143.  Anything else is a bug of ours and keeps its traceback."""
    from ptm_app.errors import PtmError

    try:
        return command(argv)
    except _sigterm():  # Lightning stops on SIGTERM after LastCheckpoint wrote last.ckpt
        print("stopped by SIGTERM; last.ckpt is written, resume with --ckpt_path last", file=sys.stderr)
        return 143
    except PtmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:
        from jsonargparse import ArgumentError

        wrapped = PtmError.last
        if wrapped is not None and str(wrapped) in str(exc).replace("\n", " "):
            print(f"error: {wrapped}", file=sys.stderr)  # our error, raised while the config was instantiated
            return wrapped.exit_code
        if isinstance(exc, ArgumentError):
            print(f"error: {one_line(exc)}", file=sys.stderr)
            return 2
        if _lightning_config_error(exc):
            print(f"error: trainer settings: {' '.join(str(exc).split())}", file=sys.stderr)
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
