"""``python -m ptm_app`` / ``ptm``: the same commands as ``python main.py``."""
from __future__ import annotations

import os
import sys


def entry() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from ptm_app.main import main

    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    entry()
