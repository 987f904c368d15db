"""Analysis commands are plain typed functions (litgpt's ``__main__``: one function per subcommand); their
settings come from a YAML ``--config`` and/or flags, parsed by jsonargparse from the function's signature, so an
unknown key or a wrong value is one line naming the key."""
from __future__ import annotations

import json
from typing import Any, Callable, get_args, get_origin

from ptm_app.config_errors import one_line
from ptm_app.errors import PtmError


def run_command(function: Callable[..., Any], argv: list[str], prog: str, positional: str | None = None,
                loads_checkpoints: bool = True) -> Any:
    """Parse ``argv`` (``--config FILE.yaml``, ``--key value``, ``--key v1 v2 ...`` for list settings, and the
    leading values for the list setting ``positional``) into ``function``'s arguments and call it.  A command that
    loads models also takes ``--trust_checkpoint``, which holds for every checkpoint it reads
    (``checkpoints.trusting``)."""
    from ptm_app.checkpoints import trusting
    from ptm_app.training.console import quiet_third_party

    settings = parse_settings(function, argv, prog, positional, loads_checkpoints)
    trust = settings.pop("trust_checkpoint", False)
    quiet_third_party()  # the known third-party notices stay off the console, as in a training run
    with trusting(trust):
        return function(**settings)


def parse_settings(function: Callable[..., Any], argv: list[str], prog: str,
                   positional: str | None = None, loads_checkpoints: bool = False) -> dict[str, Any]:
    from jsonargparse import ArgumentError, ArgumentParser

    parser = ArgumentParser(prog=f"main.py {prog}", description=(function.__doc__ or "").splitlines()[0],
                            exit_on_error=False)
    parser.add_argument("--config", action="config", help="a YAML file with any of the settings below")
    if loads_checkpoints:
        parser.add_argument("--trust_checkpoint", type=bool, default=False,
                            help="read checkpoints you made yourself even if they hold more than plain data or name "
                                 "a module class outside ptm_app (their loading can run code)")
    parser.add_function_arguments(function, as_positional=positional is not None)
    list_keys = {name for name, kind in function.__annotations__.items() if _is_list(kind)}
    try:
        namespace = parser.parse_args(_group_lists(argv, list_keys, positional))
    except ArgumentError as exc:
        raise PtmError(one_line(exc, f"python main.py {prog} --help lists the settings")) from None
    settings = namespace.as_dict()
    settings.pop("config", None)
    settings.pop("__path__", None)
    return settings


def _is_list(kind: Any) -> bool:
    """A list setting (annotations are strings under ``from __future__ import annotations``)."""
    return "list[" in str(kind) or get_origin(kind) is list or any(get_origin(a) is list for a in get_args(kind))


def _group_lists(argv: list[str], list_keys: set[str], positional: str | None) -> list[str]:
    """``--key a b`` -> ``--key ["a","b"]`` for list settings, and leading bare values -> the positional list
    (jsonargparse reads a list from one JSON/YAML value)."""
    out, i = [], 0
    if positional is not None:
        lead = []
        while i < len(argv) and not argv[i].startswith("--"):
            lead.append(argv[i])
            i += 1
        if lead:
            out.append(lead[0] if len(lead) == 1 and lead[0].startswith("[") else json.dumps(lead))
    while i < len(argv):
        token = argv[i]
        out.append(token)
        i += 1
        key = token[2:].replace("-", "_") if token.startswith("--") and "=" not in token else None
        if key in list_keys:
            values = []
            while i < len(argv) and not argv[i].startswith("--"):
                values.append(argv[i])
                i += 1
            if len(values) == 1 and values[0].lstrip().startswith(("[", "null")):
                out.append(values[0])  # already a list value
            elif values:
                out.append(json.dumps(values))
    return out
