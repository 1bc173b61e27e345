"""The `rdma` transport without RDMA hardware: what can be checked here, and nothing more.

No test in this file moves a byte over RDMA; none could (no device, no rxe/siw in this kernel).
- Pure logic (rdma_logic.py): exchange messages, the READ window against recorded completion
  streams, error completions -> TransferError, NIC choice from a fake sysfs tree, diagnosis.
- The real pyverbs, where importable: its enums match our completion table, the names the thin
  layer calls exist, and device listing fails here the way ENVIRONMENT.md says.
- Fallback: with `rdma` unavailable a real fetch from a peer advertising it uses TCP.
- FAKE VERBS: the transport end to end over a real data-plane server, with `open_nic` replaced by
  an in-process fake whose "RDMA READ" is a memmove. It checks our protocol (exchange, descriptors,
  window, drain, teardown), not pyverbs and not a NIC.
"""
from __future__ import annotations

import ctypes
import itertools
import os
import time

import pytest
import torch

from rlsync.hub import errors as E
from rlsync.hub.model.location import Location
from rlsync.hub.model.manifest import ManifestConfig, allocate, build_manifest
from rlsync.hub.dataplane.config import DataPlaneConfig
from rlsync.hub.dataplane.transfer import DataServer, read_from_source
from rlsync.hub.dataplane.store import LocalReplica, ReplicaStore
from rlsync.hub.protocol.tickets import ReaderKey, Ticket, TicketSigner, TicketVerifier
from rlsync.hub.dataplane.transports import boot_id, choose_transport, endpoint_info, get_transport, rdma
from rlsync.hub.dataplane.transports import rdma_logic as L
from endpoints import ep  # tests/hub/dataplane/endpoints.py

from waiting import wait_for  # tests/waiting.py

GID = "fe80:0000:0000:0000:0202:c9ff:fe00:0001"


# --------------------------------------------------------------------------- exchange messages
def test_qp_info_round_trip():
    q = L.QpInfo(qpn=0x1234, psn=77, lid=5, gid=GID, gid_index=3, port=1, mtu=4096, nic="mlx5_0")
    assert L.QpInfo.from_wire(q.to_wire()) == q
    assert not q.is_global  # link-local GID with a LID: IB, routed by LID
    assert L.QpInfo(qpn=1, psn=0, lid=0, gid="0000:0000:0000:0000:0000:ffff:0a00:0001").is_global  # RoCE
    assert L.path_mtu(q, L.QpInfo(qpn=1, psn=0, lid=9, gid="", mtu=1024)) == 3  # IBV_MTU_1024


@pytest.mark.parametrize("bad", [
    {}, {"qpn": 1, "psn": 0, "lid": 1},                                  # missing fields
    {"qpn": 0, "psn": 0, "lid": 1, "gid": ""},                          # QPN 0 is not an RC QP
    {"qpn": 1 << 24, "psn": 0, "lid": 1, "gid": ""},                    # 24-bit QPN
    {"qpn": 1, "psn": -1, "lid": 1, "gid": ""},
    {"qpn": 1, "psn": 0, "lid": 1, "gid": "fe80::1"},                   # not the 8-group form
    {"qpn": 1, "psn": 0, "lid": 1, "gid": "", "mtu": 1500},
    {"qpn": 1, "psn": 0, "lid": 0, "gid": ""},                          # nowhere to route
    {"qpn": "x", "psn": 0, "lid": 1, "gid": ""}, [1, 2, 3], None,
])
def test_qp_info_rejects_malformed(bad):
    with pytest.raises(E.ProtocolError):
        L.QpInfo.from_wire(bad)


