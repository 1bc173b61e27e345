"""Issue 30: after every operation, good or refused, the client's replica book equals the hub's.

Seeded random sequences of publish / publish_delta / release / fetch / fetch_delta / adopt / reshard
reads, with refusals mixed in (versions that do not exist or are not next, aliasing and mis-shaped
buffers, wrong bytes to adopt, bad `keep`, layouts that do not tile), over one embedded hub and real
clients. Checked after each operation: every error is a `HubError`; every successful read holds exactly
the bytes of the version it names; each client's live replicas are the hub's live replicas of that
worker, and the hub lists no seed copy the client lacks (seed drops reach the client with its next
heartbeat). The hub has a second tenant whose credential covers other models only: its attempts on
this run's models and workers are refused (`TenantAccessError`) and change nothing (docs/tenants.md)."""
import random
import time

import pytest
import torch

from rlsync.hub import ClientConfig, HubClient, Location, ManifestConfig
from rlsync.hub import errors as E
from rlsync.hub.reshard.layout import Dest, Slice, zero3_layout
from rlsync.hub.reshard.read import ReshardReader, publish_shard
from rlsync.hub.model.shard import Shard
from rlsync.hub.server.loop import start_embedded_hub
from rlsync.hub.state import HubConfig, TenantConfig

pytestmark = pytest.mark.timeout(300)
OPS_PER_SEED = 1100  # x 2 seeds in CI: >= 2,000 mixed operations
CFG = ClientConfig(manifest=ManifestConfig(chunk_bytes=2048, pack_below=256, pack_bytes=1024), transport="tcp-py")
SHAPES = {"w": (48, 16), "b": (16,), "n": (3,)}


def books(hub, c) -> tuple[set, set, set, set]:
    for _ in range(50):
        try:
            rows = [(rid, r.slot) for rid, r in list(hub.server.state.replicas.items())
                    if r.worker == c.worker_id and r.full]
            break
        except RuntimeError:  # the hub thread changed the table while we copied it
            continue
    mine = [(rid, c.replicas.held[rid][3]) for rid in list(c.replicas.held)
            if (rep := c.store.get(rid)) is not None and rep.complete]
    return ({r for r, s in mine if s == "live"}, {r for r, s in rows if s == "live"},
            {r for r, s in mine if s == "seed"}, {r for r, s in rows if s == "seed"})


def check_books(hub, clients, what: str) -> None:
    for c in clients:
        live_c, live_h, seed_c, seed_h = books(hub, c)
        assert set(c.held()) >= live_c | seed_c
        assert live_c == live_h, f"after {what}: {c.worker_id} live: client {sorted(live_c)} hub {sorted(live_h)}"
        assert seed_h <= seed_c, f"after {what}: hub lists seeds {sorted(seed_h - seed_c)} the client lacks"


def same(a: dict, b: dict) -> bool:
    return set(a) >= set(b) and all(torch.equal(a[n], b[n]) for n in b)


