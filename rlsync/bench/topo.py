"""Emulated multi-host topology: network namespaces, veth pairs, bridges and `tc tbf` shaping.

    spec = TopologySpec.from_yaml('''
      nic_rate: 250mbit          # every host's NIC, each direction
      dc_link_rate: 25mbit       # every DC's uplink to the WAN, each direction
      dcs:
        dc0: {r0: [hub, trainer]}
        dc1: {r0: [ro0, ro1]}
    ''')
    with Topology(spec) as topo:                          # builds; tears down on exit / Ctrl-C / error
        p = topo.popen("ro0", [sys.executable, "-m", "..."])   # `ip netns exec <ns> ...`
        topo.ip("trainer")                                # '10.77.0.2'

What it builds (all of it inside namespaces it creates; nothing is added to the caller's namespace):
- one namespace per host, named `rls<pid>-<host>`, with `lo` up and `eth0` = 10.77.x.y/16;
- one `fabric` namespace holding a bridge per rack, a bridge per DC and, with several DCs, a `wan`
  bridge. Each host's `eth0` is a veth whose peer sits in its rack bridge; racks join their DC
  bridge over a veth (optionally shaped by `rack_link_rate`); DCs join `wan` over a veth shaped by
  `dc_link_rate`. Everything is one L2 segment, so no routing and no route out: the fabric has no
  address and no link to the caller's namespace, which is why no packet can leak to a real NIC.
- shaping: `tbf` on egress of *both* ends of every shaped veth (tbf shapes egress only), so a
  host's upload is shaped on its `eth0` and its download on the fabric-side peer.

This kernel has no `netem`, so the emulator adds no latency; links are rate-shaped only.
Teardown kills the processes started with `popen`, then deletes the namespaces (which removes
their veths and bridges). It runs on `with` exit, on SIGINT/SIGTERM (turned into exceptions) and at
interpreter exit; `reap_stale()` deletes namespaces left by a process that died with SIGKILL.
Needs root (CAP_NET_ADMIN) and iproute2; `check_support()` says what is missing.
"""
from __future__ import annotations

import atexit
import ipaddress
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

PREFIX = "rls"
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,15}$")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]?)(bit|bps)?\s*$", re.IGNORECASE)


def parse_rate(text: str | int | float) -> int:
    """'250mbit' / '1gbit' / '800kbit' / 1e9 -> bits per second. ('bps' means bytes/s as in tc.)"""
    if isinstance(text, (int, float)):
        return int(text)
    m = _RATE.match(str(text))
    if not m:
        raise ValueError(f"bad rate {text!r}: use e.g. 250mbit, 1gbit")
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}[m.group(2).lower()]
    per_byte = 8 if (m.group(3) or "").lower() == "bps" else 1
    return int(float(m.group(1)) * scale * per_byte)


@dataclass(frozen=True, slots=True)
class HostSpec:
    name: str
    dc: str
    rack: str
    nic_rate_bps: int


@dataclass(slots=True)
class TopologySpec:
    hosts: list[HostSpec]
    dc_link_rate_bps: int | None = None
    """Each DC's uplink to the WAN bridge (each direction); None = unshaped."""
    rack_link_rate_bps: int | None = None
    """Each rack's uplink to its DC bridge; None = unshaped (a non-blocking DC fabric)."""
    subnet: str = "10.77.0.0/16"
    """Addresses of the hosts' eth0; reachable only inside these namespaces."""

    @classmethod
    def from_dict(cls, d: dict) -> "TopologySpec":
        nic = parse_rate(d.get("nic_rate", "1gbit"))
        hosts = []
        for dc, racks in (d.get("dcs") or {}).items():
            for rack, names in (racks or {}).items():
                for h in names:
                    h = h if isinstance(h, dict) else {"name": h}
                    hosts.append(HostSpec(str(h["name"]), str(dc), str(rack),
                                          parse_rate(h.get("nic_rate", nic))))
        spec = cls(hosts,
                   parse_rate(d["dc_link_rate"]) if d.get("dc_link_rate") else None,
                   parse_rate(d["rack_link_rate"]) if d.get("rack_link_rate") else None,
                   str(d.get("subnet", "10.77.0.0/16")))
        spec.validate()
        return spec

    @classmethod
    def from_yaml(cls, text: str) -> "TopologySpec":
        import yaml
        return cls.from_dict(yaml.safe_load(text))

    def validate(self) -> None:
        if not self.hosts:
            raise ValueError("topology has no hosts")
        names = [h.name for h in self.hosts]
        for n in names:
            if not _NAME.match(n) or n == "fabric":
                raise ValueError(f"host name {n!r}: lowercase letters, digits, '-', <= 16 chars, not 'fabric'")
        if len(set(names)) != len(names):
            raise ValueError("host names must be unique")
        net = ipaddress.ip_network(self.subnet)
        if not net.is_private or net.num_addresses < len(self.hosts) + 2:
            raise ValueError(f"subnet {self.subnet} must be private and hold {len(self.hosts)} hosts")
        for h in self.hosts:
            if h.nic_rate_bps <= 0:
                raise ValueError(f"host {h.name}: NIC rate must be > 0")

    @property
    def dcs(self) -> list[str]:
        return list(dict.fromkeys(h.dc for h in self.hosts))

    def racks(self, dc: str) -> list[str]:
        return list(dict.fromkeys(h.rack for h in self.hosts if h.dc == dc))


