"""Optional packages (``pyproject.toml`` extras): one line saying how to install the one a feature needs."""
from __future__ import annotations

from ptm_app.errors import PtmError


def require_deepspeed(what: str = "strategy DeepSpeed") -> None:
    """DeepSpeed strategies and DeepSpeed checkpoints need the ``deepspeed`` extra."""
    from lightning.fabric.strategies.deepspeed import _DEEPSPEED_AVAILABLE

    if not _DEEPSPEED_AVAILABLE:
        raise PtmError(f"{what} needs the deepspeed package; install it with: "
                       "DS_BUILD_OPS=0 .venv/bin/pip install -c constraints-cpu.txt -e '.[deepspeed]'")