@pytest.mark.parametrize("seed", [11, 29])
def test_client_and_hub_books_agree_after_random_operations_and_refusals(seed):
    rng = random.Random(seed)
    hub = start_embedded_hub(config=HubConfig(tenants=[TenantConfig(name="other", token="other-token",
                                                                    publish=["other/*"])]))
    clients: list[HubClient] = []

    def client(host):
        c = HubClient(hub.address, hub.token, config=CFG)
        c.join(Location(host=host, rack="r" + host), host)
        clients.append(c)
        return c

    t = client("t")
    readers = [client(f"r{i}") for i in range(3)]
    intruder = HubClient(hub.address, "other-token", config=CFG)  # another tenant on the same hub
    intruder.join(Location(host="x", rack="rx"), "x")
    clients.append(intruder)
    slots = {r.worker_id: [{n: torch.zeros(s) for n, s in SHAPES.items()} for _ in range(2)] for r in readers}
    snap: dict[int, dict] = {}
    live = {n: torch.randn(s, generator=torch.Generator().manual_seed(seed)) for n, s in SHAPES.items()}
    latest, counts = 0, {}
    # a sharded model ("zm" v1, two ZeRO-3 ranks published by t) for resharding reads
    zm = {n: torch.randn(s, generator=torch.Generator().manual_seed(seed + 1)) for n, s in SHAPES.items()}
    layout = zero3_layout({n: (tuple(x.shape), "float32") for n, x in zm.items()}, 2)
    for rank in range(2):
        part = {}
        for n, x in zm.items():
            flat, ps = x.reshape(-1), -(-x.numel() // 2)
            part[n] = torch.zeros(ps)
            part[n][:flat[rank * ps:(rank + 1) * ps].numel()] = flat[rank * ps:(rank + 1) * ps]
        publish_shard(t, "zm", 1, layout, rank, part)
    t_end = time.monotonic() + 240

    def publish() -> str:
        nonlocal latest, live
        nxt = {n: x.clone() for n, x in live.items()}
        nxt["w"].view(-1)[rng.randrange(nxt["w"].numel())] += 1.0  # a small step: deltas stay small
        v = latest + 1
        if rng.random() < 0.6:
            t.publish_delta("m", v, nxt, keep=rng.choice([1, 2, 4]))
        t.publish("m", v, nxt)
        snap[v], live, latest = {n: x.clone() for n, x in nxt.items()}, nxt, v
        return "publish"

    def bad_publish() -> str:
        v = rng.choice([latest, max(0, latest - 1)]) if latest else 0
        if latest and rng.random() < 0.5:
            t.publish("m", v, live)  # not after latest: VersionError
        else:
            t.publish("m", latest + 1, {"w": "not a tensor"})
        return "bad publish"

    def release(c) -> str:
        ids = c.held_ids()
        if ids and rng.random() < 0.8:
            x = rng.choice(ids)
            if x.slot == "live":
                c.release(x.model, x.version)
                return "release"
        c.release("m", rng.randrange(0, latest + 3))
        return "release (maybe not held)"

    def fetch(r) -> str:
        v = "latest" if rng.random() < 0.5 else rng.randrange(0, latest + 3)
        into = rng.choice(slots[r.worker_id] + [None])
        got = r.fetch("m", v, into=into)
        assert same(got.tensors, snap[got.version]), f"fetch of v{got.version} returned other bytes"
        return f"fetch {v}"

    def fetch_delta(r) -> str:
        into = rng.choice(slots[r.worker_id])
        got = r.fetch_delta("m", "latest", into=into, keep=rng.choice([1, 2, 0, -1]), fallback=rng.random() < 0.5)
        assert same(into if got.mode != "held" or got.tensors is into else got.tensors, snap[got.version])
        return f"fetch_delta ({got.mode})"

    def bad_into(r) -> str:
        if rng.random() < 0.5:
            store = torch.zeros(48 * 16 + 8)
            r.fetch("m", "latest", into={"w": store[:768].view(48, 16), "b": store[760:776], "n": torch.zeros(3)})
        else:
            r.fetch("m", "latest", into={"w": torch.zeros(16, 48), "b": torch.zeros(16), "n": torch.zeros(3)})
        return "bad into"

    def adopt(r) -> str:
        v = rng.randrange(max(1, latest - 3), latest + 2)
        if rng.random() < 0.5 and v in snap:  # buffers a worker kept across a re-join: v's bytes, or not
            into = {n: x.clone() for n, x in snap[v].items()}
            if rng.random() < 0.3:
                into["w"].view(-1)[0] += 1.0
        else:
            into = rng.choice(slots[r.worker_id])
        r.adopt("m", v, into)
        return f"adopt {v}"

    def reshard(r) -> str:
        k = rng.randrange(2)
        dests = rng.choice([[Dest.of(Slice("w", 0, k, 2)), Dest.of(Slice("b"))],        # a TP rank's block
                            [Dest.of(Slice("w", 1, k, 2))],                               # a column block
                            [Dest.of(Slice("w", 0, 5, 2))], [Dest.of(Slice("nope"))],     # refused, typed
                            [Dest.of(Slice("w")), Dest.of(Slice("b"), name="w")]])        # two named "w"
        got = ReshardReader(r, "zm", layout).read(1, dests)
        want = {"w": zm["w"].chunk(2, dests[0].slices[0].dim or 0)[k] if dests[0].slices[0].dim is not None
                else zm["w"], "b": zm["b"]}
        assert all(torch.equal(got.tensors[d.name], want[d.name]) for d in dests), "a resharded read is wrong"
        return "reshard read"

    def release_t(r) -> str:
        return release(t)

    def cross_tenant(r) -> str:
        """Another tenant's credential on this run's models and workers: refused, typed, and the same
        refusal whether the version (or the model) exists or not."""
        model = rng.choice(["m", "zm", "m@delta", "never-published"])
        tries = [lambda: intruder.fetch(model, rng.choice(["latest", latest, latest + 5])),
                 lambda: intruder.latest(model), lambda: intruder.versions(model),
                 lambda: intruder.publish(model, latest + 1, live),
                 lambda: intruder.session.call("heartbeat", wid=r.worker_id),
                 lambda: intruder.session.call("release", wid=r.worker_id, model="other/m", version=1,
                                               shard=Shard().to_wire())]
        with pytest.raises(E.TenantAccessError):
            rng.choice(tries)()
        assert intruder.models() == {} and intruder.held() == []
        raise E.TenantAccessError("refused, as it must be")  # counted as a refusal below

    ops = [(lambda r: publish(), 4), (lambda r: bad_publish(), 1), (release_t, 2), (fetch, 6), (fetch_delta, 3),
           (bad_into, 1), (adopt, 2), (release, 3), (reshard, 1), (cross_tenant, 1)]
    names = ["publish", "bad_publish", "release_t", "fetch", "fetch_delta", "bad_into", "adopt", "release", "reshard",
             "cross_tenant"]
    weights = [w for _, w in ops]
    publish()
    for i in range(OPS_PER_SEED):
        assert time.monotonic() < t_end, f"only {i} operations within the time bound"
        k = rng.choices(range(len(ops)), weights)[0]
        try:
            what = ops[k][0](rng.choice(readers))
            key = f"{names[k]} ok"
        except E.HubError as e:
            what = key = f"{names[k]} refused"
        counts[key] = counts.get(key, 0) + 1
        check_books(hub, clients, what)
    for c in clients:
        c.leave()
    hub.stop()
    assert sum(counts.values()) == OPS_PER_SEED
    for name in names:  # every operation ran, and every kind that can be refused was refused
        assert counts.get(f"{name} ok", 0) + counts.get(f"{name} refused", 0) > 10, (name, counts)
    assert not counts.get("cross_tenant ok"), counts
    for name in ("bad_publish", "bad_into", "adopt", "release", "reshard", "fetch", "fetch_delta", "cross_tenant"):
        assert counts.get(f"{name} refused", 0) > 0, (name, counts)
    for name in ("publish", "adopt", "release", "reshard", "fetch", "fetch_delta"):
        assert counts.get(f"{name} ok", 0) > 0, (name, counts)
