"""`wait_for`: the one way a test waits on a condition instead of sleeping (a loaded 2-core machine makes
fixed sleeps race). Also the `wait_until` fixture (tests/conftest.py)."""
import time


def wait_for(cond, timeout_s: float = 30.0, what: str = "condition", every_s: float = 0.02, fail: bool = True):
    """Poll `cond` every `every_s` until it is true; returns the seconds it took. Past `timeout_s`: an
    AssertionError naming `what`, or (`fail=False`, for a probe whose failure the test handles) None."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 >= timeout_s:
            if fail:
                raise AssertionError(f"{what}: not within {timeout_s}s")
            return None
        time.sleep(every_s)
    return time.monotonic() - t0
