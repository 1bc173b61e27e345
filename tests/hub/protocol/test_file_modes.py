"""Files the hub, its clients and the data-path calibration create are 0600 (directories 0700)
whatever the umask, and a token file found looser is tightened to 0600 with a warning.

On 0f12831 a token file at 0644 stayed 0644 without a word, and under umask 000 the calibration's
lock file, cache file and directories, a run's log file and the gateway's stats file were created
0666 / 0777 (docs/integration.md, "Files and their modes").
"""
import logging
import os
import signal
import stat
import subprocess
import sys

from rlsync.hub import HubClient, Location
from rlsync.hub.protocol.rpc import read_or_create_token, read_token

CHILD = r"""
import logging, os, sys
tmp = sys.argv[1]
import rlsync.hub.dataplane.tuning as T
real = T.calibrate
T.calibrate = lambda: real(size=8 << 20, rounds=1)  # small: a test, not a figure; the files are the point
T.load_or_calibrate()
from rlsync.hub.logs import quiet_console, setup_logging
setup_logging()
quiet_console(("rlsync",), os.path.join(tmp, "run", "logs", "worker0.log"))  # a worker's log (workers/group.py)
logging.getLogger("rlsync.test").warning("logged")
from rlsync.hub.private_files import write_private_atomic  # how the gateway writes --stats (federation_cli)
write_private_atomic(os.path.join(tmp, "gateway.json"), "{}")
"""


def _modes(root) -> dict[str, int]:
    out = {}
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(d, name)
            out[os.path.relpath(p, root)] = stat.S_IMODE(os.lstat(p).st_mode)
    return out


def test_a_loose_token_file_is_tightened_to_0600_with_a_warning(tmp_path, caplog):
    for mode, read in ((0o644, read_or_create_token), (0o640, read_token)):  # the hub's side, a client's side
        path = tmp_path / f"hub-{mode:o}.token"
        path.write_text("s3cret\n")
        os.chmod(path, mode)
        with caplog.at_level(logging.WARNING, logger="rlsync.hub.protocol.rpc"):
            assert read(str(path)) == "s3cret"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert any(f"{mode:03o}" in r.getMessage() and "0600" in r.getMessage() for r in caplog.records), caplog.text
        caplog.clear()
        read(str(path))  # already private: nothing to say
        assert not caplog.records


def test_everything_created_under_umask_000_is_private(tmp_path):
    env = {**os.environ, "RLSYNC_CACHE_DIR": str(tmp_path / "cache" / "rlsync"), "RLSYNC_LOG": "WARNING"}
    hub = subprocess.Popen([sys.executable, "-m", "rlsync.hub", "serve", "--token-file", str(tmp_path / "hub.token"),
                            "--journal", str(tmp_path / "hub.db")],
                           stdout=subprocess.PIPE, text=True, env=env, umask=0)
    try:
        line = hub.stdout.readline()
        assert "listening on" in line, line
        c = HubClient(line.split()[-1], token_file=str(tmp_path / "hub.token"))
        c.join(Location(dc="dc0", rack="r0", host="h0"), "w")
        c.leave()
        c.close()
        child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], env=env, umask=0,
                               capture_output=True, text=True, timeout=300)
        assert child.returncode == 0, child.stderr[-2000:]
    finally:
        hub.send_signal(signal.SIGTERM)
        assert hub.wait(timeout=60) == 0
    modes = _modes(tmp_path)
    expected = {"hub.token", "hub.db", "hub.db.ticket-key", "cache", "cache/rlsync", "cache/rlsync/dataplane",
                "run", "run/logs", "run/logs/worker0.log", "gateway.json"}
    assert expected <= set(modes), modes
    assert any(p.endswith(".lock") for p in modes) and any(p.endswith(".json") and "dataplane" in p for p in modes)
    loose = {p: oct(m) for p, m in modes.items()
             if m != (0o700 if os.path.isdir(tmp_path / p) else 0o600)}
    assert not loose, loose