def test_descriptor_round_trip_and_validation():
    manifest_segs = [(0, 0, 100), (1, 0, 8)]
    segs = [L.RemoteSegment(0x7000, 100, 9), L.RemoteSegment(0x9000, 8, 10)]
    q = L.QpInfo(qpn=5, psn=1, lid=2, gid=GID)
    got, qp = L.decode_descriptor(L.encode_descriptor(segs, q), manifest_segs)
    assert got == segs and qp == q
    got, qp = L.decode_descriptor(L.encode_descriptor(segs), manifest_segs)
    assert qp is None
    for bad in [{"s": [[0x7000, 100, 9]]},                           # a segment short
                {"s": [[0x7000, 99, 9], [0x9000, 8, 10]]},           # wrong length
                {"s": [[0, 100, 9], [0x9000, 8, 10]]},               # null address
                {"s": [[0x7000, 100, 1 << 32], [0x9000, 8, 10]]},    # rkey is 32 bits
                {"s": "garbage"}, {}]:
        with pytest.raises(E.ProtocolError):
            L.decode_descriptor(bad, manifest_segs)


# --------------------------------------------------------------------------- READ window
def test_plan_reads_cuts_segments():
    ops = L.plan_reads([(1000, 1, 10), (5000, 2, 3)], [(9000, 7, 10), (20000, 8, 3)], max_read=4, first_wr_id=10)
    assert [(o.wr_id, o.local_addr, o.lkey, o.remote_addr, o.rkey, o.length) for o in ops] == [
        (10, 1000, 1, 9000, 7, 4), (11, 1004, 1, 9004, 7, 4), (12, 1008, 1, 9008, 7, 2),
        (13, 5000, 2, 20000, 8, 3)]
    with pytest.raises(E.ProtocolError):
        L.plan_reads([(0, 1, 10)], [(0, 1, 11)], 4)


def replay(window: L.ReadWindow, stream):
    """Drive a window with a recorded completion stream: each step posts what the window allows,
    then delivers the recorded completions [(wr_id, status, byte_len)] of that step."""
    posted = []
    for step in stream:
        new = window.to_post()
        posted += [o.wr_id for o in new]
        assert window.outstanding <= window.depth
        for wr_id, status, n in step:
            window.complete(wr_id, status, n)
    return posted


def test_window_in_order_stream():
    w = L.ReadWindow(L.plan_reads([(0, 1, 100)], [(4096, 2, 100)], 10), depth=4)
    posted = replay(w, [[(0, 0, 10)], [(1, 0, 10), (2, 0, 10)], [(3, 0, 10), (4, 0, 10), (5, 0, 10)],
                        [(6, 0, 10)], [(7, 0, 10), (8, 0, 10)], [(9, 0, 10)]])
    assert posted == list(range(10)) and w.done and w.bytes_done == 100 and w.outstanding == 0


def test_window_out_of_order_and_zero_byte_len():
    w = L.ReadWindow(L.plan_reads([(0, 1, 30)], [(4096, 2, 30)], 10), depth=3)
    replay(w, [[(2, 0, 0), (0, 0, 10), (1, 0, 10)]])  # byte_len 0: provider leaves it undefined for READ
    assert w.done and w.bytes_done == 30


def test_error_completion_maps_to_transfer_error_and_flushes_are_ignored():
    w = L.ReadWindow(L.plan_reads([(0, 1, 40)], [(4096, 2, 40)], 10), depth=4, peer="10.0.0.2:7000")
    w.to_post()
    w.complete(0, L.WC_SUCCESS, 10)
    with pytest.raises(E.TransferError, match="remote access error.*deregistered") as ei:
        w.complete(1, 10, 0)  # IBV_WC_REM_ACCESS_ERR: e.g. the source released and deregistered
    assert "10.0.0.2:7000" in str(ei.value)
    for wr in (2, 3):  # the QP went to ERROR: the rest come back flushed, already reported
        w.complete(wr, 5, 0)
    assert w.to_post() == [] and not w.done and w.error is ei.value


@pytest.mark.parametrize("status,words", [(12, "retry counter exceeded.*peer dead"), (20, "response timeout"),
                                          (13, "RNR"), (4, "local protection"), (99, "status 99")])
def test_every_error_status_is_a_transfer_error(status, words):
    w = L.ReadWindow(L.plan_reads([(0, 1, 8)], [(64, 2, 8)], 8), depth=1)
    w.to_post()
    with pytest.raises(E.TransferError, match=words):
        w.complete(0, status, 0)


