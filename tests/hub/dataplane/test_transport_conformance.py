"""One contract, every transport: the same data-plane behaviour from `tcp`, `tcp-py`, `shm`, ...

Each test runs against every registered transport (skipped, with the transport's own reason, where
it cannot run here). Source and reader share this process — a real `DataServer` on loopback and
`read_from_source` — so the suite is fast; peer death, silence and malformed frames come from a
scripted fake source that replays (a cut of) the real transport's own frames.
"""
from __future__ import annotations

import os
import socket
import threading
import time

import msgpack
import pytest
import torch

from rlsync.hub import errors as E
from rlsync.hub.dataplane.config import DataPlaneConfig
from rlsync.hub.dataplane.transfer import DataServer, read_from_source
from rlsync.hub.dataplane.wire import ERR, REQ, UNIT
from rlsync.hub.model.manifest import ManifestConfig, allocate, build_manifest
from rlsync.hub.dataplane.store import LocalReplica, ReplicaStore
from rlsync.hub.protocol.tickets import ReaderKey, Ticket, TicketSigner, TicketVerifier
from rlsync.hub.dataplane.transports import get_transport, transport_names
from rlsync.hub.dataplane.transports.base import Transport, recv_exact, transport_by_kind
from rlsync.hub.dataplane.transports import boot_id
from endpoints import ep  # tests/hub/dataplane/endpoints.py

SMALL = ManifestConfig(chunk_bytes=64 << 10, pack_below=4 << 10, pack_bytes=16 << 10)
SIGNER = TicketSigner()
READER = ReaderKey()


HARDWARE = {"rdma": pytest.mark.rdma, "cuda_ipc": pytest.mark.cuda}
"""Transports that need a device this CI lacks: marked, and skipped below with the transport's reason."""


@pytest.fixture(params=[pytest.param(n, marks=HARDWARE.get(n, ())) for n in transport_names()])
def transport(request):
    try:
        return get_transport(request.param)
    except E.TransportUnavailableError as e:
        pytest.skip(f"{request.param}: {e}")


def model(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"emb": torch.randn(300, 257, generator=g),                # chunked: several units
            "w": torch.randint(-99, 99, (1000,), generator=g, dtype=torch.int16),
            "bias": torch.randn(7, generator=g).to(torch.bfloat16),  # tiny: packed
            "norm": torch.randn(33, generator=g, dtype=torch.float64),
            "flag": torch.tensor([True, False, True])}


class Source:
    """A data-plane server holding replicas, as a worker that joined a hub would."""

    def __init__(self, cfg: DataPlaneConfig | None = None) -> None:
        self.store = ReplicaStore()
        self.server = DataServer(self.store, cfg or DataPlaneConfig(io_timeout_s=5.0))
        self.server.worker_id, self.server.verifier = "src", TicketVerifier(SIGNER.public_bytes)
        self.endpoint = ep(self.server.address, pid=os.getpid(), boot_id=boot_id(), host="h")

    def add(self, tensors: dict[str, torch.Tensor], rid: str = "r1", full: bool = True, cfg=SMALL,
            buffers: dict[str, torch.Tensor] | None = None) -> LocalReplica:
        """Hold `tensors` (or, for a relay, their manifest over `buffers` still to be filled)."""
        rep = LocalReplica(rid, build_manifest(tensors, cfg), buffers or tensors, full=full)
        self.store.add(rep)
        return rep

    def close(self) -> None:
        self.server.close()


@pytest.fixture(scope="module")
def _server():
    s = Source()
    yield s
    s.close()


@pytest.fixture
def source(_server):
    """The module's one data-plane server (start-up is not free), emptied after each test."""
    yield _server
    for rep in _server.store.all():
        _server.store.remove(rep.id)


def ticket(replica: str = "r1", source: str = "src", signer: TicketSigner = SIGNER) -> bytes:
    return signer.sign(Ticket("f1", "reader", READER.public_bytes, source, replica, time.time() + 60))


