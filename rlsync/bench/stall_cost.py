"""`python -m rlsync.bench stall_cost`: what one `StallClock` transition costs.

    python -m rlsync.bench stall_cost [--transitions 200000] [--repeats 5]

Times `enter()` alternating two states (the hot path of every worker: a lock, a clock read, a tuple
append) and, as the baseline measured in the same run, an empty Python loop of the same length.
Prints the median per-transition time over the repeats, the ratio against the baseline and the load.
A benchmark: it reports, it asserts nothing (docs/telemetry.md quotes it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from rlsync.bench import register_scenario
from rlsync.core.stall import StallClock


def _per_transition(n: int) -> float:
    c = StallClock("bench", role="rollout", max_records=2 * n)
    t = time.perf_counter()
    for i in range(n):
        c.enter("generating" if i % 2 else "waiting_weights")
    dt = time.perf_counter() - t
    if len(c.drain()) < n - 1:  # every transition closed an interval: nothing was dropped
        raise RuntimeError("stall clock dropped records")
    return dt / n


def _per_empty(n: int) -> float:
    t = time.perf_counter()
    for i in range(n):
        _ = "generating" if i % 2 else "waiting_weights"
    return (time.perf_counter() - t) / n


@register_scenario("stall_cost")
def stall_cost_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsync.bench stall_cost", description=__doc__.splitlines()[0])
    p.add_argument("--transitions", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    if a.transitions < 1 or a.repeats < 1:
        p.error("--transitions and --repeats must be >= 1")
    per = statistics.median(_per_transition(a.transitions) for _ in range(a.repeats))
    base = statistics.median(_per_empty(a.transitions) for _ in range(a.repeats))
    print(f"stall clock transition: {per * 1e6:.2f} us median over {a.repeats} x {a.transitions:,}; "
          f"empty loop {base * 1e6:.3f} us ({per / base:.0f}x); load {os.getloadavg()[0]:.1f}")
    return 0
