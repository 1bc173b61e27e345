"""The data path chosen by measurement (rlsync.hub.dataplane.tuning): the choice is a pure function of
the measured numbers, the cache round-trips, a real calibration runs every candidate path, a fetch
reads the host's calibration and never runs one (none cached: the defaults at once), and the native
engine serves both send modes the calibration can pick, bit-exact."""
from __future__ import annotations

import json

import pytest

from rlsync.hub.dataplane import tuning as T
from rlsync.hub import errors as E
from rlsync.hub.dataplane.transports import get_transport
from rlsync.hub.dataplane.transports.tcp_native import NativeTcpTransport

import os
import time

import torch

from rlsync.hub.dataplane.config import DataPlaneConfig

from rlsync.hub.dataplane.transfer import DataServer, read_from_source
from rlsync.hub.model.manifest import ManifestConfig, allocate, build_manifest
from rlsync.hub.dataplane.store import LocalReplica, ReplicaStore
from rlsync.hub.protocol.tickets import ReaderKey, Ticket, TicketSigner, TicketVerifier
from endpoints import ep  # tests/hub/dataplane/endpoints.py

P = T.PathChoice
TCP2Z, TCP2C, TCP1Z, TCP4C = P("tcp", 2, True), P("tcp", 2, False), P("tcp", 1, True), P("tcp", 4, False)


def test_pick_takes_the_fastest_median_per_class():
    m = {TCP2Z: [3.9, 3.8, 4.0], TCP2C: [4.8, 4.9, 1.0], P("tcp-py"): [4.3], P("shm"): [7.6, 7.7]}
    assert T.pick(m, T.SAME_HOST) == P("shm")
    assert T.pick(m, T.REMOTE) == TCP2C  # median 4.8: the one slow round does not decide it
    assert T.pick(m, T.SAME_HOST, transport="tcp") == TCP2C


def test_pick_breaks_near_ties_towards_the_simplest_path():
    m = {TCP4C: [3.00], TCP2C: [2.98], TCP2Z: [2.97], TCP1Z: [2.90]}
    assert T.pick(m, T.REMOTE) == TCP2Z  # within 2%: fewer streams, then zero-copy
    assert T.pick(m, T.REMOTE, tolerance=0.0) == TCP4C
    assert T.pick(m, T.REMOTE, tolerance=0.05) == TCP1Z
    # the order of the dict does not matter
    assert T.pick(dict(reversed(list(m.items()))), T.REMOTE) == TCP2Z


def test_pick_refuses_what_it_cannot_decide():
    with pytest.raises(ValueError, match="peer class"):
        T.pick({TCP1Z: [1.0]}, "same_rack")
    with pytest.raises(ValueError, match="no measurement"):
        T.pick({P("shm"): [9.0], TCP1Z: []}, T.REMOTE)  # shm cannot cross hosts; tcp never ran


def test_a_calibration_from_a_saturated_machine_is_provisional():
    assert T.provisional(10.4, 1.0, 2) and T.provisional(4.0, 2.0, 2)
    assert not T.provisional(10.4, 6.0, 2)  # still busy: keep it rather than measure noise again
    assert not T.provisional(1.5, 0.1, 2)   # measured on a quiet machine: kept


def test_peer_class():
    a = ep(boot_id="b1", host="h")
    assert T.peer_class(a, ep(boot_id="b1", host="h")) == T.SAME_HOST
    assert T.peer_class(a, ep(boot_id="b2", host="h")) == T.REMOTE
    assert T.peer_class(ep(boot_id="", host="h"), ep(boot_id="", host="h")) == T.REMOTE


CAL = T.Calibration({TCP2C: [5.0], TCP1Z: [4.0], P("tcp-py"): [4.5], P("shm"): [6.0]}, 1, 0.5, 0.0, "h")


def test_choose_path_follows_the_calibration_and_the_config():
    mine = ep(boot_id="b", host="h")
    here = ep(boot_id="b", host="h", transports=["shm", "tcp", "tcp-py"])
    there = ep("10.0.0.2:1", boot_id="c", host="g", transports=["shm", "tcp", "tcp-py"])
    t, k = T.choose_path(mine, here, calibration=CAL)
    assert (t.name, k) == ("shm", 1)
    t, k = T.choose_path(mine, there, calibration=CAL)
    assert (t.name, k, t.zero_copy) == ("tcp", 2, False)
    t, k = T.choose_path(mine, ep(boot_id="b", host="h", transports=["tcp", "tcp-py"]), calibration=CAL)  # the peer serves no shm
    assert (t.name, k, t.zero_copy) == ("tcp", 2, False)
    t, k = T.choose_path(mine, there, forced="tcp-py", calibration=CAL)
    assert (t.name, k) == ("tcp-py", 1)
    t, k = T.choose_path(mine, there, streams=3, zero_copy=True, calibration=CAL)  # the config's fields win
    assert (t.name, k, t.zero_copy) == ("tcp", 3, True)


