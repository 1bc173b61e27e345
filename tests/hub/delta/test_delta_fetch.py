"""Delta fetch end to end (hub/client/deltas.py): real clients, sockets and data plane on loopback.

Bit-exact against a full fetch of the same version; a reader two versions behind takes a chain; a
delta that does not apply fails typed and leaves the held version intact and served; relays forward
deltas; a delta source killed mid-transfer is re-planned with no torn result."""
import threading

import pytest
import torch

from rlsync.hub import ClientConfig, HubClient, Location, ManifestConfig
from rlsync.hub.delta import codec as D
from rlsync.hub import errors as E
from rlsync.hub.dataplane.config import DataPlaneConfig
from rlsync.hub.delta.plan import DeltaConfig, tensor_name
from rlsync.hub.model.names import delta_model
from rlsync.hub.model.manifest import build_manifest, byte_view
from rlsync.hub.tools.procs import WorkerProcess, close_all
from rlsync.hub.server.loop import start_embedded_hub
from rlsync.hub.model.shard import Shard
from rlsync.hub.state import HubConfig

from test_delta import model, real_like_step  # tests/hub is on sys.path (pytest's rootdir-less import)

pytestmark = pytest.mark.timeout(120)
CFG = ClientConfig(manifest=ManifestConfig(chunk_bytes=4096, pack_below=512, pack_bytes=2048), transport="tcp-py")


@pytest.fixture
def cluster(request):
    mode = getattr(request, "param", "auto")
    hub = start_embedded_hub(config=HubConfig(delta=DeltaConfig(mode=mode)))
    clients = []

    def make(dc="dc0", host="h", rack="r0", cfg=CFG):
        c = HubClient(hub.address, hub.token, config=cfg)
        c.join(Location(dc=dc, rack=rack, host=host), host)
        clients.append(c)
        return c

    yield hub, make
    leaving = [threading.Thread(target=c.leave) for c in clients]  # each waits out its threads: at once
    for t in leaving:
        t.start()
    for t in leaving:
        t.join()
    hub.stop()