def read(transport, src_endpoint, rep: LocalReplica, into=None, units=None, streams=1, timeout=5.0, tk=None):
    dest = LocalReplica("dest", rep.manifest, into if into is not None else allocate(rep.manifest), full=False)
    units = list(range(len(rep.manifest.units))) if units is None else units
    n = read_from_source(transport, src_endpoint, tk or ticket(rep.id), rep.id, units, dest, timeout, streams=streams, reader=READER)
    return dest, n


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
        assert torch.equal(a[k].view(-1).view(torch.uint8), b[k].view(-1).view(torch.uint8)), k


@pytest.mark.parametrize("streams", [1, 3])
def test_exact_bytes(transport, source, streams):
    tensors = model()
    rep = source.add(tensors)
    assert len(rep.manifest.units) > 5
    dest, n = read(transport, source.endpoint, rep, streams=streams)
    assert n == rep.manifest.nbytes and dest.complete
    assert_same(dest.tensors, tensors)
    assert rep.wait_drained(5)  # every stream's read was accounted as drained


def test_relay_waits_for_units_then_forwards(transport, source, wait_until):
    tensors = model(1)
    upstream = {k: torch.zeros_like(v) for k, v in tensors.items()}
    relay = source.add(tensors, full=False, buffers=upstream)  # a fetch in progress: serves what it has
    result, errors = {}, []

    def reader():
        try:
            result["dest"], _ = read(transport, source.endpoint, relay)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=reader)
    t.start()
    wait_until(lambda: relay.readers > 0 or errors, what="the reader's request on the relay")
    assert t.is_alive() and not errors  # waiting on the relay's condition variable, not failing
    for k in tensors:
        upstream[k].copy_(tensors[k])
    for u in range(len(relay.manifest.units)):
        relay.mark_present(u)
    t.join(10)
    assert not errors and "dest" in result
    assert_same(result["dest"].tensors, tensors)


def test_relay_failure_reaches_the_reader(transport, source, wait_until):
    relay = source.add(model(2), full=False)

    def fail_once_read():  # the upstream dies while the reader waits on the relay
        wait_until(lambda: relay.readers > 0, what="the reader's request on the relay")
        relay.fail("upstream died")

    threading.Thread(target=fail_once_read, daemon=True).start()
    with pytest.raises(E.TransferError, match="upstream died"):
        read(transport, source.endpoint, relay)


def test_ticket_refused(transport, source):
    rep = source.add(model())
    with pytest.raises(E.TicketError, match="forged"):
        read(transport, source.endpoint, rep, tk=ticket(signer=TicketSigner()))
    with pytest.raises(E.TicketError):
        read(transport, source.endpoint, rep, tk=ticket(replica="other"))
    with pytest.raises(E.TicketError):
        read(transport, source.endpoint, rep, tk=b"not a ticket" * 8)
    dest, _ = read(transport, source.endpoint, rep)  # the server is unharmed
    assert dest.complete


def test_zero_size_tensors(transport, source):
    tensors = {"empty": torch.empty(0, 5), "x": torch.arange(10.0), "none": torch.empty(0, dtype=torch.int8)}
    rep = source.add(tensors)
    dest, n = read(transport, source.endpoint, rep, streams=2)
    assert n == 40 and dest.complete
    assert_same(dest.tensors, tensors)
    only_empty = source.add({"e": torch.empty(0)}, rid="r2")
    assert len(only_empty.manifest.units) == 0
    dest, n = read(transport, source.endpoint, only_empty)
    assert n == 0 and dest.complete


def test_non_contiguous_tensor_refused(transport, source):
    t = torch.randn(64, 32).t()
    with pytest.raises(E.BufferMismatchError, match="contiguous"):
        source.add({"w": t})  # a source cannot serve it
    rep = source.add({"w": t.contiguous()})
    with pytest.raises(E.BufferMismatchError, match="contiguous"):
        read(transport, source.endpoint, rep, into={"w": torch.empty(64, 32).t()})  # nor a reader land in it


