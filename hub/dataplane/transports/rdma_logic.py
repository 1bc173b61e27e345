"""The pure logic of the `rdma` transport: no pyverbs import, no device, unit-testable anywhere.

- **Exchange messages.** The reader's queue-pair address (`QpInfo`: QP number, PSN, LID, GID, port,
  MTU) rides in the data-plane request; the server answers with its own in the first unit frame.
  Each unit frame then carries a `ReadDescriptor`: per manifest segment, (remote address, length,
  rkey). Decoding validates everything against the reader's own manifest (`ProtocolError`).
- **The READ window.** `plan_reads` cuts a unit's segments into RDMA READs of at most `max_read`
  bytes; `ReadWindow` keeps at most `depth` of them outstanding and consumes a completion stream
  (wr_id, status, byte_len), mapping error completions to `TransferError` like TCP's failures.
- **NIC choice by locality**, from a sysfs tree (`/sys` or a fake one in tests): the NIC with an
  ACTIVE port nearest the buffer — same PCIe switch as the GPU, else same NUMA node.
- **Diagnosis**: why `rdma` cannot run here, in one message that says how to check (`ibv_devices`).

    >>> ops = plan_reads([(0x1000, 7, 10)], [(0x9000, 3, 10)], max_read=4)
    >>> [(o.wr_id, o.local_addr, o.remote_addr, o.length) for o in ops]
    [(0, 4096, 36864, 4), (1, 4100, 36868, 4), (2, 4104, 36872, 2)]
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field

from rlsync.hub.errors import ProtocolError, TransferError

# --------------------------------------------------------------------------- completions
# enum ibv_wc_status (verbs ABI, stable since OFED 1.x; cross-checked against pyverbs.enums in tests).
WC_SUCCESS = 0
WC_STATUS = {
    0: "success", 1: "local length error", 2: "local QP operation error", 3: "local EE context error",
    4: "local protection error", 5: "work request flushed", 6: "memory window bind error",
    7: "bad response", 8: "local access error", 9: "remote invalid request", 10: "remote access error",
    11: "remote operation error", 12: "transport retry counter exceeded", 13: "RNR retry counter exceeded",
    14: "local RDD violation", 15: "remote invalid RD request", 16: "remote abort", 17: "invalid EE context number",
    18: "invalid EE context state", 19: "fatal error", 20: "response timeout", 21: "general error",
}
_WHY = {
    10: "the source refused the rkey/address: it deregistered the memory (released?) or the descriptor is stale",
    12: "the source's NIC stopped answering: peer dead, link down or fabric path lost",
    13: "the source's queue pair is not ready",
    20: "the source's NIC did not answer in time",
    5: "flushed after an earlier failure on this queue pair",
}


def completion_error(status: int, wr_id: int, vendor_err: int = 0, peer: str = "") -> TransferError:
    """The typed error for a failed work completion (what TCP raises for a dead or broken source)."""
    name = WC_STATUS.get(status, f"status {status}")
    why = _WHY.get(status, "")
    src = f" from {peer}" if peer else ""
    return TransferError(f"RDMA READ{src} failed (wr {wr_id}): {name} (vendor error {vendor_err:#x})"
                         + (f"; {why}" if why else ""))


# --------------------------------------------------------------------------- exchange messages
_GID_RE = re.compile(r"^[0-9a-f]{4}(:[0-9a-f]{4}){7}$")
_MTUS = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}
"""Path MTU in bytes -> enum ibv_mtu."""


@dataclass(frozen=True, slots=True)
class QpInfo:
    """What one end of an RC connection tells the other to reach its queue pair."""

    qpn: int
    """Queue pair number (24 bits)."""
    psn: int
    """The first packet sequence number this end sends (24 bits)."""
    lid: int
    """Port LID (InfiniBand; 0 on RoCE)."""
    gid: str
    """Port GID as 8 colon-separated hex groups; required on RoCE (routing by GRH)."""
    gid_index: int = 0
    """Index of `gid` in the port's GID table (the sender's sgid_index)."""
    port: int = 1
    mtu: int = 1024
    """Active path MTU in bytes; both ends use the smaller."""
    nic: str = ""
    """Device name (mlx5_0 ...), for messages."""

    def to_wire(self) -> dict:
        return asdict(self)

    @classmethod
    def from_wire(cls, d) -> "QpInfo":
        try:
            q = cls(qpn=int(d["qpn"]), psn=int(d["psn"]), lid=int(d["lid"]), gid=str(d["gid"]).lower(),
                    gid_index=int(d.get("gid_index", 0)), port=int(d.get("port", 1)), mtu=int(d.get("mtu", 1024)),
                    nic=str(d.get("nic", ""))[:64])
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ProtocolError("malformed RDMA queue-pair exchange message") from None
        if not (0 < q.qpn < 1 << 24 and 0 <= q.psn < 1 << 24 and 0 <= q.lid < 1 << 16 and 0 < q.port < 256
                and 0 <= q.gid_index < 1 << 16 and q.mtu in _MTUS):
            raise ProtocolError(f"RDMA queue-pair exchange message out of range: {q}")
        if q.gid and not _GID_RE.match(q.gid):
            raise ProtocolError(f"RDMA exchange: malformed GID {q.gid!r}")
        if q.lid == 0 and (not q.gid or q.gid == "0000:" * 7 + "0000"):
            raise ProtocolError("RDMA exchange: neither a LID nor a GID to route to")
        return q

    @property
    def is_global(self) -> bool:
        """Route with a GRH (RoCE, or IB across subnets) rather than by LID."""
        return self.lid == 0 or bool(self.gid and not self.gid.startswith("fe80:"))


def path_mtu(a: QpInfo, b: QpInfo) -> int:
    """The enum ibv_mtu both ends can use."""
    return _MTUS[min(a.mtu, b.mtu)]


@dataclass(frozen=True, slots=True)
class RemoteSegment:
    addr: int
    length: int
    rkey: int


def encode_descriptor(segments: list[RemoteSegment], qp: QpInfo | None = None) -> dict:
    """One unit frame's payload (msgpack'ed by the caller): where its bytes are, and how to reach them."""
    d: dict = {"s": [[s.addr, s.length, s.rkey] for s in segments]}
    if qp is not None:
        d["qp"] = qp.to_wire()
    return d


def decode_descriptor(msg, manifest_segments) -> tuple[list[RemoteSegment], QpInfo | None]:
    """Validate a unit frame against the reader's manifest segments [(tensor, offset, length)]."""
    try:
        raw = msg["s"]
        segs = [RemoteSegment(int(a), int(n), int(k)) for a, n, k in raw]
    except (KeyError, TypeError, ValueError):
        raise ProtocolError("malformed RDMA read descriptor") from None
    if len(segs) != len(manifest_segments):
        raise ProtocolError(f"RDMA descriptor has {len(segs)} segments, the manifest {len(manifest_segments)}")
    for s, (_, _, ln) in zip(segs, manifest_segments):
        if s.length != ln:
            raise ProtocolError(f"RDMA descriptor segment of {s.length} bytes, manifest says {ln}")
        if not (0 < s.addr < 1 << 64 and s.addr + s.length <= 1 << 64 and 0 <= s.rkey < 1 << 32):
            raise ProtocolError("RDMA descriptor address or rkey out of range")
    qp = QpInfo.from_wire(msg["qp"]) if "qp" in msg else None
    return segs, qp


