"""Control-plane RPC: ZeroMQ (ROUTER on the hub, DEALER per client) carrying msgpack maps.

Why ZeroMQ + msgpack (docs/architecture.md): the hub is one single-threaded event loop that must
answer some calls *later* (a release waits for in-flight reads to drain) while serving others;
a ROUTER socket gives exactly that (reply to any peer at any time) with no framing of ours, and
msgpack carries bytes (tickets, manifests) without base64. gRPC would bring codegen and a thread
pool for a dozen small messages.

Request:  {"id": int, "op": str, "token": str, "args": {...}, "wait_s": float (this try's time)}
Reply:    {"id": int, "ok": True, "result": ...} | {"id": int, "ok": False, "error": [code, message]}
"""
from __future__ import annotations

import errno
import itertools
import logging
import os
import secrets
import socket
import stat
import threading
import time

import msgpack
import zmq
from zmq.utils.monitor import recv_monitor_message

from rlsync.hub.protocol import connection_watch
from rlsync.hub.protocol.connection_watch import monitor, unmonitor
from rlsync.hub.errors import AuthError, HubUnavailableError, InvalidArgumentError, ProtocolError, error_from_code
from rlsync.hub.protocol.args import check_args

MAX_MESSAGE_BYTES = 64 << 20
log = logging.getLogger(__name__)


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes):
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as e:
        raise ProtocolError(f"malformed control message: {type(e).__name__}") from None


def read_token(path: str) -> str:
    """The shared RPC token from `path` (a client never creates one: a missing file is an error).

    A token file others may read is tightened to 0600 with a warning (or, when this user may not
    chmod it — another owner, a read-only mount — used with a warning saying what to fix)."""
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError(f"token_file must be a path, got {path!r}")
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise AuthError(f"token file {path} does not exist (the hub creates it; pass its path)") from None
    except OSError as e:
        raise AuthError(f"cannot read token file {path}: {e}") from None
    try:
        _tighten(fd, path)
        with os.fdopen(fd) as f:
            tok = f.read().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise AuthError(f"cannot read token file {path}: {e}") from None
    if not tok:
        raise AuthError(f"token file {path} is empty")
    return tok


def _tighten(fd: int, path) -> None:
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode) or not mode & 0o077:
        return
    try:
        os.fchmod(fd, 0o600)
        log.warning("token file %s was mode %03o (others could read the hub's token): tightened to 0600",
                    path, mode & 0o777)
    except OSError as e:
        log.warning("token file %s is mode %03o (others can read the hub's token) and cannot be tightened "
                    "(%s): make it 0600", path, mode & 0o777, e.strerror)


def read_or_create_token(path: str) -> str:
    """The hub's side: the shared RPC token read from `path`, or created there (mode 0600) if absent."""
    if os.path.exists(path):
        return read_token(path)
    tok = secrets.token_hex(24)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:  # a missing directory, no permission: the caller's path to fix
        raise InvalidArgumentError(f"cannot create token file {path} ({e.strerror}); "
                                   "pass a file path in an existing directory") from None
    with os.fdopen(fd, "w") as f:
        f.write(tok + "\n")
    return tok


def check_port(port, *, bind: bool = False) -> int:
    """`port` as an int in 1..65535 (0 too for `bind`: pick a free one). ZeroMQ would take 99999 and
    use 99999 mod 65536 while everything else names 99999."""
    lo = 0 if bind else 1
    if not isinstance(port, int) or isinstance(port, bool) or not lo <= port <= 65535:
        raise InvalidArgumentError(f"port must be an int in {lo}..65535, got {port!r}")
    return port


def wait_port_released(address: str, timeout_s: float = 2.0) -> None:
    """Return once nothing listens on `address`'s port any more (or after `timeout_s`). ZeroMQ closes a
    socket's listener in its I/O thread after `close()` returns: a hub restarted on its port at once
    would otherwise race the old listener (EADDRINUSE)."""
    host, _, port = address[len("tcp://"):].rpartition(":")
    end = time.monotonic() + timeout_s
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZeroMQ binds: TIME_WAIT is no obstacle
            try:
                s.bind((host, int(port)))
                return
            except OSError as e:
                if e.errno != errno.EADDRINUSE or time.monotonic() >= end:
                    return  # free, or not ours to judge (a name, IPv6): no wait
        time.sleep(0.005)


def check_address(address) -> str:
    """A hub address `tcp://host:port`, port in 1..65535; InvalidArgumentError otherwise."""
    if not isinstance(address, str) or not address.startswith("tcp://"):
        raise InvalidArgumentError(f"hub address must be a string like tcp://host:port, got {address!r}")
    host, _, port = address[len("tcp://"):].rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise InvalidArgumentError(f"bad hub address {address!r}: expected tcp://host:port with a port in 1..65535")
    return address