def test_unknown_repeated_and_short_completions_fail():
    w = L.ReadWindow(L.plan_reads([(0, 1, 20)], [(64, 2, 20)], 10), depth=2)
    w.to_post()
    with pytest.raises(E.TransferError, match="unknown or repeated"):
        w.complete(7, 0, 10)
    w = L.ReadWindow(L.plan_reads([(0, 1, 20)], [(64, 2, 20)], 10), depth=2)
    w.to_post()
    w.complete(0, 0, 10)
    with pytest.raises(E.TransferError, match="unknown or repeated"):
        w.complete(0, 0, 10)
    w = L.ReadWindow(L.plan_reads([(0, 1, 20)], [(64, 2, 20)], 10), depth=2)
    w.to_post()
    with pytest.raises(E.TransferError, match="moved 4 bytes"):
        w.complete(0, 0, 4)


def test_run_window_polls_until_done_and_times_out():
    class RecordedQp:  # replays a completion stream, one completion per poll, some polls empty
        def __init__(self, stream):
            self.stream, self.posted = list(stream), []

        def post_read(self, op):
            self.posted.append(op.wr_id)

        def poll(self, n):
            x = self.stream.pop(0) if self.stream else None
            return [] if x is None else [x]

    ops = L.plan_reads([(0, 1, 30)], [(64, 2, 30)], 10)
    qp = RecordedQp([None, (0, 0, 10, 0), None, None, (1, 0, 10, 0), (2, 0, 10, 0)])
    rdma.run_window(qp, L.ReadWindow(ops, depth=2), 5.0, "peer")
    assert qp.posted == [0, 1, 2]
    with pytest.raises(E.TransferError, match="stalled"):
        rdma.run_window(RecordedQp([]), L.ReadWindow(ops, depth=2), 0.05, "peer")


# --------------------------------------------------------------------------- NIC choice from sysfs
def fake_sysfs(root, nics, gpus=(), nodes=None):
    """nics: [(name, pci path tuple, numa, {port: (state, link_layer)})]; gpus: [(bdf path, numa)]."""
    def device(path, numa):
        d = os.path.join(root, "devices", *path)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "numa_node"), "w") as f:
            f.write(f"{numa}\n")
        return d

    os.makedirs(os.path.join(root, "bus", "pci", "devices"), exist_ok=True)
    for name, path, numa, ports in nics:
        d = device(path, numa)
        cls = os.path.join(root, "class", "infiniband", name)
        os.makedirs(cls, exist_ok=True)
        os.symlink(d, os.path.join(cls, "device"))
        for p, (state, ll) in ports.items():
            pd = os.path.join(cls, "ports", str(p))
            os.makedirs(pd)
            open(os.path.join(pd, "state"), "w").write(state + "\n")
            open(os.path.join(pd, "link_layer"), "w").write(ll + "\n")
    for path, numa in gpus:
        os.symlink(device(path, numa), os.path.join(root, "bus", "pci", "devices", path[-1]))
    for n, cpus in (nodes or {}).items():
        os.makedirs(os.path.join(root, "devices", "system", "node", f"node{n}"))
        open(os.path.join(root, "devices", "system", "node", f"node{n}", "cpulist"), "w").write(cpus + "\n")
    return str(root)


A = ("pci0000:00", "0000:00:01.0")
B = ("pci0000:80", "0000:80:01.0")


@pytest.fixture
def sysfs(tmp_path):
    return fake_sysfs(tmp_path, nics=[
        ("mlx5_0", A + ("0000:01:00.0",), 0, {1: ("4: ACTIVE", "InfiniBand")}),
        ("mlx5_1", B + ("0000:81:00.0",), 1, {1: ("4: ACTIVE", "InfiniBand")}),
        ("mlx5_2", B + ("0000:82:00.0", "0000:83:00.0"), 1, {1: ("1: DOWN", "InfiniBand")}),
        ("mlx5_3", B + ("0000:84:00.0", "0000:85:00.0"), 1, {1: ("4: ACTIVE", "Ethernet")}),
    ], gpus=[(B + ("0000:84:00.0", "0000:86:00.0"), 1), (A + ("0000:02:00.0",), 0)],
        nodes={0: "0-15", 1: "16-31"})


