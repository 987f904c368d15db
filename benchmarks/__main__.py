"""``python -m benchmarks``: the CPU benchmarks (``harness.py``), or with ``--device`` the GPU one (``gpu_bench.py``)."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a == "--device" or a.startswith("--device=") for a in argv):
        from benchmarks.gpu_bench import main as gpu_main

        return gpu_main(argv)
    from benchmarks.harness import main as cpu_main

    return cpu_main(argv)


if __name__ == "__main__":
    sys.exit(main())
