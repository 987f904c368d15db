"""One step clock for every candidate, so all of them are timed the same way.

A candidate calls ``tick`` at the end of each optimiser step (after ``optimizer.step``, the scheduler and
``zero_grad``), with the samples and non-padding tokens of that step's batch.  The steady state is steps
``warmup+1 … N``, each timed from the end of the step before it to its own end: start-up, the first (slow)
steps and whatever runs after the last step are outside it, data loading and collation of the measured steps
inside it, for every candidate alike (``steady_state``).

On a GPU (``StepClock(cuda=True)``) kernels run asynchronously, so the host's clock at ``tick`` would time the
launch, not the work.  Each tick there records a CUDA event in the stream instead, and ``record`` synchronises
once and reads the step ends off the GPU's own timeline: the same boundaries a ``torch.cuda.synchronize()`` per
step would give, without stopping the host at every step (which would drain the queue of kernels a framework
builds ahead and charge each candidate the launch latency it otherwise hides).  Counts may be tensors (a GPU
batch's ``attention_mask.sum()``): they are read back in ``record`` too, never inside the timed steps.
"""
from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from statistics import median
from typing import Optional


class StepClock:
    """Step-end times (``perf_counter``, or CUDA events with ``cuda``) and per-step counts; wall-clock marks for
    start-up costs."""

    def __init__(self, cuda: bool = False) -> None:
        self.cuda = cuda
        self.ends: list[float] = []
        self.events: list = []  # torch.cuda.Event per tick (cuda)
        self.samples: list = []
        self.tokens: list = []
        self.padded: list = []  # every position of the batch, padding included
        self.marks: dict[str, float] = {}  # time.time(): comparable with the parent's spawn time
        self.extra: dict = {}

    def mark(self, name: str) -> None:
        """Record the wall time of ``name`` once (the first call wins)."""
        self.marks.setdefault(name, time.time())

    def tick(self, samples, tokens, padded) -> None:
        """The end of an optimiser step with its counts (ints, or tensors read back in ``record``)."""
        self.mark("first_step_end")
        self.ends.append(time.perf_counter())
        if self.cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.events.append(event)
        self.samples.append(samples)
        self.tokens.append(tokens)
        self.padded.append(padded)

    def record(self) -> dict:
        if self.events:  # the GPU's step ends, from its first tick's host time on
            import torch

            torch.cuda.synchronize()
            first = self.events[0]
            self.ends = [self.ends[0] + first.elapsed_time(e) / 1e3 for e in self.events]
            self.events = []
            self.extra["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2 ** 20
        self.samples, self.tokens, self.padded = ([int(x) for x in xs] for xs in (self.samples, self.tokens,
                                                                                  self.padded))
        return {"ends": self.ends, "samples": self.samples, "tokens": self.tokens, "padded": self.padded,
                "marks": self.marks, "timed_on": "cuda events" if self.cuda else "host clock",
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
