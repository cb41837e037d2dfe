"""Where a decode step's time goes inside its team programs (causallm/kernels/team.py).

A team program runs a step's kernels as ops in one parallel region, so a timer around a layer
sees nothing of it. ``Program.run(n, trace)`` has each thread read the CPU's cycle counter at
three points of every op i:

    arrive[t, i]   thread t starts claiming op i's tasks (it is done waiting for op i - 1)
    own[t, i]      it finds no task of op i left (its share ran)
    leave[t, i]    every task of op i is done (it stops waiting)

so for op i: its span = max_t leave[t, i] - max_t leave[t, i - 1] (the region's start for the
first op), each thread's work = own - arrive, its wait = leave - own. ``trace_teams(runner,
step)`` runs the Team entries of a stage runner's plan for a step of ``step`` rows so timed;
``Timeline.table`` sums them by plan entry kind (a layer's name without its ``layerN_``).
"""

from __future__ import annotations

import re
import time

import numpy as np

from causallm.kernels.team import clock


def cycles_per_second(seconds: float = 0.2) -> float:
    """The cycle counter's rate, against the wall clock over ``seconds``."""
    clock()
    c0, t0 = clock(), time.perf_counter()
    time.sleep(seconds)
    return (clock() - c0) / (time.perf_counter() - t0)


def kind(label: str) -> str:
    """A plan entry's name without its layers' ``layerN_`` prefixes."""
    return re.sub(r"(^|\+)layer\d+_", r"\1", label)


class Timeline:
    """Sums of the timed team runs by kind: milliseconds of span, and of the work of the
    slowest and of the fastest thread; ``start`` the time from the calls to their first ops'
    starts (the dispatch and the region's start), ``calls`` the runs timed."""

    def __init__(self) -> None:
        self.kinds: dict = {}
        self.sums = np.zeros((3, 0))
        self.ops = np.zeros(0, dtype=np.int64)
        self.start = 0.0
        self.calls = 0
        self.ms = 1e3 / cycles_per_second()

    def index(self, labels: list) -> np.ndarray:
        """The kinds of ``labels`` as indices into the sums."""
        for k in map(kind, labels):
            self.kinds.setdefault(k, len(self.kinds))
        grow = len(self.kinds) - self.ops.shape[0]
        self.sums = np.pad(self.sums, ((0, 0), (0, grow)))
        self.ops = np.pad(self.ops, (0, grow))
        return np.array([self.kinds[kind(x)] for x in labels], dtype=np.int64)

    def add(self, index: np.ndarray, trace: np.ndarray, called: int) -> None:
        leave = trace[:, :, 2].max(axis=0)
        before = np.concatenate([[trace[:, 0, 0].min()], leave[:-1]])
        work = trace[:, :, 1] - trace[:, :, 0]
        for row, values in enumerate((leave - before, work.max(axis=0), work.min(axis=0))):
            np.add.at(self.sums[row], index, values * self.ms)
        np.add.at(self.ops, index, 1)
        self.start += (trace[:, 0, 0].min() - called) * self.ms
        self.calls += 1

    def reset(self) -> None:
        self.sums[:] = 0
        self.ops[:] = 0
        self.start, self.calls = 0.0, 0

    def table(self, steps: int) -> dict:
        """Per step: {kind: {ms, ops, work_max_ms, work_min_ms}}, largest first; the teams'
        total and their regions' start."""
        span, most, least = self.sums / steps
        kinds = sorted(self.kinds, key=lambda k: -span[self.kinds[k]])
        out = {k: {"ms": span[i], "ops": int(self.ops[i]) // steps, "work_max_ms": most[i],
                   "work_min_ms": least[i]} for k in kinds for i in [self.kinds[k]]}
        return {"kinds": out, "teams_ms": float(span.sum()), "region_start_ms": self.start / steps}


def trace_teams(runner, step: int) -> Timeline:
    """Time every Team entry of ``runner``'s plan for a step of ``step`` rows, on the threads
    it runs on (each entry's ``incremental_forwarding`` replaced on the instance)."""
    timeline = Timeline()
    for entry, ctx in runner.execution(step):
        if getattr(entry, "type", None) != "team":
            continue
        trace = np.zeros((entry.threads, entry.program.table.shape[0], 3), dtype=np.int64)
        index = timeline.index(entry.labels)

        def timed(context, from_, to, entry=entry, trace=trace, index=index):
            for check, c in entry.checks:
                check(c)
            called = clock()
            entry.program.run(entry.threads, trace)
            timeline.add(index, trace, called)
        entry.incremental_forwarding = timed
    return timeline
