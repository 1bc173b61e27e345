"""Benchmarks: `python -m rlsync.bench SCENARIO [ARGS]`. Figures are ratios measured in one run.

A scenario is one module in this package that registers its entry point; adding one is a new file:

    @register_scenario("transfer")
    def main(argv: list[str]) -> int: ...

`python -m rlsync.bench` imports every public module here, then dispatches on the first argument.
Benchmarks are not tests: they print a table and write JSON; they assert nothing.
"""
from __future__ import annotations

from typing import Callable

from rlsync.core.registry import Registry

Scenario = Callable[[list[str]], int]
SCENARIOS: Registry = Registry("bench scenario")
register_scenario = SCENARIOS.register