def test_scan_nics_reads_state_layer_numa_and_pci_path(sysfs):
    nics = {n.name: n for n in L.scan_nics(sysfs)}
    assert set(nics) == {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}
    assert nics["mlx5_0"].active and not nics["mlx5_2"].active
    assert nics["mlx5_3"].link_layer == "Ethernet" and nics["mlx5_1"].numa_node == 1
    assert nics["mlx5_3"].pci_path == B + ("0000:84:00.0", "0000:85:00.0")
    assert L.scan_nics(os.path.join(sysfs, "nowhere")) == []


def test_gpu_buffer_picks_the_nic_under_the_same_switch(sysfs):
    nics = L.scan_nics(sysfs)
    gpu = L.gpu_locality("0000:86:00.0", sysfs)
    assert gpu.numa_node == 1 and gpu.pci_path[-1] == "0000:86:00.0"
    assert L.choose_nic(nics, gpu).name == "mlx5_3"  # same PCIe switch (0000:84:00.0), not just node 1
    assert L.choose_nic(nics, L.gpu_locality("02:00.0", sysfs)).name == "mlx5_0"  # short bus id form


def test_host_buffer_picks_the_nic_on_its_numa_node(sysfs):
    nics = L.scan_nics(sysfs)
    assert L.host_locality({0, 1}, sysfs).numa_node == 0
    assert L.choose_nic(nics, L.host_locality({0, 1}, sysfs)).name == "mlx5_0"
    assert L.choose_nic(nics, L.host_locality({16, 17, 3}, sysfs)).name == "mlx5_1"
    assert L.choose_nic(nics, L.BufferLocality()).name == "mlx5_0"  # unknown: first by name
    assert L.choose_nic(nics, L.BufferLocality(), prefer="mlx5_3").name == "mlx5_3"
    assert L.choose_nic(nics, L.BufferLocality(), prefer="mlx5_2").name == "mlx5_0"  # forced but down
    assert L.choose_nic([n for n in nics if n.name == "mlx5_2"], L.BufferLocality()) is None


def test_pci_distance_and_cpulist():
    assert L.pci_distance(("r", "a", "b"), ("r", "a", "c")) == 2
    assert L.pci_distance(("r", "a"), ("r", "a", "b", "c")) == 2
    assert L.pci_distance(("r",), ("s",)) > 100
    assert L.parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}


def test_peermem_detection(tmp_path):
    assert not L.peermem_loaded(str(tmp_path))
    os.makedirs(tmp_path / "module" / "nvidia_peermem")
    assert L.peermem_loaded(str(tmp_path))


# --------------------------------------------------------------------------- capability and fallback
def test_diagnosis_messages(sysfs):
    assert "pyverbs is not importable" in L.diagnose("ModuleNotFoundError: pyverbs", None, [], [])
    msg = L.diagnose(None, "Failed to get devices list", [], [])
    assert "no RDMA device" in msg and "`ibv_devices`" in msg and "Failed to get devices list" in msg
    assert "`ibv_devices`" in L.diagnose(None, None, [], [])
    down = [n for n in L.scan_nics(sysfs) if n.name == "mlx5_2"]
    assert "no RDMA port is ACTIVE (mlx5_2/1)" in L.diagnose(None, None, ["mlx5_2"], down)
    assert L.diagnose(None, None, ["mlx5_0"], L.scan_nics(sysfs)) is None


def test_unavailable_here_with_one_clear_message():
    """Executed here: the real probe (real pyverbs when scripts/run linked it in)."""
    why, _ = rdma.probe(refresh=True)
    assert why is not None, "this machine has no RDMA device; if it has one now, run the conformance suite"
    with pytest.raises(E.TransportUnavailableError) as ei:
        get_transport("rdma")
    assert ("`ibv_devices`" in str(ei.value)) or ("pyverbs is not importable" in str(ei.value))


