"""GPU memory in the hub without a GPU: what can be checked here, and nothing more.

No test in this file touches a GPU; none could (CPU-only torch, no device).
- Pure logic: diagnosis and the dtype/shape/device checks of fetch targets (dataplane/device.py),
  the cuda_ipc frame (handles once per connection, inline host segments) and its validation
  (transports/cuda_logic.py).
- FAKE DEVICE: the device calls (device.py's `is_gpu`, `pinned_like`, `sync`; cuda.py's
  `share_handle`, `open_handle`) replaced so that chosen host tensors play "GPU tensors". This runs
  the staging path (publish through a host mirror, fetch into "device" tensors after verification)
  and the cuda_ipc transport over a real data-plane server. It checks our bookkeeping, not CUDA.
"""
from __future__ import annotations

import os

import pytest
import torch

from rlsync.hub import errors as E
from rlsync.hub.dataplane import device as D
from rlsync.hub.model import manifest as M
from rlsync.hub.dataplane.config import DataPlaneConfig
from rlsync.hub.dataplane.transfer import DataServer, read_from_source
from rlsync.hub.model.manifest import ManifestConfig, build_manifest
from rlsync.hub.dataplane.store import LocalReplica, ReplicaStore
from rlsync.hub.protocol.tickets import ReaderKey, Ticket, TicketSigner, TicketVerifier
from rlsync.hub.dataplane.transports import choose_transport, cuda, get_transport
from rlsync.hub.dataplane.transports import cuda_logic as C
from rlsync.hub.dataplane.transports.tcp_py import PyTcpTransport
from endpoints import ep  # tests/hub/dataplane/endpoints.py


# --------------------------------------------------------------------------- capability
def test_diagnosis():
    assert "CPU-only build" in D.diagnose_cuda("2.13.0+cpu", None, False, 0)
    msg = D.diagnose_cuda("2.13.0", "12.8", False, 0)
    assert "no usable GPU" in msg and "`nvidia-smi`" in msg
    assert D.diagnose_cuda("2.13.0", "12.8", True, 2) is None


def test_unavailable_here_with_one_clear_message():
    """Executed here: the real torch of this venv (a CPU build)."""
    why = D.unavailable_reason()
    assert why is not None, "this machine has no GPU; if it has one now, run the conformance suite"
    with pytest.raises(E.TransportUnavailableError, match="cuda_ipc: .*nvidia-smi"):
        get_transport("cuda_ipc")
    peer = ep(transports=["cuda_ipc", "shm", "tcp", "tcp-py"], host="h", boot_id="b", pid=1)
    mine = ep(host="h", boot_id="b", pid=2)
    assert choose_transport(mine, peer).name == "shm"  # falls back to the best host-memory path


def test_cuda_ipc_usable_only_between_processes_of_one_host():
    t = cuda.CudaIpcTransport()
    peer = ep(transports=["cuda_ipc"], host="h", boot_id="b", pid=1)
    assert t.usable_between(ep(host="h", boot_id="b", pid=2), peer)
    assert not t.usable_between(ep(host="h", boot_id="b", pid=1), peer)  # the exporting process
    assert not t.usable_between(ep(host="g", boot_id="b", pid=2), peer)
    assert not t.usable_between(ep(host="h", boot_id="c", pid=2), peer)


def test_torch_has_the_ipc_entry_points_we_call():
    """Executed here: the names exist in this torch (calling them needs a GPU)."""
    assert hasattr(torch.UntypedStorage, "_share_cuda_") and hasattr(torch.UntypedStorage, "_new_shared_cuda")


# --------------------------------------------------------------------------- dtype / shape / device checks
SPECS = build_manifest({"w": torch.zeros(4, 3), "b": torch.zeros(5, dtype=torch.bfloat16)}, ManifestConfig()).tensors


def spec(name="w", dtype="float32", shape=(4, 3), device="cuda:0", contiguous=True):
    return M.BufferSpec(name, dtype, shape, device, contiguous)


def test_buffer_checks_accept_matching_cuda_and_host_buffers():
    M.check_buffers(SPECS, [spec(), spec("b", "bfloat16", (5,), "cpu")], cuda_ok=True)


@pytest.mark.parametrize("into,words", [
    ([spec()], r"missing \['b'\]"),
    ([spec(), spec("b", "bfloat16", (5,)), spec("x")], r"unexpected \['x'\]"),
    ([spec(shape=(3, 4)), spec("b", "bfloat16", (5,))], r"is \(3, 4\) float32; the version has \(4, 3\) float32"),
    ([spec(dtype="float16"), spec("b", "bfloat16", (5,))], "float16; the version has"),
    ([spec(contiguous=False), spec("b", "bfloat16", (5,))], "not contiguous"),
    ([spec(device="meta"), spec("b", "bfloat16", (5,))], "host or CUDA memory expected"),
])
def test_buffer_checks_refuse(into, words):
    with pytest.raises(E.BufferMismatchError, match=words):
        M.check_buffers(SPECS, into, cuda_ok=True)


