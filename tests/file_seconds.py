"""The default suite's test files by their measured seconds, for scheduling: ``conftest.pytest_collection_modifyitems``
puts the longest first, so that pytest-xdist (``--dist loadfile --no-loadscope-reorder``) hands the two workers
the heavy files early and the suite ends on small ones instead of one worker finishing a 2-minute file alone.

``python -m tests.file_seconds LOG`` rewrites ``tests/file_seconds.json`` from a pytest log run with
``--durations=0`` (``make test-durations``); a file missing from the table (a new one) runs after the listed ones.
"""
from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

TABLE = Path(__file__).with_name("file_seconds.json")
LINE = re.compile(r"^([0-9.]+)s (?:call|setup|teardown)\s+(tests/\S+?\.py)::")


def read_table(path: Path = TABLE) -> dict[str, float]:
    """The table (test file -> seconds), empty if it is missing or unreadable."""
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in table.items() if isinstance(v, (int, float))} if isinstance(table, dict) else {}


def seconds_by_file(log_lines) -> dict[str, float]:
    """Setup + call + teardown seconds summed per test file from pytest's ``--durations=0`` lines."""
    total: Counter = Counter()
    for line in log_lines:
        match = LINE.match(line)
        if match:
            total[match.group(2)] += float(match.group(1))
    return {name: round(seconds, 1) for name, seconds in total.most_common()}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.file_seconds PYTEST_LOG (a run with --durations=0)", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8", errors="replace") as fh:
        table = seconds_by_file(fh)
    if not table:
        print(f"error: {argv[0]} has no --durations=0 lines: run pytest with --durations=0", file=sys.stderr)
        return 1
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{TABLE}: {len(table)} files, {sum(table.values()):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