def test_fallback_decisions():
    peer = dict(transports=["rdma", "tcp", "tcp-py"], tcp="10.0.0.2:1", host="b", boot_id="y")
    mine = ep(host="a", boot_id="x")
    assert choose_transport(mine, ep(**peer)).name in ("tcp", "tcp-py")  # rdma unavailable here
    with pytest.raises(E.TransportUnavailableError, match="ibv_devices|pyverbs"):
        choose_transport(mine, ep(**peer), forced="rdma")
    t = rdma.RdmaTransport()
    assert t.usable_between(ep(rdma={"link_layer": "InfiniBand"}), ep(**peer, rdma={"link_layer": "InfiniBand"}))
    assert not t.usable_between(ep(rdma={"link_layer": "Ethernet"}), ep(**peer, rdma={"link_layer": "InfiniBand"}))
    assert not t.usable_between(ep(), ep(transports=["tcp"]))


def test_a_worker_advertises_what_each_available_transport_adds(monkeypatch):
    """The endpoint a worker joins with comes from the registry (one call, no transport named by the
    client): each available transport's `endpoint_info()`, nothing from an unavailable one."""
    ib = {"rdma": {"link_layer": "InfiniBand", "nics": ["mlx5_0/1"]}}
    assert "rdma" not in endpoint_info() and "cuda" not in endpoint_info()  # neither runs here
    with monkeypatch.context() as m:  # a host with an InfiniBand port
        m.setattr(rdma.RdmaTransport, "check_available", classmethod(lambda cls: None))
        m.setattr(rdma.RdmaTransport, "endpoint_info", classmethod(lambda cls: ib))
        info = endpoint_info()
    assert info["rdma"] == ib["rdma"] and "rdma" in info["transports"] and info["boot_id"] == boot_id()
    assert rdma.RdmaTransport().usable_between(ep(**{**info, "rdma": {"link_layer": "Ethernet"}}), ep(**info)) is False


def test_fetch_from_a_peer_advertising_rdma_falls_back_to_tcp(make_client, monkeypatch):
    """A real hub, publisher and reader on two 'hosts': the publisher advertises rdma; this reader
    cannot run it, so the fetch goes over TCP and says so."""
    with monkeypatch.context() as m:  # the publisher's host has RDMA: join() advertises it
        m.setattr(rdma.RdmaTransport, "check_available", classmethod(lambda cls: None))
        assert "rdma" in endpoint_info()["transports"]
        pub = make_client(host="a", name="trainer")
    reader = make_client(host="b", name="rollout")
    w = {"w": torch.randn(1000), "b": torch.arange(7)}
    pub.publish("policy", 1, w)
    got = reader.fetch("policy", "latest")
    # Which TCP transport is the one measured fastest on this host (rlsync.hub.dataplane.tuning).
    assert got.transports.keys() == {pub.worker_id} and got.transports[pub.worker_id] in ("tcp", "tcp-py")
    assert torch.equal(got.tensors["w"], w["w"]) and torch.equal(got.tensors["b"], w["b"])


