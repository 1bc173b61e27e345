"""Ctrl-C handling of `python -m rlsync.train` (rlsync/driver/interrupt.py), without a run: a stand-in driver.

The whole path with a real job (SIGINT -> wind-down -> exit 130, files removed) is
tests/rl/test_attach_from_shell.py.
"""
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from rlsync.driver.interrupt import GracefulStop


class _Driver:
    def __init__(self, looping):
        self.looping, self.stopped, self.signal_handlers = looping, threading.Event(), {}

    def stop(self):
        self.stopped.set()


def test_a_signal_while_looping_asks_the_driver_to_stop_and_raises_nothing(tmp_path):
    d = _Driver(looping=True)
    with GracefulStop(d, tmp_path, deadline_s=600) as stop:
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs before the next bytecode here
        assert d.stopped.is_set() and stop.signalled == "SIGINT"
        assert d.signal_handlers[signal.SIGTERM] == stop._on_signal  # put back after ray.init
    stop._timer.cancel()
    for sig in (signal.SIGINT, signal.SIGTERM):  # this test process gets its own handlers back
        signal.signal(sig, stop._previous[sig])


def test_a_signal_during_start_up_raises_keyboardinterrupt(tmp_path):
    d = _Driver(looping=False)
    stop = GracefulStop(d, tmp_path, deadline_s=600)
    try:
        with pytest.raises(KeyboardInterrupt):
            with stop:
                os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signalled == "SIGTERM" and not d.stopped.is_set()
    finally:
        stop._timer.cancel()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, stop._previous[sig])


@pytest.mark.parametrize("second", [False, True])
def test_a_wind_down_that_hangs_is_cut_short_with_its_stack_and_files_removed(tmp_path, second):
    """The driver ignores stop() and blocks (the fault): past the deadline, or at a second Ctrl-C, the process
    exits 130 on its own, prints where the main thread was, and removes the job files and the hub's temp dir."""
    run_dir, hub_tmp = tmp_path / "run", tmp_path / "hub_tmp"
    run_dir.mkdir(), hub_tmp.mkdir()
    (run_dir / "job.json").write_text("{}")
    (run_dir / "ray_auth_token").write_text("t")
    script = textwrap.dedent(f"""
        import os, signal, threading
        from rlsync.driver.interrupt import GracefulStop

        class Driver:
            looping, signal_handlers, _hub_tmp = True, {{}}, {str(hub_tmp)!r}
            def stop(self):
                pass
            def wind_down_that_never_ends(self):
                threading.Event().wait()

        d = Driver()
        with GracefulStop(d, {str(run_dir)!r}, deadline_s={600 if second else 1.0}):
            os.kill(os.getpid(), signal.SIGINT)
            if {second}:
                os.kill(os.getpid(), signal.SIGINT)
            d.wind_down_that_never_ends()
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == 130, p.stderr
    assert ("a second SIGINT" if second else "still running 1 s after SIGINT") in p.stderr, p.stderr
    assert second or "wind_down_that_never_ends" in p.stderr, p.stderr  # the stack shows what blocked
    assert not (run_dir / "job.json").exists() and not (run_dir / "ray_auth_token").exists()
    assert not hub_tmp.exists()
