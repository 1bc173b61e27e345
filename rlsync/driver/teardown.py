"""Shutting a run down: every step runs even if one before it raised, then the first error is raised.

A trainer group that fails to shut down must not leave the rollout pools, the stats client, the
embedded hub or its journal directory behind (review 2026-11-23: `_stop` skipped them).
"""
from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger("rlsync.driver")


def run_all(steps: list[Callable[[], object]]) -> None:
    """Call every step in order; log each failure; raise the first one (KeyboardInterrupt too) at the end."""
    first: BaseException | None = None
    for step in steps:
        try:
            step()
        except BaseException as e:  # noqa: BLE001 - re-raised below, after the rest has run
            log.warning("shutdown step %s failed: %r", getattr(step, "__qualname__", step), e)
            first = first or e
    if first is not None:
        raise first
