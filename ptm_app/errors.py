"""User-facing errors: one clear line naming the thing and the fix, never a traceback."""
from __future__ import annotations


class PtmError(Exception):
    """An error caused by the user's input (config, data, paths, hardware).

    ``main.py`` prints ``error: <message>`` on one line and exits with status 2.
    The message must name the offending thing and say how to fix it.
    """

    exit_code = 2
    last: "PtmError | None" = None  # the latest one raised: config parsing may wrap it in another error

    def __init__(self, *args):
        super().__init__(*args)
        PtmError.last = self

    def __str__(self) -> str:  # keep it on one line
        return " ".join(str(a) for a in self.args).replace("\n", " ")


TRUST_HINT = "if you made this file yourself, pass --trust_checkpoint (python: trust=True)"


class CheckpointUnsafe(PtmError):
    """A checkpoint whose unpickling would build objects other than plain data (it could run code), or whose data
    would choose a path, a module or code (a tokenizer file name, a module class, a DeepSpeed ``latest``)."""


class DataFormatError(PtmError):
    """A malformed line in a data file; the message starts with ``file:line``."""

    def __init__(self, path, line: int, problem: str, fix: str = "fix or remove that line"):  # noqa: D107
        super().__init__(f"{path}:{line}: {problem}; {fix}")
