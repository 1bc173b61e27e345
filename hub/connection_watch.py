"""`HubConnectionWatch`: notice the moment a restarted hub listens again.

The client's heartbeat thread waits on it between heartbeats. ZeroMQ reconnects a DEALER socket by
itself; its socket monitor reports the TCP connection dropping and coming back. A heartbeat sent
while the hub was down would be lost and time out; waiting for "connected again" instead lets the
worker re-join and re-register its replicas within one reconnect interval of the restart.
"""
from __future__ import annotations

import time

import zmq
from zmq.utils.monitor import recv_monitor_message


class HubConnectionWatch:
    """Watches the TCP connection to the hub with ZeroMQ's socket monitor (a DEALER that never sends).

    A restarted hub is noticed the moment it listens again (ZeroMQ reconnects every 50 ms), so the
    heartbeat re-joins and re-registers at once instead of after a timed-out heartbeat."""

    def __init__(self, address: str) -> None:
        self._sock = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RECONNECT_IVL, 50)
        self._mon = self._sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self._sock.connect(address)
        self.down = False

    def wait_reconnect(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s`; True as soon as the hub is reachable again after a disconnect."""
        end = time.monotonic() + timeout_s
        while (left := end - time.monotonic()) > 0:
            if not self._mon.poll(max(1, int(left * 1000))):
                return False
            event = recv_monitor_message(self._mon)["event"]
            if event == zmq.EVENT_DISCONNECTED:
                self.down = True
            elif event == zmq.EVENT_CONNECTED and self.down:
                self.down = False
                return True
        return False

    def close(self) -> None:
        try:
            self._sock.disable_monitor()
        except Exception:  # noqa: BLE001 - closing anyway
            pass
        self._mon.close(0)
        self._sock.close(0)
