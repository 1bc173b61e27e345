"""`rdma`: one-sided RDMA READ from a replica's registered memory, through pyverbs (RC queue pairs).

NOT EXECUTED ON REAL HARDWARE. The machines this was written on have no RDMA device (and no rxe/siw
in the kernel): here `rdma` reports itself unavailable and readers use `shm`/`tcp`. What ran here is
listed in docs/transports.md: the pure logic (rdma_logic.py), and this module's transport driven end
to end over a real data-plane server with a *fake* verbs layer that copies memory in-process.

How a read goes (the data-plane framing, tickets and relay waits are hub/dataplane/transfer.py's):
1. Reader: picks the NIC nearest its destination buffers (rdma_logic.choose_nic over sysfs), opens
   (once per process) its context, PD and a memory registration of the destination tensors, creates
   an RC queue pair, and sends its `QpInfo` (QPN, PSN, LID/GID, port, MTU) in the request body.
2. Server: after the ticket check, picks the NIC nearest the replica, registers the replica's
   tensors (cached per replica: a trainer serves many readers), creates a QP, moves it
   INIT -> RTR -> RTS towards the reader's, and sends its own `QpInfo` with the first unit frame.
3. Per unit, when present (relays wait as for every transport): the server sends only a descriptor
   — (address, length, rkey) per segment. The reader connects its QP (first unit), cuts the unit
   into READs of <= `max_read` bytes, keeps `window` of them in flight, polls the CQ, and maps an
   error completion to TransferError like a TCP failure. The source CPU moves no byte.
4. After the last unit the reader sends one byte ("done"); only then does the server count the read
   drained (the source memory must not change while a READ may still hit it). Teardown destroys
   the QP (moving it to ERROR flushes anything in flight); a reader cannot READ after that.

GPU memory: a replica whose tensors are CUDA tensors is registered directly when the
nvidia-peermem module is loaded (GPUDirect RDMA); otherwise its pinned host mirror is
(hub/dataplane/device.py). Readers always land in host-registered memory they can verify.
"""
from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import weakref
from dataclasses import dataclass

import msgpack

from rlsync.hub.dataplane.wire import OK, UNIT
from rlsync.hub.errors import ProtocolError, TransferError, TransportUnavailableError
from rlsync.hub.dataplane.store import LocalReplica
from rlsync.hub.protocol.messages import Endpoint
from rlsync.hub.dataplane.transports import rdma_logic as L
from rlsync.hub.dataplane.transports.base import Transport, recv_exact, register_transport

log = logging.getLogger(__name__)

try:  # Debian's python3-pyverbs (rdma-core); scripts/run links it into the venv
    import pyverbs.enums as ve
    from pyverbs.addr import AHAttr, GlobalRoute, GID
    from pyverbs.cq import CQ
    from pyverbs.device import Context, get_device_list
    from pyverbs.mr import MR
    from pyverbs.pd import PD
    from pyverbs.pyverbs_error import PyverbsError
    from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
    from pyverbs.wr import SGE, SendWR
    _IMPORT_ERROR: str | None = None
except ImportError as e:
    _IMPORT_ERROR = f"{type(e).__name__}: {e}"

    class PyverbsError(Exception):
        """Stand-in so the except clauses below hold without pyverbs."""


@dataclass(kw_only=True, slots=True)
class RdmaConfig:
    window: int = 16
    """RDMA READs in flight per queue pair (also capped by the port's max_qp_rd_atom)."""
    max_read: int = 1 << 20
    """Bytes per READ work request; a unit is cut into READs of at most this."""
    nic: str = os.environ.get("RLSYNC_RDMA_NIC", "")
    """Force a device (mlx5_1 ...) instead of the one nearest the buffers."""
    gid_index: int = int(os.environ.get("RLSYNC_RDMA_GID_INDEX", "0") or 0)
    """GID table index (RoCE v2 deployments often need 3)."""
    sysfs: str = "/sys"
    """Where to read NIC and NUMA locality (tests point it at a fake tree)."""


CONFIG = RdmaConfig()

# --------------------------------------------------------------------------- capability
_probe_lock = threading.Lock()
_probe_result: tuple[str | None, list[L.NicPort]] | None = None


