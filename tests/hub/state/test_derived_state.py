"""Variants in the hub's state machine (hub/state/derived.py), without sockets: the name grammar, the
single-deriver lease, the derived-from record, and retention that follows the base version."""
import pytest
import torch

from rlsync.hub import errors as E
from rlsync.hub.model.location import Location
from rlsync.hub.model.manifest import ManifestConfig, build_manifest
from rlsync.hub.model.names import DerivedName, base_model, delta_model, derived_model, is_delta_model, root_model
from rlsync.hub.model.shard import Shard
from rlsync.hub.state import DONE, HubConfig, HubState
from rlsync.hub.state.derived import DerivationPending

M = build_manifest({"w": torch.ones(8)}, ManifestConfig())
B = build_manifest({"w": torch.ones(8, dtype=torch.bfloat16)}, ManifestConfig())
B2 = build_manifest({"w": torch.full((8,), 2.0, dtype=torch.bfloat16)}, ManifestConfig())


def state():
    s = HubState(HubConfig())
    return s, {n: s.join(n, Location(host=n), {"tcp": "x"}) for n in ("t", "r1", "r2", "r3")}


def test_name_grammar_one_concept_delta_one_kind():
    assert DerivedName.parse("policy@bf16") == DerivedName("policy", "bf16")
    assert DerivedName.parse("policy@bf16@delta") == DerivedName("policy@bf16", "delta")
    assert DerivedName.parse("policy") is None and DerivedName.parse("me@Example.COM") is None
    assert delta_model("policy") == "policy@delta" and is_delta_model("policy@int8@delta")
    assert base_model("policy@int8@delta") == "policy@int8" and root_model("policy@int8@delta") == "policy"
    with pytest.raises(ValueError):
        derived_model("policy", "Bad Kind")


def test_one_deriver_others_wait_then_fetch_and_the_record():
    s, w = state()
    s.publish(w["t"], "p", 1, Shard(), M)
    assert s.derive(w["r1"], "p", "latest", "bf16", Shard(), {"revision": 1})["mode"] == "derive"
    for r in ("r2", "r3"):
        with pytest.raises(DerivationPending):
            s.derive(w[r], "p", 1, "bf16", Shard(), {"revision": 1})
    assert s.derive(w["r1"], "p", 1, "bf16", Shard(), {"revision": 1})["mode"] == "derive"  # its own lease again
    assert s.publish(w["r1"], "p@bf16", 1, Shard(), B)
    assert s.derive(w["r2"], "p", 1, "bf16", Shard(), {"revision": 1}) == {"mode": "fetch", "model": "p@bf16",
                                                                          "version": 1}
    assert s.derived_from("p@bf16", 1) == {"model": "p", "version": 1, "transform": "bf16", "params": {"revision": 1}}
    assert not s.leases


def test_a_dead_or_abandoning_deriver_hands_the_lease_on():
    s, w = state()
    s.publish(w["t"], "p", 1, Shard(), M)
    s.derive(w["r1"], "p", 1, "bf16", Shard())
    s.expire([w["r1"]])  # died mid-derivation: its lease ends with it
    assert s.derive(w["r2"], "p", 1, "bf16", Shard())["mode"] == "derive"
    assert s.derive_abandon(w["r2"], "p@bf16", 1, Shard()) and not s.derive_abandon(w["r3"], "p@bf16", 1, Shard())
    assert s.derive(w["r3"], "p", 1, "bf16", Shard())["mode"] == "derive"


def test_refusals_change_nothing():
    s, w = state()
    s.publish(w["t"], "p", 1, Shard(), M)
    s.derive(w["r1"], "p", 1, "int8", Shard(), {"revision": 1})
    before = (dict(s.leases), sorted(s.models))
    with pytest.raises(E.InvalidArgumentError, match="one name, one transform"):
        s.derive(w["r2"], "p", 1, "int8", Shard(), {"revision": 2})
    with pytest.raises(E.InvalidArgumentError, match="delta"):
        s.derive(w["r2"], "p", 1, "delta", Shard())
    with pytest.raises(E.VersionNotFoundError):
        s.derive(w["r2"], "p", 9, "bf16", Shard())
    with pytest.raises(E.VersionNotFoundError, match="not committed"):  # a variant of a version not there
        s.publish(w["r2"], "p@bf16", 2, Shard(), B)
    with pytest.raises(E.ShardError):
        s.derive(w["r2"], "p", 1, "bf16", Shard(tp=0, tp_size=2))
    assert (dict(s.leases), sorted(s.models)) == before


def test_rederived_variant_must_be_the_same_bytes():
    s, w = state()
    s.publish(w["t"], "p", 1, Shard(), M)
    s.publish(w["r1"], "p@bf16", 1, Shard(), B)
    with pytest.raises(E.ManifestMismatchError):  # someone derived other bytes under the same name
        s.publish(w["r2"], "p@bf16", 1, Shard(), B2)
    s.publish(w["r3"], "p@bf16", 1, Shard(), B)  # the same bytes again: one more replica


def test_variant_retained_while_its_base_version_is():
    s, w = state()
    s.publish(w["t"], "p", 1, Shard(), M)
    s.publish(w["r1"], "p@bf16", 1, Shard(), B)
    assert s.is_retained("p@bf16", 1)
    s.release(w["t"], "p", 1, Shard())  # the trainer steps (a seed or wait: not what is tested here)
    s.publish(w["t"], "p", 2, Shard(), M)
    assert not s.is_retained("p@bf16", 1)  # base v1 left retention: so does its variant, though it is p@bf16's newest
    assert s.release(w["r1"], "p@bf16", 1, Shard()) == DONE