def same(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(torch.equal(a[n].view(torch.uint8) if a[n].numel() else a[n],
                                                b[n].view(torch.uint8) if b[n].numel() else b[n]) for n in a)


class Trainer:
    """Publishes v1, v2, ... in place (release, step, publish, publish_delta), like a real trainer."""

    def __init__(self, client: HubClient, update: str = "real_like", deltas: bool = True):
        self.c, self.update, self.deltas = client, update, deltas
        self.live = model(0)
        self.v = 0
        self.snap: dict[int, dict] = {}

    def step(self, delta: bool | None = None):
        if self.v:
            self.c.release("policy", self.v)
            new = real_like_step(self.live, self.v) if self.update == "real_like" else self.random()
            for n, t in self.live.items():
                t.copy_(new[n])
        self.v += 1
        self.c.publish("policy", self.v, self.live)
        if self.deltas if delta is None else delta:
            self.c.publish_delta("policy", self.v, self.live)
        self.snap[self.v] = {n: t.clone() for n, t in self.live.items()}
        return self.v

    def random(self) -> dict:
        """Every byte new (a delta the size of the version: the worst case)."""
        g = torch.Generator().manual_seed(100 + self.v)
        return {n: torch.randint(0, 256, (t.numel() * t.element_size(),), generator=g, dtype=torch.uint8).view(t.dtype)
                .view(t.shape) if t.numel() else t for n, t in self.live.items()}


@pytest.mark.parametrize("cluster,update", [("auto", "real_like"), ("always", "random")], indirect=["cluster"])
def test_delta_fetch_is_bit_exact_against_a_full_fetch(cluster, update):
    hub, make = cluster
    tr = Trainer(make(dc="dc0", host="t"), update)
    a, b = make(dc="dc1", host="a", rack="ra"), make(dc="dc1", host="b", rack="rb")
    tr.step()
    bufa, bufb = a.fetch("policy").tensors, b.fetch("policy").tensors
    for _ in range(2):
        v = tr.step()
        got = a.fetch_delta("policy", into=bufa)
        full = b.fetch("policy", into=bufb)
        assert got.mode == "delta" and got.version == full.version == v
        assert same(bufa, tr.snap[v]) and same(bufa, bufb)
        assert got.nbytes < full.nbytes or update == "random"
        assert not got.manifest.verify(bufa)
    held = {(r.model, r.version) for r in a.held_ids()}
    assert ("policy", v) in held and ("policy", v - 1) not in held  # v replaced v-1 in the same buffers


@pytest.mark.parametrize("cluster", ["always"], indirect=True)  # auto: decoding twice costs more than this tiny model
def test_reader_missing_two_versions_takes_the_chain(cluster):
    hub, make = cluster
    tr = Trainer(make(dc="dc0", host="t"))
    r = make(dc="dc1", host="r")
    tr.step()
    buf = r.fetch("policy").tensors
    tr.step()
    v = tr.step()
    got = r.fetch_delta("policy", into=buf)
    assert got.mode == "delta" and got.version == v and same(buf, tr.snap[v])
    choice = r.session.call("delta_choose", wid=r.worker_id, model="policy", version="latest", shard=[0, 0, 1, 1], base=1,
                     explain=True)
    assert choice["chain"] == [2, 3]
    assert got.nbytes == choice["delta_bytes"]


def test_a_broken_chain_fetches_in_full(cluster):
    hub, make = cluster
    tr = Trainer(make(dc="dc0", host="t"))
    r = make(dc="dc1", host="r")
    tr.step()
    buf = r.fetch("policy").tensors
    tr.step(delta=False)      # v2 has no delta object ...
    tr.c.deltas.snap.clear()  # ... and the publisher lost its copy, so v3's delta starts a new chain
    v = tr.step()
    got = r.fetch_delta("policy", into=buf)
    assert got.mode == "full" and got.version == v and same(buf, tr.snap[v])


@pytest.mark.parametrize("cluster", ["always"], indirect=True)
def test_relays_forward_deltas_inside_the_dc(cluster):
    hub, make = cluster
    tr = Trainer(make(dc="dc0", host="t"))
    a, b = make(dc="dc1", host="a"), make(dc="dc1", host="b")
    tr.step()
    bufa, bufb = a.fetch("policy").tensors, b.fetch("policy").tensors
    v = tr.step()
    first = a.fetch_delta("policy", into=bufa)
    assert first.mode == "delta" and set(first.bytes_by_source) == {tr.c.worker_id}
    got = b.fetch_delta("policy", into=bufb)
    assert got.mode == "delta" and same(bufb, tr.snap[v])
    assert set(got.bytes_by_source) == {a.worker_id}    # the delta crossed into dc1 once, then from a


@pytest.mark.parametrize("cluster", ["always"], indirect=True)
def test_a_delta_that_does_not_apply_fails_typed_and_keeps_the_held_version(cluster):
    hub, make = cluster
    t = make(dc="dc0", host="t")
    r, other = make(dc="dc1", host="r"), make(dc="dc1", host="o")
    v1 = model(0)
    t.publish("policy", 1, v1)
    buf = r.fetch("policy").tensors
    v2 = real_like_step(v1, 1)
    t.release("policy", 1)   # r holds v1 now; t's buffers become v2
    for n, x in v1.items():
        x.copy_(v2[n])
    t.publish("policy", 2, v1)
    # Fault: a delta object encoded against other bytes than v1 (a publisher bug).
    wrong = model(7)
    m_wrong = hub.server.state.models["policy"].versions[1].manifests["tp0-pp0"]
    m2 = t.store.get(f"{t.worker_id}:policy:2:tp0-pp0:live").manifest
    frames = D.encode(m_wrong, [byte_view(wrong[s.name]) for s in m_wrong.tensors], m2,
                      [byte_view(v1[s.name]) for s in m2.tensors])
    t.publish(delta_model("policy"), 2, {tensor_name(1, i): torch.frombuffer(bytearray(f), dtype=torch.uint8)
                                         for i, f in enumerate(frames)})
    before = {n: x.clone() for n, x in buf.items()}
    with pytest.raises(E.DeltaError):
        r.fetch_delta("policy", into=buf)
    assert same(buf, before)                                   # nothing torn
    assert ("policy", 1) in {(x.model, x.version) for x in r.held_ids()}
    t.release("policy", 2)                                     # ... and v1 is still served from r
    assert same(other.fetch("policy", 1).tensors, before)
    got = r.fetch_delta("policy", 2, into=buf, fallback=True)  # fallback: v2 in full, exact
    assert got.mode == "full" and not got.manifest.verify(buf)


@pytest.mark.parametrize("cluster", ["always"], indirect=True)
def test_one_round_trip_plans_the_delta_and_a_delta_aimed_elsewhere_is_refused(cluster):
    """The choice carries the first delta's plan and only v's manifest digest (the reader rebuilds v's
    manifest from its layout and the frames' target checksums); frames aimed at other bytes than the
    version the hub chose fail typed, nothing torn."""
    hub, make = cluster
    tr = Trainer(make(dc="dc0", host="t"))
    r = make(dc="dc1", host="r")
    tr.step()
    buf = r.fetch("policy").tensors
    v = tr.step()
    ops = []
    r.observe_rpc(lambda op, args, out: ops.append(op))
    got = r.fetch_delta("policy", into=buf)
    assert got.mode == "delta" and same(buf, tr.snap[v]) and got.manifest == tr.c.store.get(
        f"{tr.c.worker_id}:policy:{v}:tp0-pp0:live").manifest
    assert ops[0] == "delta_choose" and "fetch" not in ops   # the delta's plan came with the choice
    # Fault: a publisher bug — v3's delta object decodes to other bytes than the published v3.
    tr.c.release("policy", v)
    new = real_like_step(tr.live, v)
    for n, x in tr.live.items():
        x.copy_(new[n])
    tr.c.publish("policy", v + 1, tr.live)
    m_pub = tr.c.store.get(f"{tr.c.worker_id}:policy:{v + 1}:tp0-pp0:live").manifest
    other = {n: x.clone() for n, x in tr.live.items()}
    next(iter(other.values())).view(torch.uint8)[0] ^= 1
    m_other = build_manifest(other, CFG.manifest)
    assert m_other.layout_key() == m_pub.layout_key() and m_other != m_pub
    frames = D.encode(got.manifest, [byte_view(tr.snap[v][s.name]) for s in got.manifest.tensors], m_other,
                      [byte_view(other[s.name]) for s in m_other.tensors])
    tr.c.publish(delta_model("policy"), v + 1, {tensor_name(v, i): torch.frombuffer(bytearray(f), dtype=torch.uint8)
                                               for i, f in enumerate(frames)})
    before = {n: x.clone() for n, x in buf.items()}
    with pytest.raises(E.DeltaError, match="digest"):
        r.fetch_delta("policy", into=buf)
    assert same(buf, before) and ("policy", v) in {(x.model, x.version) for x in r.held_ids()}


@pytest.mark.parametrize("cluster", ["always"], indirect=True)
def test_a_delta_published_before_its_version_is_there_when_the_version_commits(cluster):
    """The order rlsync.workers use: publish_delta, then publish; a reader seeing v takes its delta."""
    hub, make = cluster
    t, r = make(dc="dc0", host="t"), make(dc="dc1", host="r")
    live = model(0)
    assert t.publish_delta("policy", 1, live)["base"] is None   # the first call only takes the copy
    t.publish("policy", 1, live)
    buf = r.fetch("policy").tensors
    t.release("policy", 1)
    new = real_like_step(live, 1)
    for n, x in live.items():
        x.copy_(new[n])
    assert t.publish_delta("policy", 2, live)["base"] == 1
    t.publish("policy", 2, live)
    got = r.fetch_delta("policy", into=buf)
    assert got.mode == "delta" and got.version == 2 and same(buf, new)


@pytest.mark.parametrize("cluster", ["always"], indirect=True)
def test_a_rejoiner_adopts_its_old_copy_and_catches_up_by_delta(cluster):
    """A worker that left keeps its buffers; as a new client it adopts them (checked by the hub against
    v1's manifest) and takes the delta; bytes that are not v1's are refused, nothing registered."""
    hub, make = cluster
    tr = Trainer(make(dc="dc0", host="t"))
    r = make(dc="dc1", host="r")
    tr.step()
    buf = r.fetch("policy").tensors
    r.leave()
    v = tr.step()
    r2 = make(dc="dc1", host="r")
    wrong = {n: x.clone() for n, x in buf.items()}
    wrong["w"].view(torch.uint8)[0] ^= 1
    with pytest.raises(E.ManifestMismatchError):
        r2.adopt("policy", 1, wrong)
    assert r2.held_ids() == []
    r2.adopt("policy", 1, buf)
    assert [(x.model, x.version) for x in r2.held_ids()] == [("policy", 1)]
    got = r2.fetch_delta("policy", into=buf)
    assert got.mode == "delta" and got.version == v and same(buf, tr.snap[v])


def test_a_delta_source_killed_mid_transfer_is_replanned(wait_until):
    cfg = ClientConfig(manifest=ManifestConfig(chunk_bytes=64 << 10), transport="tcp-py")
    hub = start_embedded_hub(config=HubConfig(delta=DeltaConfig(mode="always")))
    procs = []
    try:
        t = HubClient(hub.address, hub.token, config=cfg)
        t.join(Location(dc="dc0", host="t"), "trainer")
        r = HubClient(hub.address, hub.token, config=cfg)
        r.join(Location(dc="dc1", rack="r1", host="r"), "reader")
        slow = ClientConfig(manifest=cfg.manifest, transport="tcp-py", dataplane=DataPlaneConfig(serve_delay_s=0.05))
        a = WorkerProcess(hub.address, hub.token, slow, name="a")
        procs.append(a)
        a.call("join", location={"dc": "dc1", "rack": "r1", "host": "a"})
        tr = Trainer(t, update="random")
        tr.live = {n: torch.randn(256 << 10 >> 2) for n in ("w0", "w1")}  # 2 x 256 KiB: 8 delta units
        tr.step()
        buf = r.fetch("policy").tensors
        v = tr.step()
        a.call("fetch", model=delta_model("policy"), version=v)        # a holds the delta (same rack as r)
        out: dict = {}
        th = threading.Thread(target=lambda: out.update(r=_try(lambda: r.fetch_delta("policy", into=buf))))
        th.start()
        wait_until(lambda: any(x["readers"] for x in a.call("served").values()), what="r reading from a")
        a.kill()
        th.join(60)
        got = out["r"]
        assert not isinstance(got, BaseException), got
        assert got.mode == "delta" and same(buf, tr.snap[v])
        assert got.bytes_by_source.get(t.worker_id, 0) > 0      # the rest came from the trainer
        r.leave()
        t.leave()
    finally:
        close_all(procs)
        hub.stop()


def _try(fn):
    try:
        return fn()
    except BaseException as e:  # noqa: BLE001 - checked by the test
        return e


@pytest.mark.parametrize("cluster", ["always"], indirect=True)  # auto: the seed's full v3, same DC, is cheaper
def test_a_following_seed_worker_holds_the_chain_for_a_late_reader(cluster, wait_until):
    hub, make = cluster
    tr = Trainer(make(dc="dc0", host="t"))
    seed = HubClient(hub.address, hub.token, config=CFG)
    seed.join(Location(dc="dc1", host="s"), "seed", role="seed", follow=True)
    late = make(dc="dc1", host="late")
    try:
        tr.step()
        buf = late.fetch("policy").tensors           # the late reader holds v1, then misses v2 and v3
        for _ in range(2):
            v = tr.step()
            wait_until(lambda: ("policy@delta", v) in {(x.model, x.version) for x in seed.held_ids()},
                       what=f"the seed worker following delta v{v}")
        tr.c.deltas._drop_old_deltas("policy", Shard(), tr.c.deltas._old_deltas("policy", Shard(), v + 1, keep=1))  # the publisher lets its deltas go
        assert not [x for x in tr.c.held_ids() if x.model == "policy@delta"]
        got = late.fetch_delta("policy", into=buf)
        assert got.mode == "delta" and got.version == v and same(buf, tr.snap[v])
        assert set(got.bytes_by_source) == {seed.worker_id}  # the chain v2, v3 came from the seed
    finally:
        seed.leave()


@pytest.mark.parametrize("cluster", ["always"], indirect=True)
def test_applied_is_one_round_trip_and_checked_before_it_changes_anything(cluster):
    """After a delta fetch the reader's last word is one `applied` call: v registered by its manifest's
    digest, the delta fetch closed (its relay a full replica), the old delta object released. A wrong
    digest or an uncommitted version is refused typed with nothing changed; an unknown fetch id is
    answered back, not an error."""
    hub, make = cluster
    tr = Trainer(make(dc="dc0", host="t"))
    r = make(dc="dc1", host="r")
    tr.step()
    buf = r.fetch("policy").tensors
    calls = []
    r.observe_rpc(lambda op, args, out: calls.append(op))
    for _ in range(3):
        v = tr.step()
        got = r.fetch_delta("policy", into=buf)
        assert got.mode == "delta" and got.version == v and same(buf, tr.snap[v])
    assert "fetch_done" not in calls and "register" not in calls  # both inside `applied`
    assert calls.count("delta_choose") == 3 and calls.count("applied") == 3
    state = hub.server.state
    wid = r.worker_id
    held = {(x.model, x.version, x.full) for x in state.replicas.values() if x.worker == wid}
    assert (delta_model("policy"), v, True) in held and ("policy", v, True) in held  # relay closed: full
    assert not any(m == delta_model("policy") and ver < v - 1 for m, ver, _ in held)  # old deltas released
    before = (sorted(state.replicas), sorted(state.fetches))
    with pytest.raises(E.ManifestMismatchError):
        r.session.call("applied", wid=wid, model="policy", version=v, shard=Shard().to_wire(), manifest_digest="0" * 32,
                  done=["f-none"], release_deltas=[v])
    with pytest.raises(E.VersionNotFoundError):
        r.session.call("applied", wid=wid, model="policy", version=v + 5, shard=Shard().to_wire(),
                  manifest_digest="0" * 32, done=[], release_deltas=[])
    assert (sorted(state.replicas), sorted(state.fetches)) == before
    digest = hub.server._manifest_bytes.entry(state.models["policy"].versions[v].manifests[Shard().key])[1]
    assert r.session.call("applied", wid=wid, model="policy", version=v, shard=Shard().to_wire(), manifest_digest=digest,
                     done=["f-none"], release_deltas=[]) == [["f-none"], []]
