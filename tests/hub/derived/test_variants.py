"""Variants through a real hub and real clients (hub/client/derived.py): made once under concurrent readers,
bit-identical on every replica, retained/released like a version, and a delta of a variant."""
import threading

import torch

from rlsync.hub.model.shard import Shard


def _base(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a.proj.weight": torch.randn(64, 96, generator=g), "norm": torch.rand(96, generator=g)}


def _cast(src):
    return {n: t.to(torch.bfloat16) for n, t in src.items()}


def _maker(reader, counter: list):
    """A reader's derivation: fetch the base version, cast it (what rlsync/sync/hub_derived.py does)."""
    def make(version, into):
        counter.append(reader.worker_id)
        base = reader.fetch("policy", version)
        out = _cast(base.tensors)
        if into is None:
            return out
        for n, t in out.items():
            into[n].copy_(t)
        return into
    return make


def test_one_derivation_under_concurrent_readers_same_bytes_everywhere(make_client):
    trainer = make_client("t", name="trainer")
    trainer.publish("policy", 1, _base(1))
    readers = [make_client(f"h{i}", name=f"r{i}") for i in range(4)]
    made, results, errors = [], {}, []
    start = threading.Barrier(len(readers))

    def run(c):
        try:
            start.wait()
            results[c.worker_id] = c.fetch_variant("policy", 1, "bf16", _maker(c, made), params={"revision": 1})
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=run, args=(c,)) for c in readers]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors
    assert len(made) == 1  # one derivation across the pool
    modes = sorted(r.mode for r in results.values())
    assert modes.count("derived") == 1 and len(modes) == 4
    want = _cast(_base(1))
    for r in results.values():
        assert all(torch.equal(r.tensors[n], want[n]) for n in want)
        assert r.manifest.units == results[made[0]].manifest.units  # same unit checksums: same bytes
    fetched = [r for r in results.values() if r.mode != "derived"]
    assert all(r.nbytes == sum(t.numel() * 2 for t in want.values()) for r in fetched if r.mode == "full")
    assert trainer.derived_from("policy@bf16", 1) == {"model": "policy", "version": 1, "transform": "bf16",
                                                      "params": {"revision": 1}}


def test_a_deriver_that_fails_gives_the_lease_back(make_client):
    trainer = make_client("t", name="trainer")
    trainer.publish("policy", 1, _base(2))
    bad, good = make_client("h1"), make_client("h2")

    def boom(version, into):
        raise RuntimeError("out of memory")

    try:
        bad.fetch_variant("policy", 1, "bf16", boom)
    except RuntimeError:
        pass
    else:
        raise AssertionError("the failing derivation did not raise")
    made = []
    assert good.fetch_variant("policy", 1, "bf16", _maker(good, made)).mode == "derived" and made


def test_variant_retention_follows_base_and_delta_of_a_variant(make_client):
    trainer = make_client("t", name="trainer")
    deriver, reader = make_client("h1", name="deriver"), make_client("h2", dc="dc1", name="reader")  # across a slow link
    v1 = _base(3)
    trainer.publish("policy", 1, v1)
    into = {n: torch.empty_like(t, dtype=torch.bfloat16) for n, t in v1.items()}
    deriver.fetch_variant("policy", 1, "bf16", _maker(deriver, []), into=into)
    deriver.publish_delta("policy@bf16", 1, into)  # the deriver keeps the copy its next delta is encoded from
    reader.fetch("policy@bf16", 1)
    assert trainer.versions("policy@bf16")["retained"] == [1]
    # v2: the deriver publishes the variant with its delta from v1, as the trainer's delta route does
    trainer.release("policy", 1)
    v2 = {n: t.clone() for n, t in v1.items()}
    v2["a.proj.weight"][:2] += 0.5  # a sparse step: its delta is small
    trainer.publish("policy", 2, v2)
    b2 = _cast(v2)
    deriver.publish_delta("policy@bf16", 2, b2)
    deriver.publish("policy@bf16", 2, b2)
    got = reader.fetch_delta("policy@bf16", 2, into=reader.fetch("policy@bf16", 1).tensors)
    assert got.mode == "delta" and all(torch.equal(got.tensors[n], b2[n]) for n in b2)
    assert got.nbytes < sum(t.numel() * 2 for t in b2.values())
    v = trainer.versions("policy@bf16")
    assert v["retained"] == [2] and 1 not in v["retained"]  # base v1 left retention: its variant too
    deriver.release("policy@bf16", 1, Shard())  # no longer retained: released at once, like a version
    assert [r for r in deriver.held_ids() if r.model == "policy@bf16" and r.version == 1] == []