# --------------------------------------------------------------------------- READ window
@dataclass(frozen=True, slots=True)
class ReadOp:
    wr_id: int
    local_addr: int
    lkey: int
    remote_addr: int
    rkey: int
    length: int


def plan_reads(local: list[tuple[int, int, int]], remote: list[tuple[int, int, int]], max_read: int,
               first_wr_id: int = 0) -> list[ReadOp]:
    """Pair local (addr, lkey, len) with remote (addr, rkey, len) segments; cut into <= max_read READs."""
    if max_read <= 0:
        raise ValueError("max_read must be positive")
    ops, wr = [], first_wr_id
    for (la, lk, ln), (ra, rk, rn) in zip(local, remote, strict=True):
        if ln != rn:
            raise ProtocolError(f"segment length mismatch: local {ln}, remote {rn}")
        for off in range(0, ln, max_read):
            ops.append(ReadOp(wr, la + off, lk, ra + off, rk, min(max_read, ln - off)))
            wr += 1
    return ops


@dataclass(slots=True)
class ReadWindow:
    """At most `depth` READs in flight; fed by a completion stream.

        >>> w = ReadWindow(plan_reads([(0, 1, 8)], [(64, 2, 8)], max_read=4), depth=1)
        >>> [o.wr_id for o in w.to_post()], w.to_post()
        ([0], [])
        >>> w.complete(0, WC_SUCCESS, 4); [o.wr_id for o in w.to_post()]
        [1]
        >>> w.complete(1, WC_SUCCESS, 4); w.done, w.bytes_done
        (True, 8)
    """

    ops: list[ReadOp]
    depth: int
    peer: str = ""
    _next: int = 0
    _inflight: dict[int, ReadOp] = field(default_factory=dict)
    bytes_done: int = 0
    completed: int = 0
    error: TransferError | None = None

    def __post_init__(self) -> None:
        if self.depth <= 0:
            raise ValueError("window depth must be positive")

    @property
    def outstanding(self) -> int:
        return len(self._inflight)

    @property
    def done(self) -> bool:
        return self.error is None and self.completed == len(self.ops)

    def to_post(self) -> list[ReadOp]:
        """The READs to post now (marked in flight). None after an error: the QP is being torn down."""
        if self.error is not None:
            return []
        out = []
        while self._next < len(self.ops) and len(self._inflight) < self.depth:
            op = self.ops[self._next]
            self._inflight[op.wr_id] = op
            self._next += 1
            out.append(op)
        return out

    def complete(self, wr_id: int, status: int, byte_len: int, vendor_err: int = 0) -> None:
        """Consume one work completion; raise TransferError on the first failed one."""
        op = self._inflight.pop(wr_id, None)
        if self.error is not None:
            return  # the flush of what was in flight after the first error: already reported
        if op is None:
            self.error = TransferError(f"RDMA completion for unknown or repeated work request {wr_id}")
            raise self.error
        if status != WC_SUCCESS:
            self.error = completion_error(status, wr_id, vendor_err, self.peer)
            raise self.error
        # byte_len of an RDMA READ completion is not defined by the verbs spec for every provider:
        # trust the posted length, but a provider that reports a short read is believed.
        if byte_len and byte_len != op.length:
            self.error = TransferError(f"RDMA READ {wr_id} moved {byte_len} bytes, {op.length} were asked")
            raise self.error
        self.bytes_done += op.length
        self.completed += 1