def probe(refresh: bool = False) -> tuple[str | None, list[L.NicPort]]:
    """(why rdma is unavailable or None, the NIC ports seen). Cached: device probing is not free."""
    global _probe_result
    with _probe_lock:
        if _probe_result is None or refresh:
            names, list_err = [], None
            if _IMPORT_ERROR is None:
                try:
                    names = [d.name.decode() if isinstance(d.name, bytes) else str(d.name) for d in get_device_list()]
                except PyverbsError as e:  # here: PyverbsRDMAError "Failed to get devices list"
                    list_err = str(e)
            nics = [n for n in L.scan_nics(CONFIG.sysfs) if not names or n.name in names]
            why = L.diagnose(_IMPORT_ERROR, list_err, names, nics)
            if why:
                log.debug("transport 'rdma' unavailable: %s", why)
            _probe_result = (why, nics)
        return _probe_result


def buffer_locality(rep: LocalReplica) -> L.BufferLocality:
    """Where a replica's memory sits: its GPU's PCI path, else this process's NUMA node."""
    dev = getattr(rep, "device_tensors", None)
    if dev:
        bus = _gpu_bus_id(next(iter(dev.values())))
        if bus:
            return L.gpu_locality(bus, CONFIG.sysfs)
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:
        cpus = set(range(os.cpu_count() or 1))
    return L.host_locality(set(cpus), CONFIG.sysfs)


def _gpu_bus_id(t) -> str:
    try:
        import torch
        p = torch.cuda.get_device_properties(t.device)
        return f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    except Exception:  # noqa: BLE001 - no CUDA, or a torch without PCI ids: fall back to NUMA
        return ""


def nearest_nic(rep: LocalReplica) -> L.NicPort:
    why, nics = probe()
    if why:
        raise TransportUnavailableError(why)
    nic = L.choose_nic(nics, buffer_locality(rep), CONFIG.nic)
    if nic is None:
        raise TransportUnavailableError("rdma: no ACTIVE RDMA port; check with `ibv_devinfo`")
    return nic


# --------------------------------------------------------------------------- the pyverbs layer
class VerbsNic:
    """One opened device port: context, protection domain, memory registrations. One per process."""

    def __init__(self, port: L.NicPort) -> None:
        self.port_info = port
        self.ctx = Context(name=port.name)
        self.pd = PD(self.ctx)
        attr = self.ctx.query_port(port.port)
        self.lid = attr.lid
        self.mtu = 128 << int(attr.active_mtu)  # enum ibv_mtu 1..5 -> 256..4096 bytes
        self.max_rd = max(1, self.ctx.query_device().max_qp_rd_atom)
        self.gid = self.ctx.query_gid(port.port, CONFIG.gid_index).gid if attr.gid_tbl_len else ""
        self._lock = threading.Lock()
        self._mrs: weakref.WeakKeyDictionary[LocalReplica, list] = weakref.WeakKeyDictionary()

    def register(self, rep: LocalReplica) -> list[tuple[int, int, int]]:
        """(address, lkey, rkey) per tensor of `rep`; registered once per replica, dropped with it."""
        with self._lock:
            keys = self._mrs.get(rep)
            if keys is None:
                access = ve.IBV_ACCESS_LOCAL_WRITE | ve.IBV_ACCESS_REMOTE_READ
                mrs, keys = [], []
                for addr, nbytes in _regions(rep):
                    if nbytes == 0:
                        keys.append((addr, 0, 0))
                        mrs.append(None)
                        continue
                    mr = MR(self.pd, nbytes, access, address=addr)
                    mrs.append(mr)
                    keys.append((addr, mr.lkey, mr.rkey))
                self._mrs[rep] = keys
                # MRs die with the replica (or with the process); release() never reuses an rkey.
                weakref.finalize(rep, _close_all, mrs)
            return keys

    def create_qp(self, depth: int) -> "VerbsQp":
        return VerbsQp(self, depth)


def _regions(rep: LocalReplica) -> list[tuple[int, int]]:
    """The memory a replica's reads come from: device tensors when the NIC can reach GPU memory."""
    dev = getattr(rep, "device_tensors", None)
    specs = rep.manifest.tensors
    if dev and L.peermem_loaded(CONFIG.sysfs):
        return [(dev[s.name].data_ptr(), s.nbytes) for s in specs]
    return [(a, s.nbytes) for a, s in zip(rep.addresses, specs)]


def _close_all(objs) -> None:
    for o in objs:
        if o is not None:
            o.close()