# --------------------------------------------------------------------------- the real pyverbs' surface
def test_completion_table_and_thin_layer_names_match_installed_pyverbs():
    """Executed here when pyverbs is importable: no device needed to check names and enum values."""
    pytest.importorskip("pyverbs", reason="pyverbs not importable (install python3-pyverbs; scripts/run links it)")
    import pyverbs.enums as ve
    from pyverbs import addr, cq, device, qp, wr
    for status, _ in L.WC_STATUS.items():
        assert int(ve.ibv_wc_status(status)) == status
    assert int(ve.IBV_WC_REM_ACCESS_ERR) == 10 and int(ve.IBV_WC_RETRY_EXC_ERR) == 12
    assert [int(getattr(ve, f"IBV_MTU_{b}")) for b in (256, 512, 1024, 2048, 4096)] == [1, 2, 3, 4, 5]
    for obj, names in [(qp.QPAttr, ["path_mtu", "dest_qp_num", "rq_psn", "sq_psn", "max_dest_rd_atomic",
                                     "max_rd_atomic", "min_rnr_timer", "timeout", "retry_cnt", "rnr_retry",
                                     "qp_access_flags", "ah_attr"]),
                       (qp.QP, ["to_rts", "post_send", "qp_num", "close"]), (wr.SendWR, ["set_wr_rdma"]),
                       (cq.CQ, ["poll", "close"]), (cq.WC, ["wr_id", "status", "byte_len", "vendor_err"]),
                       (device.PortAttr, ["lid", "active_mtu", "gid_tbl_len", "state", "link_layer"]),
                       (device.DeviceAttr, ["max_qp_rd_atom"]), (device.Context, ["query_port", "query_gid"]),
                       (addr.GID, ["gid"])]:
        for n in names:
            assert hasattr(obj, n), f"{obj.__name__}.{n}"
    w = wr.SendWR(wr_id=3, opcode=ve.IBV_WR_RDMA_READ, num_sge=1, sg=[wr.SGE(0x1000, 64, 5)],
                  send_flags=ve.IBV_SEND_SIGNALED)
    w.set_wr_rdma(9, 0x2000)  # builds the READ work request; posting it needs a device
    assert addr.GID(GID).gid == GID
    with pytest.raises(Exception, match="devices list"):  # ENVIRONMENT.md: raises, not []
        device.get_device_list()


# --------------------------------------------------------------------------- FAKE verbs, real data plane
class FakeFabric:
    """Stands in for NICs and the wire: memory regions by rkey, queue pairs by QPN. In-process only."""

    def __init__(self, fail_read: int | None = None, fail_status: int = 12) -> None:
        self.mrs: dict[int, tuple[int, int]] = {}
        self.qps: dict[int, "FakeQp"] = {}
        self.keys = itertools.count(100)
        self.reads: list[L.ReadOp] = []
        self.max_outstanding = 0
        self.closed = 0
        self.fail_read, self.fail_status = fail_read, fail_status


class FakeNic:
    def __init__(self, fabric: FakeFabric, port: L.NicPort) -> None:
        self.fabric, self.port_info, self._mrs = fabric, port, {}

    def register(self, rep):
        if id(rep) not in self._mrs:
            keys = []
            for a, s in zip(rep.addresses, rep.manifest.tensors):
                k = next(self.fabric.keys)
                self.fabric.mrs[k] = (a, s.nbytes)
                keys.append((a, k, k))
            self._mrs[id(rep)] = keys
        return self._mrs[id(rep)]

    def create_qp(self, depth):
        return FakeQp(self.fabric, depth)


class FakeQp:
    def __init__(self, fabric: FakeFabric, depth: int) -> None:
        self.fabric, self.depth = fabric, depth
        self.qpn = next(fabric.keys)
        fabric.qps[self.qpn] = self
        self.peer, self.done, self.inflight, self.closed = None, [], 0, False

    def local_info(self):
        return L.QpInfo(qpn=self.qpn, psn=self.qpn & 0xFFFFFF, lid=1, gid=GID, mtu=4096, nic="fake0")

    def connect(self, peer: L.QpInfo):
        self.peer = self.fabric.qps[peer.qpn]

    def post_read(self, op: L.ReadOp):
        assert self.peer is not None, "READ posted before the QP was connected"
        self.inflight += 1
        self.fabric.max_outstanding = max(self.fabric.max_outstanding, self.inflight)
        n = len(self.fabric.reads)
        self.fabric.reads.append(op)
        a, ln = self.fabric.mrs.get(op.rkey, (0, 0))
        if self.peer.closed or n == self.fabric.fail_read:
            status = self.fabric.fail_status
        elif not (a <= op.remote_addr and op.remote_addr + op.length <= a + ln):
            status = 10  # remote access error: outside the region the rkey names
        else:
            ctypes.memmove(op.local_addr, op.remote_addr, op.length)
            status = 0
        self.done.append((op.wr_id, status, op.length, 0))

    def poll(self, n):
        out, self.done = self.done[:n], self.done[n:]
        self.inflight -= len(out)
        return out

    def close(self):
        self.closed = True
        self.fabric.closed += 1