# --------------------------------------------------------------------------- NIC locality (sysfs)
@dataclass(frozen=True, slots=True)
class NicPort:
    name: str
    """Device name as in /sys/class/infiniband (mlx5_0, rxe0 ...)."""
    port: int
    active: bool
    link_layer: str
    """'InfiniBand' or 'Ethernet' (RoCE)."""
    numa_node: int
    """-1 when the platform does not say."""
    pci_path: tuple[str, ...]
    """The device's PCI path from the root complex (resolved /sys/devices/... components)."""


def _read(path: str, default: str = "") -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def _pci_path(sysfs: str, link: str) -> tuple[str, ...]:
    real = os.path.realpath(link)
    rel = os.path.relpath(real, os.path.join(sysfs, "devices"))
    return tuple(p for p in rel.split(os.sep) if re.match(r"^(pci)?[0-9a-f]{4}:[0-9a-f]{2}", p))


def scan_nics(sysfs: str = "/sys") -> list[NicPort]:
    """Every (RDMA device, port) under `sysfs`/class/infiniband with its state and locality."""
    base = os.path.join(sysfs, "class", "infiniband")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    out = []
    for name in names:
        dev = os.path.join(base, name)
        numa = int(_read(os.path.join(dev, "device", "numa_node"), "-1") or -1)
        pci = _pci_path(sysfs, os.path.join(dev, "device"))
        try:
            ports = sorted(os.listdir(os.path.join(dev, "ports")), key=int)
        except (OSError, ValueError):
            ports = []
        for p in ports:
            pdir = os.path.join(dev, "ports", p)
            state = _read(os.path.join(pdir, "state"))  # e.g. "4: ACTIVE"
            out.append(NicPort(name, int(p), state.endswith("ACTIVE"), _read(os.path.join(pdir, "link_layer")),
                               numa, pci))
    return out


@dataclass(frozen=True, slots=True)
class BufferLocality:
    numa_node: int = -1
    pci_path: tuple[str, ...] = ()
    """For a GPU buffer: the GPU's PCI path (empty for host memory)."""