def test_cuda_buffers_refused_where_cuda_is_unavailable():
    with pytest.raises(E.BufferMismatchError, match="CUDA is unavailable"):
        M.check_buffers(SPECS, [spec(), spec("b", "bfloat16", (5,))], cuda_ok=False)
    with pytest.raises(E.BufferMismatchError, match="host or CUDA tensors only"):
        D.check_tensors({"w": torch.empty(3, device="meta")}, "into")
    with pytest.raises(E.BufferMismatchError, match="contiguous"):
        D.check_tensors({"w": torch.empty(3, 4).t()}, "into")
    D.check_tensors({"w": torch.empty(3)}, "into")


# --------------------------------------------------------------------------- the cuda_ipc frame
HANDLE = C.IpcHandle(0, b"\x01" * 64, 4096, 0, b"ref", 8, b"", False, 256)


def test_ipc_handle_round_trip_and_malformed():
    assert C.IpcHandle.from_wire(HANDLE.to_wire()) == HANDLE
    for bad in [[1, 2], None, HANDLE.to_wire()[:-1], [-1, b"x", 1, 0, b"", 0, b"", False, 0],
                [0, b"", 1, 0, b"", 0, b"", False, 0]]:
        with pytest.raises(E.ProtocolError):
            C.IpcHandle.from_wire(bad)


def test_frame_sends_each_handle_once_and_host_segments_inline():
    import msgpack
    book = C.HandleBook()
    segs = [(0, 0, 8), (1, 0, 4), (2, 16, 8)]
    on_gpu = {0: True, 1: False, 2: True}.get
    parts = C.encode_frame(segs, on_gpu, lambda ti: HANDLE, book, lambda ti, off, ln: b"H" * ln)
    (hlen,) = C.HEADER.unpack(parts[0][:4])
    msg = msgpack.unpackb(parts[0][4:4 + hlen], strict_map_key=False)
    assert sorted(msg["h"]) == [0, 2] and parts[1:] == [b"HHHH"]
    got, new = C.decode_header(msg, segs, {})
    assert [(s.kind, s.tensor, s.offset, s.length) for s in got] == [(C.IPC, 0, 0, 8), (C.INLINE, 1, 0, 4),
                                                                     (C.IPC, 2, 16, 8)]
    assert set(new) == {0, 2} and C.inline_total(got) == 4
    parts2 = C.encode_frame([(0, 8, 8)], on_gpu, lambda ti: HANDLE, book, None)  # same connection, next unit
    msg2 = msgpack.unpackb(parts2[0][4:], strict_map_key=False)
    assert msg2["h"] == {}
    with pytest.raises(E.ProtocolError, match="no IPC handle"):
        C.decode_header(msg2, [(0, 8, 8)], {})  # a reader that never got tensor 0's handle
    C.decode_header(msg2, [(0, 8, 8)], {0: object()})


@pytest.mark.parametrize("msg", [
    {"h": {}, "s": [[C.IPC, 0, 0, 8]]},                  # no handle for tensor 0
    {"h": {}, "s": [[C.INLINE, 9]]},                      # wrong inline length
    {"h": {0: HANDLE.to_wire()}, "s": [[C.IPC, 0, 8, 8]]},  # another offset than the manifest's
    {"h": {}, "s": [[7, 1]]}, {"h": {}, "s": []}, {"s": []}, {"h": {0: [1]}, "s": [[C.INLINE, 8]]},
])
def test_frame_validation(msg):
    with pytest.raises(E.ProtocolError):
        C.decode_header(msg, [(0, 0, 8)], {})


# --------------------------------------------------------------------------- FAKE device, real data plane
@pytest.fixture
def fake_gpu(monkeypatch):
    """Host tensors registered here play GPU tensors; IPC handles are indices into a table."""
    gpu: dict[int, torch.Tensor] = {}
    shared: list[torch.Tensor] = []
    monkeypatch.setattr(D, "is_gpu", lambda t: id(t) in gpu)
    monkeypatch.setattr(D, "pinned_like", lambda t: torch.empty(t.shape, dtype=t.dtype))
    monkeypatch.setattr(D, "sync", lambda: None)

    def share(t):
        shared.append(t)
        return C.IpcHandle(0, str(len(shared) - 1).encode(), t.numel() * t.element_size(), 0, b"r", 0, b"", False, 0)

    monkeypatch.setattr(cuda, "share_handle", share)
    monkeypatch.setattr(cuda, "open_handle", lambda h: shared[int(h.handle)].reshape(-1).view(torch.uint8))
    monkeypatch.setattr(cuda.CudaIpcTransport, "check_available", classmethod(lambda cls: None))

    def on_gpu(t):
        gpu[id(t)] = t
        return t

    return on_gpu, shared