def check_support() -> str | None:
    """None if this process can build topologies, else the reason it cannot."""
    if os.geteuid() != 0:
        return "needs root (CAP_NET_ADMIN) to create network namespaces"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found: apt-get install -y iproute2"
    return None


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({r.returncode}): {r.stderr.strip()}")
    return r


def list_namespaces(prefix: str = PREFIX) -> list[str]:
    out = _run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_stale() -> list[str]:
    """Delete namespaces of topologies whose building process is gone (e.g. killed with SIGKILL)."""
    gone = []
    for ns in list_namespaces():
        m = re.match(rf"^{PREFIX}(\d+)-", ns)
        if m and not _pid_alive(int(m.group(1))):
            for pid in _run("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _run("ip", "netns", "del", ns, check=False)
            gone.append(ns)
    if gone:
        log.warning("reaped %d stale namespaces: %s", len(gone), " ".join(gone))
    return gone


def _tbf(ns: str, dev: str, rate_bps: int) -> None:
    # burst: >= one GSO super-packet and ~2 ms of traffic at the rate; limit: ~50 ms of queue.
    burst = max(128 * 1024, rate_bps // 8 // 500)
    _run("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
         "rate", f"{rate_bps}bit", "burst", str(burst), "latency", "50ms")


@dataclass
class Topology:
    """A built topology. Use as a context manager; `teardown()` is idempotent."""

    spec: TopologySpec
    tag: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}")
    built: bool = False
    namespaces: list[str] = field(default_factory=list)
    addresses: dict[str, str] = field(default_factory=dict)
    procs: list[subprocess.Popen] = field(default_factory=list)

    def __enter__(self) -> "Topology":
        self.build()
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    # ---------------------------------------------------------------- names
    @property
    def fabric(self) -> str:
        return f"{self.tag}-fabric"

    def ns(self, host: str) -> str:
        if host not in self.addresses:
            raise KeyError(f"no host {host!r} in this topology")
        return f"{self.tag}-{host}"

    def ip(self, host: str) -> str:
        return self.addresses[host]

    def host(self, name: str) -> HostSpec:
        return next(h for h in self.spec.hosts if h.name == name)

    # ---------------------------------------------------------------- build / teardown
    def build(self) -> "Topology":
        why = check_support()
        if why:
            raise PermissionError(why)
        reap_stale()
        self._install_handlers()
        try:
            self._build()
        except BaseException:
            self.teardown()
            raise
        self.built = True
        log.info("topology %s: %d hosts in %d DCs, subnet %s", self.tag, len(self.spec.hosts),
                 len(self.spec.dcs), self.spec.subnet)
        return self

    def _add_ns(self, ns: str) -> None:
        _run("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        _run("ip", "-n", ns, "link", "set", "lo", "up")

    def _bridge(self, name: str) -> None:
        f = self.fabric
        _run("ip", "-n", f, "link", "add", name, "type", "bridge", "stp_state", "0", "forward_delay", "0")
        _run("ip", "-n", f, "link", "set", name, "up")

    def _link(self, a: str, b: str, rate_bps: int | None) -> None:
        """A veth between bridges a and b, both in the fabric; shaped on both ends if rate given."""
        f = self.fabric
        ia, ib = f"{a}-{b}"[:15], f"{b}-{a}"[:15]
        _run("ip", "-n", f, "link", "add", ia, "type", "veth", "peer", "name", ib)
        for dev, br in ((ia, a), (ib, b)):
            _run("ip", "-n", f, "link", "set", dev, "master", br)
            _run("ip", "-n", f, "link", "set", dev, "up")
            if rate_bps:
                _tbf(f, dev, rate_bps)

    def _build(self) -> None:
        spec = self.spec
        net = ipaddress.ip_network(spec.subnet)
        self._add_ns(self.fabric)
        multi_dc = len(spec.dcs) > 1
        if multi_dc:
            self._bridge("wan")
        for di, dc in enumerate(spec.dcs):
            self._bridge(f"d{di}")
            if multi_dc:
                self._link(f"d{di}", "wan", spec.dc_link_rate_bps)
            for ri, rack in enumerate(spec.racks(dc)):
                self._bridge(f"d{di}r{ri}")
                self._link(f"d{di}r{ri}", f"d{di}", spec.rack_link_rate_bps)
        dcs = spec.dcs
        for k, h in enumerate(spec.hosts):
            ns = f"{self.tag}-{h.name}"
            self._add_ns(ns)
            addr = str(net.network_address + k + 1)
            self.addresses[h.name] = addr
            di = dcs.index(h.dc)
            ri = spec.racks(h.dc).index(h.rack)
            peer = f"h{k}"
            # Created in the fabric with its peer directly in the host's namespace: the caller's
            # namespace never holds either end.
            _run("ip", "-n", self.fabric, "link", "add", peer, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _run("ip", "-n", self.fabric, "link", "set", peer, "master", f"d{di}r{ri}")
            _run("ip", "-n", self.fabric, "link", "set", peer, "up")
            _run("ip", "-n", ns, "addr", "add", f"{addr}/{net.prefixlen}", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _tbf(ns, "eth0", h.nic_rate_bps)              # upload
            _tbf(self.fabric, peer, h.nic_rate_bps)       # download

    def teardown(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 5
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self.procs.clear()
        for ns in reversed(self.namespaces):
            # A process we did not start may still live in it: kill it, or the namespace outlives us.
            for pid in _run("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _run("ip", "netns", "del", ns, check=False)
        if self.namespaces:
            log.info("topology %s torn down (%d namespaces)", self.tag, len(self.namespaces))
        self.namespaces.clear()
        self.built = False

    def _install_handlers(self) -> None:
        atexit.register(self.teardown)
        try:
            # SIGTERM becomes an exception so `with`/finally blocks run; SIGINT already is one.
            if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
                signal.signal(signal.SIGTERM, _raise_exit)
        except ValueError:  # not the main thread
            pass

    # ---------------------------------------------------------------- running things inside
    def exec_argv(self, host: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns(host), *argv]

    def popen(self, host: str, argv: list[str], **kw) -> subprocess.Popen:
        """Start `argv` inside `host`'s namespace; teardown kills it."""
        p = subprocess.Popen(self.exec_argv(host, argv), **kw)
        self.procs.append(p)
        return p

    def run(self, host: str, argv: list[str], **kw) -> subprocess.CompletedProcess:
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(self.exec_argv(host, argv), **kw)


def _raise_exit(signum, frame) -> None:
    raise SystemExit(128 + signum)


_SINK = """
import socket, sys, time
s = socket.create_server((sys.argv[1], 0)); print(s.getsockname()[1], flush=True)
s.settimeout(30); c, _ = s.accept(); c.settimeout(30)
buf, n, t0 = bytearray(1 << 20), 0, None
while True:
    k = c.recv_into(buf)
    if not k:
        break
    t0 = t0 or time.monotonic()
    n += k
print(n, n / (time.monotonic() - t0), flush=True)
"""
_SOURCE = ("import socket, sys; c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30); "
           "c.sendall(bytes(int(sys.argv[3]))); c.close()")


def measure_rate(topo: Topology, src: str, dst: str, nbytes: int, python: str | None = None) -> float:
    """Bits/s of one TCP stream from host `src` to host `dst` moving `nbytes` (TCP goodput)."""
    import sys
    py = python or sys.executable
    sink = topo.popen(dst, [py, "-c", _SINK, topo.ip(dst)], stdout=subprocess.PIPE, text=True)
    port = sink.stdout.readline().strip()
    r = topo.run(src, [py, "-c", _SOURCE, topo.ip(dst), port, str(nbytes)], timeout=120)
    if r.returncode != 0:
        sink.kill()
        raise RuntimeError(f"rate probe {src}->{dst} failed: {r.stderr.strip()}")
    out, _ = sink.communicate(timeout=60)
    n, bps = out.split()
    if int(n) != nbytes:
        raise RuntimeError(f"rate probe {src}->{dst}: {n} of {nbytes} bytes arrived")
    return float(bps) * 8
