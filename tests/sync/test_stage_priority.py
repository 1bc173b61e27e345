"""The in-flight staging thread's priority (`sync.stage_nice`, rlsync/sync/stage_priority.py): nice 1-19 lowers the
calling thread only; 20 makes it SCHED_IDLE (it runs only on a core nothing else wants); 0 leaves it alone. An idle
staging is raised to nice 10 while a caller waits or past `sync.stage_escalate_s`, and lowered again after; an
unprivileged process that may not raise it stays idle and says why. Each read back from the kernel."""
import os
import subprocess
import sys
import threading
import time

import pytest

from rlsync.config.compose import check_config
from rlsync.config.schema import TrainConfig
from rlsync.core.errors import ConfigError
from rlsync.sync.stage_priority import ESCALATED_NICE, StagePriority, lower_thread_priority
from waiting import wait_for  # tests/waiting.py


def _in_thread(nice: int) -> tuple[int, int]:
    got = {}

    def run():
        lower_thread_priority(nice)
        tid = threading.get_native_id()
        got["sched"], got["nice"] = os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, tid)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return got["sched"], got["nice"]


@pytest.mark.parametrize("nice, sched, niceness", [(0, os.SCHED_OTHER, None), (10, os.SCHED_OTHER, 10),
                                                   (20, os.SCHED_IDLE, None)])
def test_the_staging_thread_alone_is_lowered(nice, sched, niceness):
    mine = (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
    got_sched, got_nice = _in_thread(nice)
    assert got_sched == sched
    if niceness is not None:
        assert got_nice == max(niceness, mine[1])
    assert (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())) == mine


def test_stage_nice_is_bounded_0_to_20_naming_the_key():
    for ok in (0, 10, 20):
        cfg = TrainConfig()
        cfg.sync.stage_nice = ok
        check_config(cfg)
    cfg = TrainConfig()
    cfg.sync.stage_nice = 21
    with pytest.raises(ConfigError, match="sync.stage_nice"):
        check_config(cfg)
    cfg = TrainConfig()
    cfg.sync.stage_escalate_s = -1
    with pytest.raises(ConfigError, match="sync.stage_escalate_s"):
        check_config(cfg)


def _sched(tid: int) -> tuple[int, int]:
    return os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)


class _Stager:
    """A thread that lowers itself like the follower, then stages while `hold` is set; a second thread it
    starts inside the staging (as an engine's fetch does) inherits its priority."""

    def __init__(self, prio: StagePriority):
        self.prio, self.tids, self.hold, self.staging = prio, [], threading.Event(), threading.Event()
        self.done, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self):
        self.prio.lower()
        self.tids.append(threading.get_native_id())
        with self.prio.staging():
            child = threading.Thread(target=lambda: (self.tids.append(threading.get_native_id()), self.hold.wait()))
            child.start()
            wait_for(lambda: len(self.tids) == 2, 5.0, "the staging's child thread")
            self.staging.set()
            self.hold.wait()
            child.join()
        self.done.set()
        self.release.wait()  # stays alive, between versions, so its priority can be read

    def __enter__(self):
        self.hold.clear()
        self.thread.start()
        wait_for(self.staging.is_set, 5.0, "staging")
        return self

    def __exit__(self, *exc):
        self.hold.set()
        self.release.set()
        self.thread.join()


def test_a_waiting_caller_raises_an_idle_staging_and_the_next_version_starts_idle_again():
    prio = StagePriority(20, escalate_s=0.0)
    with _Stager(prio) as st:
        assert all(_sched(t)[0] == os.SCHED_IDLE for t in st.tids)
        assert prio.escalate("a caller waits") == 2
        assert [_sched(t) for t in st.tids] == [(os.SCHED_OTHER, ESCALATED_NICE)] * 2
        assert prio.escalate("again") == 0 and prio.escalations == 1  # once per version
        st.hold.set()
        wait_for(st.done.is_set, 5.0, "the version staged")
        assert _sched(st.tids[0])[0] == os.SCHED_IDLE  # lowered again for the next version
    assert prio.escalate("between versions") == 0 and prio.escalations == 1  # nothing being staged: no change


def test_a_long_staging_is_raised_by_the_watchdog_after_escalate_s():
    prio = StagePriority(20, escalate_s=0.3)
    prio.start()
    try:
        t0 = time.monotonic()
        with _Stager(prio) as st:
            wait_for(lambda: _sched(st.tids[0])[0] == os.SCHED_OTHER, 10.0, "the watchdog's escalation")
            assert time.monotonic() - t0 >= 0.3 and prio.escalations == 1
    finally:
        prio.close()


