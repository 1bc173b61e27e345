"""The priority of in-flight staging (`sync.stage_nice`, `sync.stage_escalate_s`; docs/rl.md, "sync.stage_nice").

Staging a version (its fetch, conversion and kernel build) competes with generation for the same cores, and
generation's OpenMP team stalls a whole decode step when one of its threads is preempted. So the follower thread
that stages lowers itself, and the threads it starts inherit that (Linux). At `stage_nice` 20 it runs SCHED_IDLE:
only on a core nothing else wants — an update then costs a saturated engine almost nothing, and lands at the
engine's next idle moment. A core that is never idle would starve it, so an idle staging is *escalated* to
SCHED_OTHER at nice `ESCALATED_NICE` when a caller blocks on it (the engine needs that version now) or once it
has run `escalate_s` seconds, and lowered again when the version is staged:

    prio = StagePriority(nice=20, escalate_s=10.0)
    prio.start()              # from a thread at normal priority: the watchdog must not be idle itself
    prio.lower()              # in the staging thread
    with prio.staging():      # one version: escalated past escalate_s, lowered again after
        ...
    prio.escalate("waited")   # a caller blocks on the staging
    prio.close()

Leaving SCHED_IDLE needs CAP_SYS_NICE or an RLIMIT_NICE of at least 20 - ESCALATED_NICE: without either the
kernel refuses (EPERM), which is logged once, and staging stays idle.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Iterator

log = logging.getLogger(__name__)

ESCALATED_NICE = 10
"""The nice an idle staging is raised to: the trade measured in docs/benchmarks.md ("inflight")."""


def lower_thread_priority(nice: int) -> None:
    """Run the calling thread (and the threads it starts later, which inherit it on Linux) at `nice`; 20 means
    SCHED_IDLE. Lowering is always allowed; a container that forbids it stages at the normal priority."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        if nice >= 20 and hasattr(os, "SCHED_IDLE"):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: the calling thread (Linux)
            return
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(os.getpriority(os.PRIO_PROCESS, tid), min(19, nice)))
    except OSError as e:
        log.info("could not lower the in-flight staging thread's priority: %s", e)


def idle_threads() -> list[int]:
    """Native ids of this process's threads that run SCHED_IDLE."""
    out = []
    for name in os.listdir("/proc/self/task"):
        try:
            if os.sched_getscheduler(int(name)) == os.SCHED_IDLE:
                out.append(int(name))
        except OSError:  # the thread ended meanwhile
            continue
    return out


class StagePriority:
    def __init__(self, nice: int, escalate_s: float):
        self.nice, self.escalate_s = nice, escalate_s
        self.idle = nice >= 20 and hasattr(os, "SCHED_IDLE")
        self.escalations = 0
        """Stagings escalated (each counted once), for the bench and the log."""
        self.refused: str | None = None
        """Why the kernel refused an escalation (then never tried again)."""
        self.raised_last = False
        """Whether the last staging (the last `staging()` block) was raised."""
        self._since: float | None = None  # when the version being staged started, None between versions
        self._raised: list[int] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.idle and self.escalate_s > 0:
            self._thread = threading.Thread(target=self._watch, name="rlsync-stage-watch", daemon=True)
            self._thread.start()

    def lower(self) -> None:
        lower_thread_priority(self.nice)

    @contextlib.contextmanager
    def staging(self) -> Iterator[None]:
        with self._lock:
            self._since = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self._since = None
                raised, self._raised = self._raised, []
                self.raised_last = bool(raised)
            for tid in raised:  # back to idle for the next version (threads started later inherit it)
                with contextlib.suppress(OSError):
                    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))

    def escalate(self, why: str) -> int:
        """Raise every idle thread of the process to SCHED_OTHER at ESCALATED_NICE while a version is being
        staged; returns how many were raised."""
        with self._lock:
            if not self.idle or self.refused is not None or self._since is None or self._raised:
                return 0
            tids = idle_threads()
            for tid in tids:
                try:
                    os.setpriority(os.PRIO_PROCESS, tid, max(ESCALATED_NICE, os.getpriority(os.PRIO_PROCESS, tid)))
                    os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                except ProcessLookupError:
                    continue
                except OSError as e:
                    self.refused = str(e)
                    log.warning("in-flight staging stays SCHED_IDLE: the kernel refused to raise it (%s); a core "
                                "that is never idle delays each version (docs/rl.md, sync.stage_nice)", e)
                    break
                self._raised.append(tid)
            if self._raised:
                self.escalations += 1
                log.info("in-flight staging raised to nice %d (%s, %d threads)", ESCALATED_NICE, why,
                         len(self._raised))
            return len(self._raised)

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.escalate_s / 4)):
            with self._lock:
                since = self._since
            if since is not None and time.monotonic() - since >= self.escalate_s:
                self.escalate(f"staging for more than sync.stage_escalate_s={self.escalate_s:g}")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