def test_a_fetch_reads_the_hosts_calibration_and_without_one_takes_the_defaults(tmp_path, monkeypatch):
    """choose_path (per source of every fetch) reads the cached file; none cached, or one it must not
    trust, gives the documented defaults at once. It never measures, whatever it finds."""
    monkeypatch.setenv("RLSYNC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(T, "calibrate", lambda *a, **k: pytest.fail("a fetch measured"))
    mine = ep(boot_id="b", host="h")
    there = ep("10.0.0.2:1", boot_id="c", host="g", transports=["shm", "tcp", "tcp-py"])
    t, k = T.choose_path(mine, there)
    assert (t.name, k, t.zero_copy) == ("tcp", T.FALLBACK_STREAMS, True)  # priority order; no file: defaults
    assert not any(tmp_path.rglob("*"))  # nothing measured, nothing locked, nothing written
    T.cache_file().parent.mkdir(parents=True)
    T.cache_file().write_text(json.dumps(CAL.to_json()))  # as `python -m rlsync.hub calibrate` leaves it
    monkeypatch.setattr(T, "provisional", lambda *a: False)
    t, k = T.choose_path(mine, there)
    assert (t.name, k, t.zero_copy) == ("tcp", 2, False)  # the calibration's remote choice, tcp x2 copying
    monkeypatch.setattr(T, "provisional", lambda *a: True)  # taken on a machine far busier than now
    t, k = T.choose_path(mine, there)
    assert (t.name, k, t.zero_copy) == ("tcp", T.FALLBACK_STREAMS, True)


def test_calibration_measures_every_path_and_caches_it(tmp_path, monkeypatch):
    monkeypatch.setenv("RLSYNC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(T, "provisional", lambda *a: False)  # whatever the load now: the file is reused
    monkeypatch.setattr(T, "calibrate", lambda: real(size=8 << 20, rounds=1))  # small: a test, not a figure
    cal = T.load_or_calibrate()
    usable = [c for c in T.CANDIDATES if _usable(c.transport)]
    assert set(cal.measured) == set(usable) and all(len(v) == 1 and v[0] > 0 for v in cal.measured.values())
    files = list((tmp_path / "dataplane").glob("*.json"))
    assert files == [T.cache_file()] and json.loads(files[0].read_text())["choices"][T.SAME_HOST]
    assert T.cached().measured == cal.measured  # what every fetch on the host now reads
    monkeypatch.setattr(T, "calibrate", lambda: pytest.fail("measured again although the host's file exists"))
    again = T.load_or_calibrate()
    assert again.measured == cal.measured and again.when == cal.when
    files[0].write_text('{"format": 0}')  # an older layout is measured anew, not trusted
    assert T.cached() is None  # ... and a fetch takes the defaults meanwhile
    anew = T.Calibration(cal.measured, cal.size_bytes, cal.loadavg, cal.when + 1, cal.host)  # measured once above
    monkeypatch.setattr(T, "calibrate", lambda: anew)
    assert T.load_or_calibrate() is anew


real = T.calibrate


def _usable(name: str) -> bool:
    try:
        get_transport(name)
        return True
    except E.TransportUnavailableError:
        return False


@pytest.fixture(scope="module")
def server():
    signer, store = TicketSigner(), ReplicaStore()
    s = DataServer(store, DataPlaneConfig(io_timeout_s=5.0))
    s.worker_id, s.verifier = "src", TicketVerifier(signer.public_bytes)
    yield s, store, signer
    s.close()


@pytest.mark.parametrize("zero_copy", [True, False])
@pytest.mark.parametrize("streams", [1, 4])
def test_native_tcp_serves_the_send_mode_the_reader_asks_for(server, monkeypatch, zero_copy, streams):
    _engine = pytest.importorskip("rlsync._engine", reason="native engine not built")
    modes = []
    real = _engine.send_frame

    def spy(fd, header, segs, timeout_ms, zc):
        modes.append(zc)
        return real(fd, header, segs, timeout_ms, zc)

    monkeypatch.setattr(_engine, "send_frame", spy)
    t = NativeTcpTransport()
    t.zero_copy = zero_copy
    srv, store, signer = server
    g = torch.Generator().manual_seed(streams)
    tensors = {"emb": torch.randn(300, 257, generator=g), "b": torch.randn(7, generator=g).to(torch.bfloat16),
               "i": torch.randint(-99, 99, (1000,), generator=g, dtype=torch.int16)}
    rid = f"r{streams}{zero_copy}"
    rep = LocalReplica(rid, build_manifest(tensors, ManifestConfig(chunk_bytes=64 << 10, pack_below=4 << 10)),
                       tensors, full=True)
    store.add(rep)
    dest = LocalReplica("dest", rep.manifest, allocate(rep.manifest), full=False)
    reader = ReaderKey()
    ticket = signer.sign(Ticket("f", "reader", reader.public_bytes, "src", rid, time.time() + 60))
    endpoint = ep(srv.address, pid=os.getpid(), boot_id="", host="h")
    n = read_from_source(t, endpoint, ticket, rid, list(range(len(rep.manifest.units))), dest, 5.0,
                         streams=streams, reader=reader)
    assert n == rep.manifest.nbytes and dest.complete and len(rep.manifest.units) > 4
    for k, v in tensors.items():
        assert torch.equal(dest.tensors[k].view(-1).view(torch.uint8), v.view(-1).view(torch.uint8)), k
    assert modes and set(modes) == {zero_copy}
    assert rep.wait_drained(5)
    store.remove(rid)


def test_native_tcp_refuses_malformed_request_options():
    t = NativeTcpTransport()
    for bad in ({"zc": 1}, {"zc": False, "x": 1}, ["zc"]):
        with pytest.raises(E.ProtocolError, match="request options"):
            t.accept_request(bad, None)
    t.accept_request({"zc": False}, None)
    assert t.zero_copy is False
    t.accept_request(None, None)
    assert t.zero_copy is True


def test_a_fetch_with_nothing_left_to_choose_reads_no_calibration(monkeypatch):
    monkeypatch.setattr(T, "cached", lambda: pytest.fail("read a calibration the config overrides in full"))
    t, k = T.choose_path(ep(boot_id="b", host="h"), ep("10.0.0.2:1", boot_id="c", host="g", transports=["tcp"]),
                         "tcp", 2, False)
    assert (t.name, k, t.zero_copy) == ("tcp", 2, False)


def test_a_stale_native_engine_is_told_and_calibrated_apart(tmp_path, monkeypatch):
    """An engine built from other csrc/ than the checkout's says so, and its calibration is its own."""
    from types import SimpleNamespace

    from rlsync.hub.dataplane import native as B

    for f in B.SOURCES:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text(f"// {f}\n")
    now = B.source_digest(tmp_path)
    monkeypatch.setattr(B, "source_digest", lambda root=None: now)
    monkeypatch.setattr(B, "_engine", SimpleNamespace(SOURCES=now))
    assert B.stale_reason() == "" and T.host_key().endswith(f"-e{now}")
    monkeypatch.setattr(B, "_engine", SimpleNamespace(SOURCES="0123456789abcdef"))
    assert "rebuild with" in B.stale_reason() and T.host_key().endswith("-e0123456789abcdef")
    monkeypatch.setattr(B, "_engine", SimpleNamespace())  # built before the digest existed
    assert "unrecorded" in B.stale_reason() and T.host_key().endswith("-eunrecorded")
    monkeypatch.setattr(B, "_engine", None)  # no engine: nothing stale, its own calibration
    assert B.stale_reason() == "" and T.host_key().endswith("-enone")


FIRST_FETCH = r"""
import json, os, sys, time
probes = []  # every process this one starts that is the calibration's probe source
sys.addaudithook(lambda ev, a: probes.append(str(a[1])) if ev == "subprocess.Popen"
                 and "rlsync.hub.dataplane.probe" in str(a[1]) else None)
import torch
from rlsync.hub import HubClient, Location, start_embedded_hub
from rlsync.hub.dataplane.transports import choose_transport, local_endpoint
hub = start_embedded_hub(journal=os.path.join(sys.argv[1], "journal.db"))
pub, reader = HubClient(hub.address, hub.token), HubClient(hub.address, hub.token)
pub.join(Location(host="h0"), "trainer")
reader.join(Location(host="h0"), "rollout")
w = {"w": torch.randn(1 << 20), "b": torch.arange(7)}
pub.publish("policy", 1, w)
t0 = time.monotonic()
got = reader.fetch("policy", "latest")
took = time.monotonic() - t0
print(json.dumps({"took": took, "probes": probes, "same": all(torch.equal(got.tensors[k], w[k]) for k in w),
                  "used": list(got.transports.values()),
                  "default": choose_transport(local_endpoint("h0:1", os.getpid(), "h0"),
                                              local_endpoint("h0:2", os.getpid(), "h0")).name}))
reader.leave(); pub.leave(); hub.stop()
"""


def test_a_first_fetch_on_a_host_without_a_calibration_measures_nothing(tmp_path):
    """On 158bc49 the first fetch of a process on a host with no cached calibration ran one before
    asking for its plan: a probe process and 256 MiB over every candidate path (~10 s here). Now the
    fetch only reads a calibration: none cached, it takes the documented defaults (the transport
    registry's priority, FALLBACK_STREAMS) at once; `python -m rlsync.hub calibrate` measures.
    A fresh process, so nothing loaded by another test can stand in for the empty cache."""
    import subprocess
    import sys

    cache = tmp_path / "cache"
    env = {**os.environ, "RLSYNC_CACHE_DIR": str(cache), "RLSYNC_LOG": "WARNING"}
    out = subprocess.run([sys.executable, "-c", FIRST_FETCH, str(tmp_path)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["same"] and r["probes"] == [], r["probes"]  # no measurement started, not even in the background
    assert not cache.exists() or not any(cache.rglob("*")), sorted(cache.rglob("*"))  # nothing measured, nothing written
    assert r["used"] == [r["default"]]  # the registry's priority order chose the transport
    assert r["took"] < 5.0, r  # a 4 MiB read: well under the ~10 s a calibration takes here
