import io

from rich.console import Console

from rlsync.telemetry.progress import StepProgress


def test_disabled_is_a_silent_noop():
    buf = io.StringIO()
    with StepProgress(10, enabled=False, console=Console(file=buf)) as bar:
        bar.update(1, version=1, reward=0.5, stall_s=1.0)
    assert buf.getvalue() == ""


def test_not_a_tty_means_off():
    assert StepProgress(10, console=Console(file=io.StringIO())).enabled is False


def test_shows_step_version_reward_staleness_sync_stall_and_bytes():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=220)
    with StepProgress(10, enabled=True, console=console) as bar:
        bar.update(3, version=7, reward=0.4567, stall_s=1.234, staleness=0.5, sync_stall_s=0.25, sync_bytes=2.5e6)
    out = buf.getvalue()
    for want in ("3/10", "v7", "reward 0.457", "staleness 0.50", "weight-sync stall 0.25s", "stall 1.23s",
                 "sync 2.5MB"):
        assert want in out, (want, out)
