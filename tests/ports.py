"""`free_port`: a TCP port free on loopback now, for a test that must name a hub's port before starting
it (to restart a hub on the same address). Racy by nature; the hub tests' one copy (tests/ is on
sys.path: `from ports import free_port`). The RL side has its own, `rlsync.trainer.free_port`."""
import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