def test_many_tiny_units(transport, source):
    g = torch.Generator().manual_seed(3)
    tensors = {f"t{i}": torch.randn(int(torch.randint(1, 40, (1,), generator=g)), generator=g) for i in range(600)}
    tensors["big"] = torch.randn(1 << 16, generator=g)
    cfg = ManifestConfig(chunk_bytes=4096, pack_below=1024, pack_bytes=512)
    rep = source.add(tensors, cfg=cfg)
    assert len(rep.manifest.units) > 150
    t0 = time.monotonic()
    dest, _ = read(transport, source.endpoint, rep, streams=2)
    assert_same(dest.tensors, tensors)
    assert time.monotonic() - t0 < 10


def test_corrupt_source_bytes_fail_the_checksum(transport, source):
    tensors = model(4)
    rep = source.add(tensors)
    tensors["emb"].view(-1)[5] += 1.0  # changed after publish: a broken mutability contract
    with pytest.raises(E.ChecksumError):
        read(transport, source.endpoint, rep)


# ---------------------------------------------------------------- a scripted, misbehaving source
def unit_frames(transport, rep: LocalReplica, u: int) -> bytes:
    """The exact bytes `transport` puts on the wire for unit u."""
    if type(transport).accept_request is not Transport.accept_request:
        pytest.skip(f"{transport.name}: its unit frames need a live per-connection exchange (not replayable)")
    a, b = socket.socketpair()
    out = bytearray()

    def drain():
        while chunk := b.recv(1 << 16):
            out.extend(chunk)

    t = threading.Thread(target=drain)
    t.start()
    transport.send_unit(a, rep, u)
    a.close()
    t.join()
    b.close()
    return bytes(out)


class FakeSource:
    """Accepts one reader, reads its request, then sends `wire` and closes (or hangs if hang=True)."""

    def __init__(self, wire: bytes, hang: bool = False) -> None:
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.endpoint = ep(f"127.0.0.1:{self.lsock.getsockname()[1]}", pid=os.getpid(), boot_id=boot_id(), host="h")
        self.wire, self.hang, self.done = wire, hang, threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        conn, _ = self.lsock.accept()
        head = bytearray(REQ.size)
        recv_exact(conn, memoryview(head))
        recv_exact(conn, memoryview(bytearray(REQ.unpack(head)[4])))
        conn.sendall(self.wire)
        if self.hang:
            self.done.wait(10)
        conn.close()
        self.lsock.close()


def test_peer_death_mid_unit(transport, source):
    rep = source.add(model(5))
    frames = unit_frames(transport, rep, 0) + unit_frames(transport, rep, 1)
    cut = len(unit_frames(transport, rep, 0)) + (len(frames) - len(unit_frames(transport, rep, 0))) // 2
    fake = FakeSource(frames[:cut])  # unit 0 whole, unit 1 cut in the middle, then the peer is gone
    dest = LocalReplica("dest", rep.manifest, allocate(rep.manifest), full=False)
    with pytest.raises(E.TransferError):
        read_from_source(transport, fake.endpoint, ticket(), rep.id, [0, 1], dest, 5.0, reader=READER)
    assert dest.present[0] and not dest.present[1]  # nothing torn is ever marked present


def test_silent_peer_times_out(transport, source):
    rep = source.add(model(6))
    fake = FakeSource(unit_frames(transport, rep, 0)[:UNIT.size + 3], hang=True)
    dest = LocalReplica("dest", rep.manifest, allocate(rep.manifest), full=False)
    t0 = time.monotonic()
    with pytest.raises(E.TransferError, match="stalled|silent|timed out"):
        read_from_source(transport, fake.endpoint, ticket(), rep.id, [0], dest, 0.5, reader=READER)
    fake.done.set()
    assert time.monotonic() - t0 < 3 and not dest.present[0]