def test_nice_1_to_19_is_never_raised():
    prio = StagePriority(10, escalate_s=0.01)
    with _Stager(prio) as st:
        assert prio.escalate("a caller waits") == 0
        assert _sched(st.tids[0])[0] == os.SCHED_OTHER


_UNPRIVILEGED = """
import importlib.util, os, resource, sys
spec = importlib.util.spec_from_file_location("stage_priority", sys.argv[1])  # the module alone: no torch import
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
StagePriority = mod.StagePriority
resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
os.setgid(65534); os.setuid(65534)   # no CAP_SYS_NICE, RLIMIT_NICE 0: leaving SCHED_IDLE is refused
prio = StagePriority(20, escalate_s=0.0)
prio.lower()
with prio.staging():
    raised = prio.escalate("a caller waits")
print(raised, prio.refused is not None, os.sched_getscheduler(0) == os.SCHED_IDLE, prio.escalate("again"))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="drops root to become unprivileged")
def test_an_unprivileged_staging_stays_idle_and_says_why():
    import rlsync.sync.stage_priority as sp
    out = subprocess.run([sys.executable, "-c", _UNPRIVILEGED, sp.__file__], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "True", "True", "0"]


def test_the_follower_raises_its_idle_staging_when_the_engine_waits_for_the_version(tmp_path):
    """sync.inflight on the hf engine, stage_nice 20, no watchdog: v2's fetch (held by a fault hook in the
    follower's thread) runs SCHED_IDLE until the worker waits for v2; then it runs at nice 10, and the next
    version starts idle again."""
    import torch

    from rlsync.core.stall import StallClock
    from rlsync.hub import ClientConfig, HubClient, Location, start_embedded_hub
    from rlsync.rollout import RolloutEngine, TinyModelConfig, build_tiny_model
    from rlsync.sync import Side, SyncConfig
    from rlsync.sync.hub_full import HubReceiver

    with start_embedded_hub(journal=str(tmp_path / "j.db")) as hub:
        trainer = HubClient(hub.address, hub.token, config=ClientConfig(transport="tcp-py"))
        reader = HubClient(hub.address, hub.token, config=ClientConfig(transport="tcp-py"))
        trainer.join(Location(host="t"), "trainer")
        reader.join(Location(host="r"), "reader")
        src = build_tiny_model(TinyModelConfig(seed=1), 32)
        engine = RolloutEngine(RolloutEngine.Config(max_new_tokens=4), build_tiny_model(TinyModelConfig(seed=0), 32),
                               pad_token_id=0, eos_token_id=2)
        engine.version = -1
        live = {n: p.data for n, p in src.named_parameters()}
        trainer.publish("policy", 1, live)
        side = Side(sync=SyncConfig(inflight=True, stage_nice=20, stage_escalate_s=0.0), model="policy", hub=reader,
                    clock=StallClock("r", "rollout"), hub_address=hub.address)
        receiver = HubReceiver(side, engine)
        seen, go = [], threading.Event()

        def held(sources, dest, pull):
            seen.append(("before", os.sched_getscheduler(0)))
            go.wait(30.0)
            seen.append(("after", os.sched_getscheduler(0)))
            return pull(sources)

        try:
            receiver.ensure(1)  # waits for v1: may raise that staging too
            before = receiver.follower.priority.escalations
            reader.set_pull_fault(held)
            with torch.no_grad():
                for t in live.values():
                    t.add_(0.01)
            trainer.publish("policy", 2, live)
            wait_for(lambda: seen, 30.0, "v2's fetch in the follower")
            assert not receiver.follower.wait_staged(2, 0.05)  # the worker waits for v2: the staging is raised
            go.set()
            assert receiver.follower.wait_staged(2, 30.0)
            reader.set_pull_fault(None)
            assert seen[0] == ("before", os.SCHED_IDLE) and ("after", os.SCHED_OTHER) in seen
            assert receiver.follower.priority.escalations == before + 1
            wait_for(lambda: os.sched_getscheduler(receiver.follower._thread.native_id) == os.SCHED_IDLE, 10.0,
                     "the follower idle again for the next version")
            receiver.ensure(2)  # the switch is recorded with its staging raised (`sync/stage_raised`)
            ups = [e for e in receiver.side.clock.drain() if getattr(e, "name", "") == "engine_update"]
            assert [(e.attrs["version"], e.attrs["stage_raised"]) for e in ups][-1] == (2, 1.0)
        finally:
            receiver.close()
            reader.leave()
            trainer.leave()
