"""`HubConnectionWatch`: notice the moment a restarted hub listens again; `monitor`: ZeroMQ socket
events that can never stall the process.

The client's heartbeat thread waits on the watch between heartbeats. ZeroMQ reconnects a DEALER
socket by itself; its socket monitor reports the TCP connection dropping and coming back. A heartbeat
sent while the hub was down would be lost and time out; waiting for "connected again" instead lets
the worker re-join and re-register its replicas within one reconnect interval of the restart.

Why `monitor` and not pyzmq's `get_monitor_socket`: ZeroMQ's I/O thread writes each monitor event with
a *blocking* send into an inproc PAIR whose queue holds ~2000 events by default. Nobody reading it
(an idle or forgotten channel whose old hub port now belongs to a listener that accepts and drops:
20 drops a second at our 50 ms reconnect) fills it in ~100 s, and then the I/O thread blocks for
good: every ZeroMQ socket of the process goes silent — its clients, and an embedded hub that still
logs "hub serving" but answers nobody (what one CI worker showed on 2026-11-23: 15 tests timed out
joining fresh hubs, for the rest of that worker). So our monitor queues are unbounded, and a control
channel monitors only during a call (tests/hub/protocol/test_monitor_flood.py).
"""
from __future__ import annotations

import itertools
import os
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from rlsync.hub.protocol.waker import Waker

_monitor_ids = itertools.count(1)

RECONNECT_IVL_MS = 50
"""How often ZeroMQ retries a dropped connection to the hub (the control channel and the watch)."""


def monitor(sock: zmq.Socket, events: int) -> zmq.Socket:
    """A PAIR socket receiving `sock`'s `events`, with an unbounded queue (RCVHWM 0: the I/O thread's
    send never blocks). Read it while the events matter; `unmonitor` as soon as they do not."""
    addr = f"inproc://rlsync-monitor-{os.getpid()}-{next(_monitor_ids)}"  # never reused: no bind race
    sock.monitor(addr, events)
    try:
        mon = sock.context.socket(zmq.PAIR)
    except zmq.ZMQError:
        sock.monitor(None, 0)  # a monitor with no reader would block the I/O thread at its first event
        raise
    try:
        mon.setsockopt(zmq.LINGER, 0)
        mon.setsockopt(zmq.RCVHWM, 0)  # set before connect: an inproc queue is unbounded when either end is 0
        mon.connect(addr)
    except zmq.ZMQError:
        unmonitor(sock, mon)
        raise
    return mon


def unmonitor(sock: zmq.Socket, mon: zmq.Socket) -> None:
    """Stop `sock`'s monitor, then close its PAIR (in that order: no event is ever sent to a closed end)."""
    try:
        sock.monitor(None, 0)
    except zmq.ZMQError:
        pass
    mon.close(0)


class HubConnectionWatch:
    """Watches the TCP connection to the hub with ZeroMQ's socket monitor (a DEALER that never sends).

    A restarted hub is noticed the moment it listens again (ZeroMQ reconnects every 50 ms), so the
    heartbeat re-joins and re-registers at once instead of after a timed-out heartbeat.

    While the hub is down the socket is made anew every `RENEW_S`: libzmq 4.3.5 stops reconnecting a
    socket for good after a handshake with an incompatible peer (another ZeroMQ service that took the
    hub's port meanwhile), and a watch stuck "down" would keep the heartbeat from ever trying again
    (tests/hub/protocol/test_port_squatter.py)."""

    RENEW_S = 1.0

    def __init__(self, address: str) -> None:
        self.address = address
        self.down = False
        self._down_since = 0.0
        self._waker = Waker()  # `interrupt()`: a leaving worker does not wait out the heartbeat period
        self._open()

    def _open(self) -> None:
        self._sock = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
        self._mon = monitor(self._sock, zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self._sock.connect(self.address)

    def _renew_if_stuck(self) -> None:
        if self.down and time.monotonic() - self._down_since > self.RENEW_S:
            self._close_socket()
            self._open()
            self._down_since = time.monotonic()

    def wait_reconnect(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s`; True as soon as the hub is reachable again after a disconnect.
        Every event already queued is read first (a flapping connection queues them faster than one
        per heartbeat), so `down` is the connection's latest state."""
        end = time.monotonic() + timeout_s
        back = False
        while True:
            while self._mon.poll(0):
                event = recv_monitor_message(self._mon)["event"]
                if event == zmq.EVENT_DISCONNECTED:
                    if not self.down:
                        self._down_since = time.monotonic()
                    self.down = True
                elif event == zmq.EVENT_CONNECTED and self.down:
                    self.down, back = False, True
            if back and not self.down:
                return True
            self._renew_if_stuck()
            left = end - time.monotonic()
            if left <= 0:
                return False
            wait = min(left, self.RENEW_S) if self.down else left  # down: wake to renew a stuck socket
            poller = zmq.Poller()
            poller.register(self._mon, zmq.POLLIN)
            poller.register(self._waker.fd, zmq.POLLIN)
            ready = dict(poller.poll(max(1, int(wait * 1000))))
            if self._waker.fd in ready:
                self._waker.clear()
                return False  # interrupted: the caller looks at why (its stop flag)
            if not ready and not self.down:
                return False

    def interrupt(self) -> None:
        """Wake a `wait_reconnect` in another thread now (it returns False). Safe after `close`."""
        self._waker.wake()

    def _close_socket(self) -> None:
        unmonitor(self._sock, self._mon)
        self._sock.close(0)

    def close(self) -> None:
        self._close_socket()
        self._waker.close()