@pytest.mark.parametrize("wire", [
    UNIT.pack(7, 0, 10),                                    # a unit nobody asked for
    UNIT.pack(0, 9, 10),                                    # an unknown status
    UNIT.pack(0, 0, 1 << 62),                               # an absurd length
    UNIT.pack(0, ERR, 1 << 40),                             # an oversized error frame
    UNIT.pack(0, ERR, 5) + b"\xc1\xc1\xc1\xc1\xc1",         # an undecodable error frame
    b"\x00" * 5,                                            # half a header
], ids=["wrong-unit", "bad-status", "huge-length", "huge-error", "garbage-error", "short-header"])
def test_malformed_frames_raise_typed_errors(transport, source, wire):
    rep = source.add(model(7))
    fake = FakeSource(wire)
    dest = LocalReplica("dest", rep.manifest, allocate(rep.manifest), full=False)
    with pytest.raises(E.HubError):
        read_from_source(transport, fake.endpoint, ticket(), rep.id, [0], dest, 2.0, reader=READER)
    assert not any(dest.present)


def test_malformed_requests_leave_the_server_serving(transport, source):
    rep = source.add(model(8))
    host, port = source.server.address.rsplit(":", 1)
    bad = [b"GET / HTTP/1.1\r\n\r\n", REQ.pack(b"RLSD", 1, transport.kind, 0, 1 << 30),
           REQ.pack(b"RLSD", 1, transport.kind, 0, 4) + b"\xc1\xc1\xc1\xc1",
           REQ.pack(b"RLSD", 1, 250, 0, 0),
           b""]
    body = msgpack.packb({"ticket": ticket(), "replica": rep.id, "units": [0, 0, 10 ** 6]})
    bad.append(REQ.pack(b"RLSD", 1, transport.kind, 0, len(body)) + body)
    for wire in bad:
        with socket.create_connection((host, int(port)), timeout=5) as c:
            try:
                c.sendall(wire)
                c.shutdown(socket.SHUT_WR)
                while c.recv(1 << 16):
                    pass
            except OSError:
                pass  # the server hung up on us first: fine
    assert transport_by_kind(transport.kind) is type(transport)
    dest, _ = read(transport, source.endpoint, rep)
    assert_same(dest.tensors, rep.tensors)


def test_reader_death_mid_unit_leaves_the_server_serving(transport, source):
    rep = source.add({"w": torch.randn(1 << 20)}, cfg=ManifestConfig(chunk_bytes=2 << 20))
    host, port = source.server.address.rsplit(":", 1)
    body = msgpack.packb({"ticket": ticket(), "replica": rep.id, "units": [0, 1]})
    with socket.create_connection((host, int(port)), timeout=5) as c:
        c.sendall(REQ.pack(b"RLSD", 1, transport.kind, 0, len(body)) + body)
        recv_exact(c, memoryview(bytearray(UNIT.size + 8)))  # a header and a sliver, then gone
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
    assert rep.wait_drained(5)  # the server noticed, and counted the read as over
    dest, _ = read(transport, source.endpoint, rep)
    assert_same(dest.tensors, rep.tensors)


def test_native_engine_missing_falls_back_to_tcp_py(monkeypatch, caplog):
    from rlsync.hub.dataplane.transports import choose_transport, tcp_native

    monkeypatch.setattr(tcp_native, "_engine", None)
    monkeypatch.setattr(tcp_native, "_MISSING", "native engine rlsync._engine is not built (test)")
    monkeypatch.setattr(tcp_native, "_warned", False)
    with pytest.raises(E.TransportUnavailableError, match="not built"):
        get_transport("tcp")
    peer = ep(transports=["tcp", "tcp-py"])
    with caplog.at_level("WARNING"):
        assert choose_transport(ep(), peer).name == "tcp-py"
        assert choose_transport(ep(), peer).name == "tcp-py"
    assert sum("falling back to 'tcp-py'" in r.getMessage() for r in caplog.records) == 1
