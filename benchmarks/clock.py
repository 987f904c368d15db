"""One step clock for every candidate, so all of them are timed the same way.

A candidate calls ``tick`` at the end of each optimiser step (after ``optimizer.step``, the scheduler and
``zero_grad``), with the samples and non-padding tokens of that step's batch.  The steady state is steps
``warmup+1 … N``, each timed from the end of the step before it to its own end: start-up, the first (slow)
steps and whatever runs after the last step are outside it, data loading and collation of the measured steps
inside it, for every candidate alike (``steady_state``).
"""
from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from statistics import median
from typing import Optional


class StepClock:
    """Step-end times (``perf_counter``) and per-step counts; wall-clock marks for start-up costs."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.samples: list[int] = []
        self.tokens: list[int] = []
        self.padded: list[int] = []  # every position of the batch, padding included
        self.marks: dict[str, float] = {}  # time.time(): comparable with the parent's spawn time
        self.extra: dict = {}

    def mark(self, name: str) -> None:
        """Record the wall time of ``name`` once (the first call wins)."""
        self.marks.setdefault(name, time.time())

    def tick(self, samples: int, tokens: int, padded: int) -> None:
        self.mark("first_step_end")
        self.ends.append(time.perf_counter())
        self.samples.append(int(samples))
        self.tokens.append(int(tokens))
        self.padded.append(int(padded))

    def record(self) -> dict:
        return {"ends": self.ends, "samples": self.samples, "tokens": self.tokens, "padded": self.padded,
                "marks": self.marks,
                "peak_rss_mb": peak_rss_mb(), **self.extra}

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.record(), indent=1))


def peak_rss_mb() -> float:
    """This process's peak resident set since its ``exec`` (Linux ``VmHWM``).

    Not ``ru_maxrss``: Linux carries the pre-``exec`` high-water mark into it, so a child forked from a big
    parent would report the parent's peak (seen here: every candidate showed the harness's 668 MB).
    """
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # elsewhere: the best there is


def steady_state(record: dict, warmup: int) -> dict:
    """Rates over steps ``warmup+1 … N`` of a ``StepClock`` record.

    ``samples_per_s`` / ``tokens_per_s``: the mean work of a step over the *median* step time, so a few steps
    slowed by another process on the machine do not move it; ``*_mean``: the work over the whole window's
    wall time (the plain rate, which such steps do move).  On a quiet machine the two agree.
    """
    ends, n = record["ends"], len(record["ends"])
    if n <= warmup or warmup < 1:
        raise ValueError(f"need more than {warmup} timed steps after at least one warm-up step (got {n})")
    seconds = ends[-1] - ends[warmup - 1]
    steps = n - warmup
    step_time = median(b - a for a, b in zip(ends[warmup - 1:], ends[warmup:]))
    samples, tokens = sum(record["samples"][warmup:]) / steps, sum(record["tokens"][warmup:]) / steps
    padded = sum(record.get("padded", record["tokens"])[warmup:])
    return {"steps": steps, "seconds": seconds, "s_per_step": step_time,
            "padding_fraction": 1 - tokens * steps / max(padded, 1),
            "samples_per_s": samples / step_time, "tokens_per_s": tokens / step_time,
            "samples_per_s_mean": samples * steps / seconds, "tokens_per_s_mean": tokens * steps / seconds}


def median_of(runs: list[dict], key: str) -> Optional[float]:
    values = [r[key] for r in runs if r.get(key) is not None]
    return median(values) if values else None