class RpcChannel:
    """One DEALER socket to the hub; thread-safe (calls are serialized); typed errors back.

    Until the hub at `address` has answered once, a call gives up after one try (`timeout_s`): an
    address where no hub ever answered is a mistake to report, not a restart to wait out. After
    that, calls retry up to `deadline_s` (a hub restart or failover).
    """

    def __init__(self, address: str, token: str, timeout_s: float = 10.0, deadline_s: float = 60.0) -> None:
        self.address, self.token, self.timeout_s, self.deadline_s = address, token, timeout_s, deadline_s
        self._ctx = zmq.Context.instance()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._sock = None
        self._try_s = timeout_s
        self.answered = False
        """Whether the hub at `address` ever answered this channel."""
        self.retried = False
        self.observers: list = []
        """Called as f(op, args, result) after each answered call (what a test or a tool watches)."""
        with self._lock:
            self._socket()  # a malformed address fails here, typed

    def _socket(self):
        if self._sock is None:
            check_address(self.address)
            s = self._ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
            s.setsockopt(zmq.RECONNECT_IVL, connection_watch.RECONNECT_IVL_MS)
            try:
                s.connect(self.address)
            except zmq.ZMQError as e:
                s.close(0)
                raise InvalidArgumentError(f"bad hub address {self.address!r} ({e}); expected tcp://host:port") from None
            self._sock = s
        return self._sock

    def call(self, op: str, *, attempt_s: float | None = None, deadline_s: float | None = None, **args):
        """Call `op` on the hub; retry with backoff while it is unreachable, up to `deadline_s`.

        `attempt_s` bounds one try (default: the channel's timeout); `deadline_s` the whole call
        (default: the channel's deadline). Past it: HubUnavailableError. Typed hub errors are raised
        at once. A retried call may reach the hub twice; every hub operation tolerates that.
        """
        check_args(op, args)  # what the hub would refuse, refused here (e.g. version=2**70), typed
        attempt = self.timeout_s if attempt_s is None else attempt_s
        t0 = time.monotonic()
        deadline = t0 + (self.deadline_s if deadline_s is None else deadline_s)
        delay, tries = 0.1, 0
        self.retried = False
        while True:
            left = deadline - time.monotonic()
            # The first try gets its full attempt time while no hub ever answered here, with no retry
            # deadline (one try), or when the caller asked for a long try (`attempt_s`: a parked
            # `wait_latest`); otherwise every try gets at most what the deadline leaves.
            bounded = self.retried or (self.answered and deadline > t0 and attempt_s is None)
            try:
                out = self._call_once(op, min(attempt, max(0.05, left)) if bounded else attempt, args)
                for observe in self.observers:
                    observe(op, args, out)
                return out
            except HubUnavailableError as e:
                if not self.answered:
                    raise HubUnavailableError(f"no hub answered at {self.address} within {attempt:.1f}s "
                                              f"({op!r}); is one running there?") from None
                tries += 1
                self.retried = True
                if time.monotonic() + delay >= deadline:
                    if tries == 1:
                        raise
                    raise HubUnavailableError(f"{e} (gave up after {tries} tries in {time.monotonic() - t0:.1f}s)") from None
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _call_once(self, op: str, timeout: float, args: dict):
        with self._lock:
            sock = self._socket()
            # Tells this call that the connection to the hub dropped while it waited: the request went
            # with the hub (restart, kill -9), so it is sent again at once instead of waiting out its
            # try (seconds: a release's answer, or any call in flight when the hub died). Watched only
            # during the call: an idle channel queues no events (hub/protocol/connection_watch.py says why).
            mon = monitor(sock, zmq.EVENT_DISCONNECTED)
            try:
                return self._exchange(sock, mon, op, timeout, args)
            finally:
                unmonitor(sock, mon)
                if self._sock is not sock:  # dropped: a late reply must not answer the next call
                    sock.close(0)

    def _exchange(self, sock, mon, op: str, timeout: float, args: dict):
        self._try_s = timeout
        rid = next(self._ids)
        self._send(sock, rid, op, args)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(mon, zmq.POLLIN)
        deadline = time.monotonic() + timeout
        while True:
            wait = max(0.0, deadline - time.monotonic())
            ready = dict(poller.poll(int(wait * 1000)))
            if not ready:
                self._sock = None  # the caller closes it
                raise HubUnavailableError(f"hub at {self.address} did not answer {op!r} within {timeout:.1f}s")
            if mon in ready:
                if recv_monitor_message(mon)["event"] == zmq.EVENT_DISCONNECTED and self.answered:
                    # The hub went while it had our request: send it again now; ZeroMQ delivers it the
                    # moment a hub listens there again. (It may reach a hub twice: every operation
                    # tolerates that, as for any retry.)
                    self.retried = True
                    rid = next(self._ids)
                    self._send(sock, rid, op, args)
                continue
            frames = sock.recv_multipart()
            msg = unpack(frames[-1])
            if not isinstance(msg, dict):
                raise ProtocolError(f"hub at {self.address} sent a non-map reply")
            self.answered = True
            if msg.get("id") != rid:
                continue  # a stale reply to a call that timed out earlier
            if msg.get("ok"):
                return msg.get("result")
            code, text = msg.get("error", ["hub_error", "unknown error"])
            raise error_from_code(code, text)

    def _send(self, sock, rid: int, op: str, args: dict) -> None:
        """Queue the request without ever blocking. A DEALER with no connection to queue on blocks its
        send for good: libzmq 4.3.5 stops reconnecting a socket after a handshake with an incompatible
        peer (another ZeroMQ service that took the hub's port during an outage). Such a socket is
        dropped and the try fails; the retry makes a new one (tests/hub/protocol/test_port_squatter.py)."""
        try:
            # wait_s: this try's time; the hub answers a request it parks (waiting for a holder) before it
            sock.send_multipart([b"", pack({"id": rid, "op": op, "token": self.token, "args": args,
                                            "wait_s": self._try_s})], zmq.NOBLOCK)
        except zmq.Again:
            self._sock = None  # the caller closes it
            raise HubUnavailableError(f"no connection to the hub at {self.address} to send {op!r} on") from None

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close(0)
                self._sock = None
