"""The data path chosen by measurement: transport, streams and send mode per peer class.

Which rlsync path is fastest differs between machines of one kind (docs/performance.md: on one
2-vCPU host the 2-stream zero-copy send led, on another the copying send was 25% faster and `shm`
was twice either), so no constant default can be within 5% of the best everywhere. Instead, a host is
calibrated once: a data-plane server in a second process (rlsync.hub.dataplane.probe, the same source
`python -m rlsync.bench transfer` reads) and this process's reader move `size` bytes (256 MiB) over
loopback with every candidate path (interleaved rounds, median), and `pick` keeps the fastest per
peer class. The result is cached in a small JSON file keyed by host name, kernel release, CPU count
and native engine build (`~/.cache/rlsync/dataplane/`). `python -m rlsync.hub calibrate` measures
(so does the transfer benchmark); a fetch only reads the file (`cached`, from `choose_path`) and,
with none, takes the documented defaults at once: a measurement is ~10 s of both cores here, which
no read should wait for or compete with.

Peer classes: `same_host` (reader and source share a boot: every candidate, shm included) and
`remote` (TCP candidates only). Loopback measures the engine's own CPU cost per byte on both
ends; the remote class uses the fastest TCP path measured there, since no second host is at hand
to measure a real link — a stated rule, not a measurement of the link. The transfer unit size is
not chosen here: the publisher fixes it once per version for every reader (ManifestConfig.chunk_bytes).
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import platform
import socket
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rlsync.hub.private_files import make_private_dirs, open_private, write_private_atomic
from rlsync.hub.protocol.messages import Endpoint

log = logging.getLogger(__name__)

SAME_HOST, REMOTE = "same_host", "remote"
FORMAT = 3
"""Bumped when the candidates, the measurement or the file's layout change: the cache file is named
by it, so a new format measures anew and processes of older code keep reading theirs."""


@dataclass(frozen=True, slots=True)
class PathChoice:
    transport: str
    streams: int = 1
    zero_copy: bool = True
    """Only the native `tcp` send has a copying alternative; the other transports ignore it."""

    @property
    def label(self) -> str:
        if self.transport == "shm":
            return f"shm x{self.streams}"
        if self.transport != "tcp":
            return self.transport
        return f"tcp x{self.streams} {'zero-copy' if self.zero_copy else 'copying'}"


CANDIDATES: tuple[PathChoice, ...] = (
    PathChoice("tcp", 1, True), PathChoice("tcp", 1, False),
    PathChoice("tcp", 2, True), PathChoice("tcp", 2, False),
    PathChoice("tcp", 4, True), PathChoice("tcp", 4, False),
    PathChoice("tcp-py"), PathChoice("shm", 1), PathChoice("shm", 2), PathChoice("shm", 4),
)
REMOTE_TRANSPORTS = ("tcp", "tcp-py")
"""Transports that cross hosts (shm copies out of a process on the same machine)."""


def peer_class(mine: Endpoint, peer: Endpoint) -> str:
    """`same_host` when the two endpoints share a machine boot and host label, else `remote`."""
    return SAME_HOST if mine.same_host(peer) else REMOTE


def _order(c: PathChoice) -> tuple:
    # Among near-equals: fewer threads, then zero-copy (no sender copy on a real NIC), then by name.
    return (c.streams, not c.zero_copy, c.transport)


def pick(measured: dict[PathChoice, list[float]], cls: str, transport: str | None = None,
         tolerance: float = 0.02) -> PathChoice:
    """The path for peer class `cls` given GB/s per candidate: pure and deterministic.

    The candidate with the highest median wins; candidates within `tolerance` of it count as equal
    and the simplest of them (fewest streams, zero-copy, then name) is taken, so noise between
    near-equals does not flip the choice. `transport` restricts the candidates to one transport
    (the one a config forces). E.g. {tcp x2 zero-copy: [3.0], tcp x1 zero-copy: [2.98], shm: [2.0]}
    picks tcp x1 zero-copy for either class.
    """
    if cls not in (SAME_HOST, REMOTE):
        raise ValueError(f"unknown peer class {cls!r}: {SAME_HOST!r} or {REMOTE!r}")
    medians = {c: statistics.median(v) for c, v in measured.items()
               if v and (cls == SAME_HOST or c.transport in REMOTE_TRANSPORTS)
               and (transport is None or c.transport == transport)}
    if not medians:
        raise ValueError(f"no measurement usable for peer class {cls!r}" + (f" and {transport!r}" if transport else ""))
    best = max(medians.values())
    return min((c for c, m in medians.items() if m >= best * (1 - tolerance)), key=_order)


# ------------------------------------------------------------------ measuring
def _measure(size: int, rounds: int, candidates: tuple[PathChoice, ...]) -> dict[PathChoice, list[float]]:
    """GB/s of each usable candidate moving `size` bytes from a source process to this one
    (rlsync.hub.dataplane.probe: a real DataServer, the reader's framing, tickets and checksums)."""
    from rlsync.hub.dataplane.probe import ProbeSource
    from rlsync.hub.errors import TransportUnavailableError
    from rlsync.hub.dataplane.transports import get_transport

    usable = []
    for c in candidates:
        try:
            get_transport(c.transport)
            usable.append(c)
        except TransportUnavailableError:
            pass
    out: dict[PathChoice, list[float]] = {c: [] for c in usable}
    src = ProbeSource(size)
    try:
        usable = [c for c in usable if c.transport in src.endpoint.transports]
        for r in range(rounds + 1):  # round 0 warms up, untimed; rounds interleave the candidates
            for c in usable:
                t = get_transport(c.transport)
                t.zero_copy = c.zero_copy
                g = src.read(t, c.streams)
                if r:
                    out[c].append(g)
    finally:
        src.close()
    return {c: v for c, v in out.items() if v}


# ------------------------------------------------------------------ the cache
def host_key() -> str:
    """Host, kernel, CPU count and the native engine's build: a calibration measured with another
    build (e.g. a stale one whose `shm` ran on one stream) must not choose for this one."""
    from rlsync.hub.dataplane.native import identity
    return f"{socket.gethostname()}-{platform.release()}-{os.cpu_count()}cpu-e{identity()}"


def cache_dir() -> Path:
    base = os.environ.get("RLSYNC_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rlsync")
    return Path(base) / "dataplane"


@dataclass(slots=True)
class Calibration:
    measured: dict[PathChoice, list[float]]
    """GB/s of each candidate per round, over loopback on this host."""
    size_bytes: int
    loadavg: float
    """1-minute load average when the measurement started (a shared machine measures its load too)."""
    when: float
    host: str

    def choice(self, cls: str, transport: str | None = None) -> PathChoice:
        return pick(self.measured, cls, transport)

    def to_json(self) -> dict:
        return {"format": FORMAT, "host": self.host, "when": self.when, "loadavg": self.loadavg,
                "size_bytes": self.size_bytes,
                "measured": [{"path": asdict(c), "gbps": v} for c, v in self.measured.items()],
                "choices": {cls: asdict(self.choice(cls)) for cls in (SAME_HOST, REMOTE)}}  # for people

    @classmethod
    def from_json(cls, d: dict) -> "Calibration":
        if d.get("format") != FORMAT:
            raise ValueError(f"calibration format {d.get('format')} is not {FORMAT}")
        measured = {PathChoice(**m["path"]): [float(x) for x in m["gbps"]] for m in d["measured"]}
        return cls(measured, int(d["size_bytes"]), float(d["loadavg"]), float(d["when"]), str(d["host"]))


CALIBRATION_BYTES = 256 << 20
"""What the calibration moves per read: 32 units of 8 MiB, so per-unit costs and several streams
count as in a model's fetch (at 128 MiB in one process the choice did not predict 1 GiB reads)."""


def calibrate(size: int = CALIBRATION_BYTES, rounds: int = 4) -> Calibration:
    """Measure every candidate here now and pick per peer class (a few seconds on an idle 2-core host:
    the source process's start-up, then 5 rounds of every candidate)."""
    load = os.getloadavg()[0]
    measured = _measure(size, rounds, CANDIDATES)
    cal = Calibration({c: [round(x, 4) for x in v] for c, v in measured.items()}, size, load, time.time(), host_key())
    log.info("data path calibrated at load %.1f: same host %s, remote %s (GB/s: %s)", load,
             cal.choice(SAME_HOST).label, cal.choice(REMOTE).label,
             {c.label: round(statistics.median(v), 2) for c, v in cal.measured.items() if v})
    return cal


FALLBACK_STREAMS = 2
"""Streams where no calibration decides: a transport it did not measure (rdma, cuda_ipc), or a host
without one (the documented defaults: the registry's priority order, this, the zero-copy send)."""


def cache_file() -> Path:
    """This host's calibration file (per format: processes of older code keep their own file)."""
    return cache_dir() / f"{host_key()}-f{FORMAT}.json"


def load_or_calibrate(refresh: bool = False) -> Calibration:
    """This host's calibration: read from the cache file, else measured now and written there (once
    per host: other processes wait on a file lock, then read what it wrote). `python -m rlsync.hub
    calibrate` and the transfer benchmark call this; a fetch never does (it calls `cached`)."""
    from rlsync.hub.dataplane.native import warn_if_stale
    warn_if_stale()
    d = cache_dir()
    make_private_dirs(d)  # 0700 and 0600 below, whatever the umask: this user's files only
    path = cache_file()
    with open_private(d / f"{host_key()}.lock", "a") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        cal, why = (None, "asked to measure again") if refresh else _read(path)
        if cal is None:
            log.info("data-path calibration %s: %s; measuring", path, why)
            cal = calibrate()
            write_private_atomic(path, json.dumps(cal.to_json(), indent=1))
    return cal


_said: set = set()
"""What `cached` has logged in this process."""


def cached() -> Calibration | None:
    """This host's cached calibration, or None: then the documented defaults apply. Reads, never
    measures and never waits for a measurement in progress (the file is replaced atomically), so a
    fetch can call it per source; a host is measured by `python -m rlsync.hub calibrate`."""
    if "engine" not in _said:
        from rlsync.hub.dataplane.native import warn_if_stale
        _said.add("engine")
        warn_if_stale()
    path = cache_file()
    cal, why = _read(path)
    if cal is None and (path, why) not in _said:  # per source of every fetch: say it once
        _said.add((path, why))
        log.info("data-path calibration %s: %s; using the registry's priority, %d streams, zero-copy send "
                 "(`python -m rlsync.hub calibrate` measures this host)", path, why, FALLBACK_STREAMS)
    return cal


def provisional(measured_at_load: float, load_now: float, cpus: int) -> bool:
    """A calibration taken on a saturated machine (load above the CPU count) is not trusted once the
    load is at most half of that (the next `calibrate` measures again): contention decided such a
    measurement as much as the paths did. E.g. provisional(10.4, 1.0, 2) is True; provisional(1.5, 0.2, 2) False."""
    return measured_at_load > cpus and load_now <= measured_at_load / 2


def _read(path: Path) -> tuple[Calibration | None, str]:
    """The calibration in `path`, or None and why it is not usable."""
    try:
        cal = Calibration.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None, "none cached"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"unreadable ({e})"
    if provisional(cal.loadavg, os.getloadavg()[0], os.cpu_count() or 1):
        return None, f"taken at load {cal.loadavg:.1f}, provisional"
    return cal, ""


def choose_path(mine: Endpoint, peer: Endpoint, forced: str | None = None, streams: int | None = None,
                zero_copy: bool | None = None, calibration: Calibration | None = None):
    """(transport, streams) a reader at `mine` uses towards `peer`: the measured best for the peer's
    class, with whatever the config fixes (`forced` transport, `streams`, `zero_copy`) taking
    precedence. The transport's `zero_copy` is set: the reader asks the source for that send mode.
    `calibration`: the measurement to follow (default: this host's cached one, read but never taken
    here); without one, the registry's priority order, FALLBACK_STREAMS and the zero-copy send.
    """
    from rlsync.hub.errors import TransportUnavailableError
    from rlsync.hub.dataplane.transports import choose_transport, get_transport

    cal = calibration
    if cal is None and not (forced is not None and streams is not None and zero_copy is not None):
        cal = cached()
    cls = peer_class(mine, peer)
    t = None
    if forced is None and cal is not None:
        try:
            t = get_transport(cal.choice(cls).transport)
            t = t if t.usable_between(mine, peer) else None
        except TransportUnavailableError:
            t = None
    if t is None:
        t = choose_transport(mine, peer, forced)
    try:
        best = cal.choice(cls, t.name) if cal is not None else None
    except ValueError:  # not measured (rdma, cuda_ipc), or shm named for a remote peer by force
        best = None
    t.zero_copy = zero_copy if zero_copy is not None else (best.zero_copy if best else True)
    k = streams if streams is not None else (best.streams if best else FALLBACK_STREAMS)
    return t, k