SIGNER = TicketSigner()
READER = ReaderKey()


@pytest.fixture
def server():
    store = ReplicaStore()
    s = DataServer(store, DataPlaneConfig(io_timeout_s=5.0))
    s.worker_id, s.verifier = "src", TicketVerifier(SIGNER.public_bytes)
    yield store, ep(s.address, pid=os.getpid(), host="h", boot_id="b")
    s.close()


def weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"emb": torch.randn(200, 129, generator=g), "w": torch.randint(-9, 9, (333,), generator=g, dtype=torch.int16),
            "bias": torch.randn(5, generator=g).to(torch.bfloat16)}


def fetch_into(transport, endpoint, rep, into):
    dest = D.make_replica("dest", rep.manifest, into, full=False)
    tk = SIGNER.sign(Ticket("f1", "reader", READER.public_bytes, "src", rep.id, 2e9))
    read_from_source(transport, endpoint, tk, rep.id, list(range(len(rep.manifest.units))), dest, 5.0, reader=READER)
    return dest


CFG = ManifestConfig(chunk_bytes=32 << 10, pack_below=4 << 10, pack_bytes=16 << 10)


def test_staging_publish_from_and_fetch_into_device_tensors_over_tcp(fake_gpu, server):
    on_gpu, _ = fake_gpu
    store, endpoint = server
    w = weights()
    src = {"emb": on_gpu(w["emb"].clone()), "w": w["w"], "bias": on_gpu(w["bias"].clone())}
    rep = D.DeviceReplica.for_publish("r1", src, CFG)
    assert rep.tensors["emb"] is not src["emb"] and rep.tensors["w"] is src["w"]  # mirror only for GPU tensors
    assert torch.equal(rep.tensors["emb"], w["emb"])  # staged device -> host at publish
    store.add(rep)
    into = {"emb": on_gpu(torch.zeros(200, 129)), "w": torch.zeros(333, dtype=torch.int16),
            "bias": on_gpu(torch.zeros(5, dtype=torch.bfloat16))}
    D.check_into(rep.manifest, into)  # names, dtypes, shapes, contiguity, devices
    dest = fetch_into(PyTcpTransport(), endpoint, rep, into)
    assert isinstance(dest, D.DeviceReplica) and dest.complete and all(dest.on_device)
    for k in w:
        assert torch.equal(into[k], w[k]), k  # copied host -> "device" after each unit verified


def test_cuda_ipc_device_to_device_with_handles_once(fake_gpu, server):
    on_gpu, shared = fake_gpu
    store, endpoint = server
    w = weights(1)
    src = {"emb": on_gpu(w["emb"].clone()), "w": w["w"], "bias": on_gpu(w["bias"].clone())}
    rep = D.DeviceReplica.for_publish("r1", src, CFG)
    store.add(rep)
    assert len(rep.manifest.units) > 3
    into = {"emb": on_gpu(torch.zeros(200, 129)), "w": torch.zeros(333, dtype=torch.int16),
            "bias": on_gpu(torch.zeros(5, dtype=torch.bfloat16))}
    dest = fetch_into(cuda.CudaIpcTransport(), endpoint, rep, into)
    assert len(shared) == 2  # one handle per GPU tensor per connection, not per unit
    for k in w:
        assert torch.equal(into[k], w[k]), k
        assert torch.equal(dest.tensors[k], w[k]), k  # the host mirror the checksum was computed on
    emb_units = [u for u, unit in enumerate(rep.manifest.units) if all(ti == 0 for ti, _, _ in unit.segments)]
    assert emb_units and all(dest.on_device[u] for u in emb_units)
    assert rep.wait_drained(5)


def test_cuda_ipc_device_bytes_changed_after_publish_fail_the_checksum(fake_gpu, server):
    on_gpu, _ = fake_gpu
    store, endpoint = server
    w = weights(2)
    src = {k: on_gpu(v.clone()) for k, v in w.items()}
    rep = D.DeviceReplica.for_publish("r1", src, CFG)
    store.add(rep)
    src["emb"].view(-1)[3] += 1  # a broken mutability contract on the device copy
    into = {k: on_gpu(torch.zeros_like(v)) for k, v in w.items()}
    with pytest.raises(E.ChecksumError):
        fetch_into(cuda.CudaIpcTransport(), endpoint, rep, into)