SIGNER = TicketSigner()
READER = ReaderKey()


@pytest.fixture
def fake_rdma(monkeypatch):
    fabric = FakeFabric()
    port = L.NicPort("fake0", 1, True, "InfiniBand", -1, ())
    monkeypatch.setattr(rdma, "probe", lambda refresh=False: (None, [port]))
    nics = {}
    monkeypatch.setattr(rdma, "open_nic", lambda p: nics.setdefault(p.name, FakeNic(fabric, p)))
    monkeypatch.setattr(rdma, "CONFIG", rdma.RdmaConfig(window=3, max_read=16 << 10))
    store = ReplicaStore()
    server = DataServer(store, DataPlaneConfig(io_timeout_s=5.0))
    server.worker_id, server.verifier = "src", TicketVerifier(SIGNER.public_bytes)
    yield fabric, store, ep(server.address, pid=os.getpid(), host="h", boot_id="b")
    server.close()


def fake_read(endpoint, rep, units=None):
    dest = LocalReplica("dest", rep.manifest, allocate(rep.manifest), full=False)
    tk = SIGNER.sign(Ticket("f1", "reader", READER.public_bytes, "src", rep.id, 2e9))
    units = list(range(len(rep.manifest.units))) if units is None else units
    n = read_from_source(rdma.RdmaTransport(), endpoint, tk, rep.id, units, dest, 5.0, reader=READER)
    return dest, n


def tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"emb": torch.randn(300, 257, generator=g), "bias": torch.randn(7, generator=g).to(torch.bfloat16),
            "w": torch.randint(-99, 99, (1000,), generator=g, dtype=torch.int16)}


def test_fake_verbs_exact_bytes_window_and_teardown(fake_rdma):
    fabric, store, endpoint = fake_rdma
    t = tensors()
    rep = LocalReplica("r1", build_manifest(t, ManifestConfig(chunk_bytes=64 << 10, pack_below=4 << 10)), t, full=True)
    store.add(rep)
    dest, n = fake_read(endpoint, rep)
    assert n == rep.manifest.nbytes and dest.complete
    for k in t:
        assert torch.equal(dest.tensors[k].view(-1).view(torch.uint8), t[k].view(-1).view(torch.uint8))
    assert max(op.length for op in fabric.reads) == 16 << 10  # 64 KiB units cut into 16 KiB READs
    assert fabric.max_outstanding == 3  # the window
    assert rep.wait_drained(5)  # the server counted the read drained after the reader's "done"
    wait_for(lambda: fabric.closed == 2, 5.0, "both queue pairs destroyed")


def test_fake_verbs_error_completion_fails_the_read_cleanly(fake_rdma):
    fabric, store, endpoint = fake_rdma
    fabric.fail_read = 5  # the 6th READ comes back with IBV_WC_RETRY_EXC_ERR (source gone)
    t = tensors(1)
    rep = LocalReplica("r1", build_manifest(t, ManifestConfig(chunk_bytes=64 << 10)), t, full=True)
    store.add(rep)
    with pytest.raises(E.TransferError, match="retry counter exceeded"):
        fake_read(endpoint, rep)
    assert rep.wait_drained(5)
    wait_for(lambda: fabric.closed == 2, 5.0, "both queue pairs destroyed")
    fabric.fail_read = None
    dest, _ = fake_read(endpoint, rep)  # the server is unharmed
    assert dest.complete


def test_fake_verbs_request_without_exchange_is_refused(fake_rdma, monkeypatch):
    _, store, endpoint = fake_rdma
    t = tensors(2)
    rep = LocalReplica("r1", build_manifest(t, ManifestConfig()), t, full=True)
    store.add(rep)
    monkeypatch.setattr(rdma.RdmaTransport, "open_request", lambda self, dest, peer: None)
    with pytest.raises(E.ProtocolError, match="queue-pair address"):
        fake_read(endpoint, rep)