class VerbsQp:
    """An RC queue pair with its own completion queue, driven by one connection's thread."""

    def __init__(self, nic: VerbsNic, depth: int) -> None:
        self.nic = nic
        self.depth = max(1, min(depth, nic.max_rd))
        self.cq = CQ(nic.ctx, self.depth * 2, None, None, 0)
        cap = QPCap(max_send_wr=self.depth, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        init = QPInitAttr(qp_type=ve.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap, sq_sig_all=1)
        attr = QPAttr(port_num=nic.port_info.port)
        attr.qp_access_flags = ve.IBV_ACCESS_LOCAL_WRITE | ve.IBV_ACCESS_REMOTE_READ
        self.qp = QP(nic.pd, init, attr)  # returned in INIT (RC needs the peer's QPN for RTR)
        self.psn = random.getrandbits(24)

    def local_info(self) -> L.QpInfo:
        n = self.nic
        return L.QpInfo(qpn=self.qp.qp_num, psn=self.psn, lid=n.lid, gid=n.gid, gid_index=CONFIG.gid_index,
                        port=n.port_info.port, mtu=n.mtu, nic=n.port_info.name)

    def connect(self, peer: L.QpInfo) -> None:
        """INIT -> RTR -> RTS towards `peer` (reliable connected, READs in both directions allowed)."""
        me = self.local_info()
        attr = QPAttr(port_num=me.port)
        attr.path_mtu = L.path_mtu(me, peer)
        attr.dest_qp_num = peer.qpn
        attr.rq_psn = peer.psn
        attr.sq_psn = self.psn
        attr.max_dest_rd_atomic = self.nic.max_rd  # READs the peer may have outstanding against us
        attr.max_rd_atomic = self.depth           # READs we keep outstanding
        attr.min_rnr_timer, attr.timeout, attr.retry_cnt, attr.rnr_retry = 12, 14, 7, 7
        attr.qp_access_flags = ve.IBV_ACCESS_LOCAL_WRITE | ve.IBV_ACCESS_REMOTE_READ
        if peer.is_global or me.lid == 0:
            gr = GlobalRoute(dgid=GID(peer.gid), sgid_index=me.gid_index)
            attr.ah_attr = AHAttr(port_num=me.port, is_global=1, gr=gr, dlid=peer.lid)
        else:
            attr.ah_attr = AHAttr(port_num=me.port, dlid=peer.lid)
        self.qp.to_rts(attr)

    def post_read(self, op: L.ReadOp) -> None:
        sge = SGE(op.local_addr, op.length, op.lkey)
        wr = SendWR(wr_id=op.wr_id, opcode=ve.IBV_WR_RDMA_READ, num_sge=1, sg=[sge],
                    send_flags=ve.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(op.rkey, op.remote_addr)
        self.qp.post_send(wr, None)

    def poll(self, n: int) -> list[tuple[int, int, int, int]]:
        """Up to n completions as (wr_id, status, byte_len, vendor_err)."""
        got, wcs = self.cq.poll(n)
        return [(int(w.wr_id), int(w.status), int(w.byte_len), int(w.vendor_err)) for w in wcs[:got]]

    def close(self) -> None:
        self.qp.close()  # destroys the QP: the peer can no longer READ through it
        self.cq.close()


_nics: dict[tuple[str, int], VerbsNic] = {}
_nics_lock = threading.Lock()


def open_nic(port: L.NicPort) -> VerbsNic:
    """The process's one opened `port` (tests replace this with a fake)."""
    with _nics_lock:
        nic = _nics.get((port.name, port.port))
        if nic is None:
            try:
                nic = _nics[(port.name, port.port)] = VerbsNic(port)
            except PyverbsError as e:
                raise TransportUnavailableError(f"rdma: cannot open {port.name} port {port.port}: {e}") from None
        return nic


# --------------------------------------------------------------------------- the transport
def run_window(qp, window: L.ReadWindow, deadline_s: float, peer: str) -> None:
    """Post READs within the window and poll completions until the unit is done or fails."""
    end = time.monotonic() + deadline_s
    idle = 0
    while not window.done:
        for op in window.to_post():
            qp.post_read(op)
        wcs = qp.poll(window.depth)
        for wr_id, status, nbytes, vendor in wcs:
            window.complete(wr_id, status, nbytes, vendor)  # raises TransferError on a failed one
        if wcs:
            idle = 0
            continue
        if time.monotonic() > end:
            raise TransferError(f"source {peer} stalled: RDMA READs outstanding for {deadline_s}s")
        idle += 1
        if idle > 64:  # busy-poll briefly (latency), then back off (2 shared cores)
            time.sleep(min(1e-3, 1e-6 * idle))


@register_transport("rdma")
class RdmaTransport(Transport):
    kind = 5
    priority = 25
    """Above tcp (no CPU on the source, no kernel copies); below shm on one host (no NIC round trip)."""

    def __init__(self) -> None:
        self._qp = None
        self._nic = None
        self._connected = False
        self._hello_sent = False
        self._lkeys: list[tuple[int, int, int]] = []

    @classmethod
    def check_available(cls) -> None:
        why, _ = probe()
        if why:
            raise TransportUnavailableError(why)

    @classmethod
    def endpoint_info(cls) -> dict:
        """The link layer and active NIC ports (a reader refuses to pair InfiniBand with Ethernet)."""
        why, nics = probe()
        if why:
            return {}
        active = [n for n in nics if n.active]
        return {"rdma": {"link_layer": active[0].link_layer if active else "",
                         "nics": [f"{n.name}/{n.port}" for n in active]}}

    def usable_between(self, mine: Endpoint, peer: Endpoint) -> bool:
        a, b = mine.info("rdma"), peer.info("rdma")
        same_fabric = not (a.get("link_layer") and b.get("link_layer")) or a["link_layer"] == b["link_layer"]
        return super().usable_between(mine, peer) and same_fabric

    # reader ------------------------------------------------------------------
    def open_request(self, dest: LocalReplica, peer: Endpoint) -> dict:
        try:
            self._nic = open_nic(nearest_nic(dest))
            self._lkeys = self._nic.register(dest)
            self._qp = self._nic.create_qp(CONFIG.window)
            return {"qp": self._qp.local_info().to_wire()}
        except PyverbsError as e:
            raise TransferError(f"rdma: cannot set up a queue pair towards {peer.tcp}: {e}") from None

    def recv_unit(self, conn: socket.socket, dest: LocalReplica, u: int, nbytes: int, peer: Endpoint) -> None:
        if nbytes > 1 << 20:
            raise ProtocolError("oversized rdma descriptor frame")
        body = bytearray(nbytes)
        recv_exact(conn, memoryview(body))
        unit = dest.manifest.units[u]
        try:
            msg = msgpack.unpackb(bytes(body))
        except Exception:
            raise ProtocolError(f"unit {u}: undecodable rdma descriptor") from None
        segs, qp_info = L.decode_descriptor(msg, unit.segments)
        local = [(self._lkeys[ti][0] + off, self._lkeys[ti][1], ln) for ti, off, ln in unit.segments]
        remote = [(s.addr, s.rkey, s.length) for s in segs]
        window = L.ReadWindow(L.plan_reads(local, remote, CONFIG.max_read), self._qp.depth, peer.tcp)
        timeout = conn.gettimeout()
        try:
            if not self._connected:
                if qp_info is None:
                    raise ProtocolError("rdma: the source sent no queue-pair address before its first unit")
                self._qp.connect(qp_info)
                self._connected = True
            run_window(self._qp, window, 30.0 if timeout is None else timeout, peer.tcp)
        except PyverbsError as e:  # a failed modify_qp / post_send: the connection is unusable
            raise TransferError(f"rdma: READ from {peer.tcp} failed: {e}") from None
        return None  # the caller verifies the unit's checksum on the landed bytes

    def finish(self, conn: socket.socket) -> None:
        conn.sendall(b"\x01")  # done: the source may count this read as drained

    # server ------------------------------------------------------------------
    def accept_request(self, extra, rep: LocalReplica) -> None:
        if not isinstance(extra, dict) or "qp" not in extra:
            raise ProtocolError("rdma request without the reader's queue-pair address")
        peer = L.QpInfo.from_wire(extra["qp"])
        try:
            self._nic = open_nic(nearest_nic(rep))
            self._lkeys = self._nic.register(rep)
            self._qp = self._nic.create_qp(CONFIG.window)
            self._qp.connect(peer)
        except PyverbsError as e:
            raise TransferError(f"rdma: cannot connect to reader QP {peer.qpn} on {peer.nic}: {e}") from None
        self._connected = True

    def send_unit(self, conn: socket.socket, rep: LocalReplica, u: int) -> int:
        unit = rep.manifest.units[u]
        segs = [L.RemoteSegment(self._lkeys[ti][0] + off, ln, self._lkeys[ti][2]) for ti, off, ln in unit.segments]
        hello = None if self._hello_sent else self._qp.local_info()
        payload = msgpack.packb(L.encode_descriptor(segs, hello))
        conn.sendall(UNIT.pack(u, OK, len(payload)) + payload)
        self._hello_sent = True
        return unit.nbytes

    def wait_finish(self, conn: socket.socket) -> None:
        recv_exact(conn, memoryview(bytearray(1)))

    def close(self) -> None:
        qp, self._qp, self._connected, self._hello_sent = self._qp, None, False, False
        if qp is not None:
            try:
                qp.close()
            except PyverbsError as e:
                log.warning("rdma: queue pair teardown failed: %s", e)