def gpu_locality(pci_bus_id: str, sysfs: str = "/sys") -> BufferLocality:
    """Locality of a GPU from its PCI bus id ('0000:3b:00.0', as torch/nvidia-smi print it)."""
    bdf = pci_bus_id.lower()
    if bdf.count(":") == 1:
        bdf = "0000:" + bdf
    dev = os.path.join(sysfs, "bus", "pci", "devices", bdf)
    return BufferLocality(int(_read(os.path.join(dev, "numa_node"), "-1") or -1), _pci_path(sysfs, dev))


def parse_cpulist(s: str) -> set[int]:
    """'0-3,8,10-11' -> {0,1,2,3,8,10,11}"""
    cpus: set[int] = set()
    for part in filter(None, s.strip().split(",")):
        a, _, b = part.partition("-")
        cpus.update(range(int(a), int(b or a) + 1))
    return cpus


def host_locality(cpus: set[int], sysfs: str = "/sys") -> BufferLocality:
    """Host memory: the NUMA node holding most of the CPUs this process may run on (first-touch
    allocation puts its pages there)."""
    base = os.path.join(sysfs, "devices", "system", "node")
    best, best_n = -1, 0
    try:
        nodes = sorted(d for d in os.listdir(base) if re.match(r"^node\d+$", d))
    except OSError:
        nodes = []
    for d in nodes:
        n = len(cpus & parse_cpulist(_read(os.path.join(base, d, "cpulist"))))
        if n > best_n:
            best, best_n = int(d[4:]), n
    return BufferLocality(best)


def pci_distance(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    """Hops up the PCI tree between two devices (like nvidia-smi topo's PIX < PXB < PHB): smaller is nearer.
    Different root complexes count as far apart as possible."""
    if not a or not b or a[0] != b[0]:
        return 1 << 10
    common = 0
    for x, y in zip(a, b):
        if x != y:
            break
        common += 1
    return (len(a) - common) + (len(b) - common)


def choose_nic(nics: list[NicPort], where: BufferLocality, prefer: str = "") -> NicPort | None:
    """The ACTIVE port nearest the buffer: PCI distance (GPU buffers), then same NUMA node, then name.
    `prefer` (a device name from config) wins when it has an active port."""
    active = [n for n in nics if n.active]
    if not active:
        return None
    if prefer:
        pick = [n for n in active if n.name == prefer]
        if pick:
            return pick[0]

    def key(n: NicPort) -> tuple:
        pci = pci_distance(n.pci_path, where.pci_path) if where.pci_path else 0
        numa = 0 if (where.numa_node < 0 or n.numa_node < 0 or n.numa_node == where.numa_node) else 1
        return (pci, numa, n.name, n.port)

    return min(active, key=key)


def peermem_loaded(sysfs: str = "/sys") -> bool:
    """Can the NIC register GPU memory (GPUDirect RDMA)? nvidia-peermem, or the older nv_peer_mem."""
    return any(os.path.isdir(os.path.join(sysfs, "module", m)) for m in ("nvidia_peermem", "nv_peer_mem"))


# --------------------------------------------------------------------------- capability
def diagnose(pyverbs_error: str | None, device_list_error: str | None, device_names: list[str],
             nics: list[NicPort]) -> str | None:
    """Why `rdma` cannot run here (one message, with how to check), or None when it can."""
    if pyverbs_error is not None:
        return ("rdma: pyverbs is not importable (" + pyverbs_error + "); install Debian's "
                "`apt-get install rdma-core ibverbs-providers python3-pyverbs` (scripts/run links it into the venv)")
    if device_list_error is not None or not device_names:
        why = f"ibv_get_device_list failed: {device_list_error}" if device_list_error else "no device listed"
        return (f"rdma: no RDMA device on this machine ({why}); check with `ibv_devices` "
                "(needs a NIC with its kernel driver, e.g. mlx5_ib, or soft-RoCE via `rdma link add rxe0 type rxe`)")
    listed = [n for n in nics if n.name in device_names] or nics
    if listed and not any(n.active for n in listed):
        ports = ", ".join(f"{n.name}/{n.port}" for n in listed)
        return f"rdma: no RDMA port is ACTIVE ({ports}); check with `ibv_devinfo` (cable, subnet manager)"
    return None
