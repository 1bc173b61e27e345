"""A control channel left idle (or forgotten) never stalls the process's ZeroMQ.

ZeroMQ's I/O thread writes socket-monitor events with a blocking send into a queue of ~2000. A channel
whose hub is gone keeps reconnecting; when the hub's old port belongs to a listener that accepts and
drops (another server took the port), every reconnect is one "disconnected" event. Nobody read the
channel's monitor between calls, so after ~2000 drops the I/O thread blocked for good and every
ZeroMQ socket of the process went silent: on CI, fresh embedded hubs logged "hub serving" and then
answered no join for the rest of the worker (15 tests). Here the reconnect interval is 1 ms instead of
50 (to reach that count in seconds), and the port's new owner is a plain TCP listener.
"""
import socket
import threading
import time

from rlsync.hub import HubClient, Location, start_embedded_hub

from rlsync.hub.protocol import connection_watch
from rlsync.hub.protocol.connection_watch import HubConnectionWatch
from rlsync.hub.protocol.rpc import RpcChannel

DROPS = 3000  # well past ZeroMQ's default monitor queue (1000 + 1000 messages)


class _AcceptAndDrop:
    """Listens on `port` (once it is free), accepts every connection and closes it at once."""

    def __init__(self, port: int) -> None:
        self.drops = 0
        self._srv = socket.socket()
        self._srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        end = time.monotonic() + 10
        while True:  # the stopped hub's listening socket is closed by ZeroMQ's reaper, a moment later
            try:
                self._srv.bind(("127.0.0.1", port))
                break
            except OSError:
                assert time.monotonic() < end, f"port {port} not free 10 s after the hub stopped"
                time.sleep(0.01)
        self._srv.listen(512)
        self._srv.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._srv.accept()
            except OSError:
                continue
            conn.close()
            self.drops += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._srv.close()


def test_idle_channel_whose_hub_port_is_taken_by_another_listener_never_stalls_zeromq(monkeypatch):
    monkeypatch.setattr(connection_watch, "RECONNECT_IVL_MS", 1)
    old = start_embedded_hub()
    idle = RpcChannel(old.address, old.token)
    idle.call("ping")  # answered once: from now on the channel reconnects by itself, forever
    assert idle.answered
    watch = HubConnectionWatch(old.address)  # a heartbeat's watch, not read meanwhile
    port = int(old.address.rsplit(":", 1)[1])
    old.stop()
    listener = _AcceptAndDrop(port)
    wedged = True
    try:
        seen, t_seen = 0, time.monotonic()
        while listener.drops < DROPS:  # the idle channel and the watch reconnect and are dropped
            if listener.drops != seen:
                seen, t_seen = listener.drops, time.monotonic()
            assert time.monotonic() - t_seen < 10, (
                f"reconnects stopped after {seen} drops: ZeroMQ's I/O thread is blocked (monitor queue full)")
            time.sleep(0.05)
        # The process's ZeroMQ still works: a fresh hub answers a fresh client at once.
        with start_embedded_hub() as hub:
            c = HubClient(hub.address, hub.token)
            try:
                c.join(Location(host="h0"), "after-flood")
                assert c.stats()["replicas"] == 0
            finally:
                c.leave()
        wedged = False
    finally:
        listener.close()
        if not wedged:  # (with ZeroMQ's I/O thread blocked, stopping a monitor would hang this thread too)
            idle.close()
            watch.close()
