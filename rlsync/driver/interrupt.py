"""Ctrl-C and SIGTERM for a run started from the command line: stop at a clean point, then wind down in bounded time.

    with GracefulStop(driver, run_dir) as stop:
        driver.run()               # returns early after a first Ctrl-C; `stop.signalled` says so

- The first Ctrl-C (or SIGTERM) while the loop runs asks the driver to stop (`Driver.stop`) at the step
  boundary: no new prompts or steps; a step still training finishes and counts (its `ray.wait` wakes
  every second); then a checkpoint of that step (`checkpoint.enabled`, driver/checkpoint.py), so
  `resume=auto` continues there and loses no finished step; then the usual wind-down (workers leave the
  hub, job files and temp dirs removed). Nothing is interrupted mid-call: an exception raised at an
  arbitrary point inside Ray's or the hub client's code could leave a lock or a socket half-used, and
  the wind-down would then wait on it. Rollouts in flight are dropped (their prompts are skipped).
- During start-up (before the loop) it raises KeyboardInterrupt at once, as Python would: there is no
  step to finish.
- A second Ctrl-C, or a wind-down (the step in flight and the checkpoint included) still running
  `deadline_s` after the first, gives up (no checkpoint then: `resume=auto` goes back to the last one): the main
  thread's stack goes to the log (what blocked), the job files and the hub's temp dir are removed, and
  the process exits 130 without waiting. The local Ray cluster goes with it (Ray kills the processes
  it started when their driver dies).

Main thread only (signal handlers); `Driver.run()` called from other code installs nothing.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from rlsync.pool.attach import remove_job_files

log = logging.getLogger(__name__)

EXIT_INTERRUPTED = 130


class GracefulStop:
    def __init__(self, driver: Any, run_dir: str | os.PathLike, deadline_s: float = 60.0) -> None:
        self.driver, self.run_dir, self.deadline_s = driver, Path(run_dir), deadline_s
        self.signalled: str | None = None
        """Name of the first signal received (None: none)."""
        self._timer: threading.Timer | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "GracefulStop":
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._on_signal)
        # ray.init replaces SIGTERM's handler with sys.exit; the driver puts this one back after it.
        self.driver.signal_handlers = {signal.SIGTERM: self._on_signal}
        return self

    def __exit__(self, *exc: Any) -> None:
        # After a signal the deadline and the handlers stay until the process exits: they also bound
        # Ray's own shutdown at exit (a second Ctrl-C there still means "now").
        if self.signalled is None:
            for sig, h in self._previous.items():
                signal.signal(sig, h)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.signalled is not None:
            self._give_up(f"a second {name}")
        self.signalled = name
        self._timer = threading.Timer(self.deadline_s, self._give_up, args=(f"the wind-down still running "
                                                                              f"{self.deadline_s:.0f} s after {name}",))
        self._timer.daemon = True
        self._timer.start()
        if not getattr(self.driver, "looping", False):
            raise KeyboardInterrupt  # start-up: nothing to finish
        log.warning("%s: stopping after this loop turn (a step training finishes, then a checkpoint) and winding "
                    "down (again: exit at once)", name)
        self.driver.stop()

    def _give_up(self, why: str) -> None:
        log.error("%s: exiting without a full wind-down; the threads were at (MainThread: what blocked):", why)
        for h in logging.getLogger().handlers:
            h.flush()
        faulthandler.dump_traceback(sys.stderr, all_threads=True)
        remove_job_files(self.run_dir)
        if getattr(self.driver, "_hub_tmp", None):
            shutil.rmtree(self.driver._hub_tmp, ignore_errors=True)
        os._exit(EXIT_INTERRUPTED)
