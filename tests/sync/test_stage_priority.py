"""The in-flight staging thread's priority (`sync.stage_nice`, rlsync/sync/inflight.py): nice 1-19 lowers the
calling thread only; 20 makes it SCHED_IDLE (it runs only on a core nothing else wants); 0 leaves it alone.
Each in a fresh thread, read back from the kernel; the test's own thread is unchanged."""
import os
import threading

import pytest

from rlsync.config.compose import check_config
from rlsync.config.schema import TrainConfig
from rlsync.core.errors import ConfigError
from rlsync.sync.inflight import lower_thread_priority


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
