"""Delta encoding (hub/delta/codec.py) and the hub's full-or-delta choice (hub/delta/plan.py, state_deltas.py).
Pure logic, milliseconds."""
import pytest
import torch

from rlsync.hub import errors as E
from rlsync.hub.delta import codec as D
from rlsync.hub.delta.plan import DeltaConfig, choose, delta_base, tensor_name
from rlsync.hub.model.names import delta_model
from rlsync.hub.model.location import Location
from rlsync.hub.model.manifest import ManifestConfig, build_manifest, byte_view
from rlsync.hub.model.shard import Shard
from rlsync.hub.state import HubConfig, HubState

SMALL = ManifestConfig(chunk_bytes=4096, pack_below=512, pack_bytes=2048)


def model(seed: int) -> dict[str, torch.Tensor]:
    """bf16 and fp32 tensors: two chunked (several units each), tiny ones packed together, an empty one."""
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(5000, generator=g).to(torch.bfloat16), "v": torch.randn(3000, generator=g),
            "b1": torch.randn(7, generator=g), "b2": torch.randn(3, generator=g).to(torch.bfloat16),
            "e": torch.empty(0), "n": torch.randint(0, 100, (33,), generator=g)}


def real_like_step(m: dict[str, torch.Tensor], seed: int, frac: float = 0.05) -> dict[str, torch.Tensor]:
    """An optimizer-like step: a few percent of the elements move by a small relative amount."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for n, t in m.items():
        t = t.clone()
        if t.is_floating_point() and t.numel():
            mask = torch.rand(t.shape, generator=g) < frac
            t[mask] = (t[mask].float() * (1 + 0.02 * torch.randn(int(mask.sum()), generator=g))).to(t.dtype)
        out[n] = t
    return out


def views(m, man):
    return [byte_view(m[s.name]) for s in man.tensors]


def roundtrip(a, b, cfg=SMALL):
    ma, mb = build_manifest(a, cfg), build_manifest(b, cfg)
    frames = D.encode(ma, views(a, ma), mb, views(b, mb))
    out = {n: torch.empty_like(t) for n, t in b.items()}
    D.decode(mb, views(a, ma), frames, views(out, mb))
    return frames, out, mb


@pytest.mark.parametrize("update", ["random", "real_like", "same"])
def test_roundtrip_is_bit_exact(update):
    a = model(1)
    b = {"random": model(2), "real_like": real_like_step(a, 3), "same": a}[update]
    frames, out, mb = roundtrip(a, b)
    assert len(mb.units) > 4 and any(len(u.segments) > 1 for u in mb.units)  # chunked and packed units
    assert all(torch.equal(out[n].view(torch.uint8) if out[n].numel() else out[n],
                           b[n].view(torch.uint8) if b[n].numel() else b[n]) for n in b)
    size = sum(len(f) for f in frames)
    if update == "real_like":
        assert size < 0.5 * mb.nbytes   # a sparse update encodes small
    if update == "same":
        assert size < 0.1 * mb.nbytes


def test_tiny_units_and_one_byte_tensor():
    a = {"x": torch.tensor([3], dtype=torch.uint8), "y": torch.tensor([1.5], dtype=torch.bfloat16)}
    b = {"x": torch.tensor([4], dtype=torch.uint8), "y": torch.tensor([1.5], dtype=torch.bfloat16)}
    _, out, _ = roundtrip(a, b, ManifestConfig())
    assert out["x"].item() == 4 and out["y"].item() == 1.5


def test_decode_never_writes_the_base_and_refuses_wrong_inputs():
    a, b = model(1), real_like_step(model(1), 4)
    ma, mb = build_manifest(a, SMALL), build_manifest(b, SMALL)
    frames = D.encode(ma, views(a, ma), mb, views(b, mb))
    before = {n: t.clone() for n, t in a.items()}
    out = {n: torch.empty_like(t) for n, t in b.items()}
    other = model(9)
    with pytest.raises(E.DeltaError, match="base checksum"):   # made against other bytes than held
        D.decode(mb, views(other, ma), frames, views(out, mb))
    bad = list(frames)
    bad[0] = bad[0][:-3] + bytes(3)                           # corrupt payload
    with pytest.raises(E.DeltaError):
        D.decode(mb, views(a, ma), bad, views(out, mb))
    with pytest.raises(E.DeltaError, match="target checksum"):  # a delta to another version
        D.decode(mb, views(a, ma), frames, views(out, mb), expect=[1] * len(frames))
    with pytest.raises(E.DeltaError, match="units"):
        D.decode(mb, views(a, ma), frames[:-1], views(out, mb))
    with pytest.raises(E.DeltaError, match="not an rlsync delta"):
        D.frame_info(b"XXXX" + bytes(40))
    assert all(torch.equal(before[n], a[n]) for n in a)


def test_a_frame_whose_payload_lies_fails_the_result_checksum():
    a = bytes(64)
    b = bytes(range(64))
    frame = D.encode_unit(a, b, base_checksum=D.checksum(a), target_checksum=D.checksum(b), codec="xor-raw")
    lie = frame[:-1] + bytes([frame[-1] ^ 1])       # header intact, one payload bit flipped
    with pytest.raises(E.DeltaError, match="target's checksum"):
        D.decode_unit(a, lie, bytearray(64), expect_checksum=D.checksum(b))


def test_layout_change_has_no_delta():
    a, b = model(1), model(1)
    b["w"] = torch.randn(5001).to(torch.bfloat16)
    with pytest.raises(E.DeltaError, match="layout"):
        roundtrip(a, b)


def test_choose_by_bytes_and_link_speed():
    cfg = DeltaConfig(tier_gbps=(80, 25, 10, 1), decode_gbytes_s=1.0)
    # across a slow DC link a 5% delta wins; from the same host the full copy is cheaper than decoding
    assert choose(cfg, full_bytes=10**9, full_tier=3, chain=[(5 * 10**7, 3)], model_bytes=10**9)[0] == "delta"
    assert choose(cfg, full_bytes=10**9, full_tier=0, chain=[(5 * 10**7, 3)], model_bytes=10**9)[0] == "full"
    assert choose(cfg, full_bytes=10**9, full_tier=3, chain=[], model_bytes=10**9)[0] == "full"
    long = [(10**6, 3)] * (cfg.max_chain + 1)
    assert choose(cfg, full_bytes=10**9, full_tier=3, chain=long, model_bytes=10**9)[0] == "full"


def delta_manifest(base: int, frames: list[bytes]):
    return build_manifest({tensor_name(base, i): torch.frombuffer(bytearray(f), dtype=torch.uint8)
                           for i, f in enumerate(frames)}, ManifestConfig())


def test_hub_chooses_delta_chain_across_dcs_and_full_when_broken():
    st = HubState(HubConfig(delta=DeltaConfig(decode_gbytes_s=100.0)))  # decoding ~free: bytes and links decide
    t = st.join("trainer", Location(dc="dc0", host="t"), {})
    r = st.join("reader", Location(dc="dc1", host="r"), {})
    ms = [model(0)]
    for v in (1, 2, 3):
        ms.append(real_like_step(ms[-1], v))
    mans = [build_manifest(m, SMALL) for m in ms]
    for v in (1, 2, 3):
        st.publish(t, "policy", v, Shard(), mans[v])
        if v > 1:
            fr = D.encode(mans[v - 1], views(ms[v - 1], mans[v - 1]), mans[v], views(ms[v], mans[v]))
            st.publish(t, delta_model("policy"), v, Shard(), delta_manifest(v - 1, fr))
    got = st.choose_update(r, "policy", "latest", Shard(), base=1)
    assert got["mode"] == "delta" and got["chain"] == [2, 3] and got["version"] == 3
    assert 0 < got["delta_bytes"] < got["full_bytes"]
    assert st.choose_update(r, "policy", 3, Shard(), base=3)["mode"] == "held"
    assert st.choose_update(r, "policy", "latest", Shard(), base=0)["mode"] == "full"  # no delta from v0
    with pytest.raises(E.BufferMismatchError):
        st.choose_update(r, "policy", "latest", Shard(), base=2, into_spec=[["w", "float32", [1]]])
    with pytest.raises(E.VersionNotFoundError):
        st.choose_update(r, "policy", 9, Shard(), base=2)


def test_a_delta_object_must_name_its_base():
    st = HubState(HubConfig())
    t = st.join("trainer", Location(host="t"), {})
    with pytest.raises(E.ManifestMismatchError, match="delta object"):
        st.publish(t, delta_model("policy"), 1, Shard(), build_manifest({"w": torch.zeros(4)}, ManifestConfig()))
    assert delta_model("policy") not in st.models
    assert delta_base(delta_manifest(4, [b"x" * 40])) == 4


@pytest.mark.parametrize("native", [True, False])
def test_a_chain_decodes_unit_by_unit_bit_exact_and_a_broken_link_is_refused(native, monkeypatch):
    """v1 -> v3 through two deltas in one buffer (native one-pass and numpy paths); a chain whose second
    delta is not made against the first's target fails typed."""
    if native and D._native is None:
        pytest.skip("rlsync._engine without unshuffle_xor (rebuild: pip install -e . --no-deps)")
    if not native:
        monkeypatch.setattr(D, "_native", None)
    v = [model(1)]
    for s in (2, 3):
        v.append(real_like_step(v[-1], s))
    ms = [build_manifest(x, SMALL) for x in v]
    d12 = D.encode(ms[0], views(v[0], ms[0]), ms[1], views(v[1], ms[1]))
    d23 = D.encode(ms[1], views(v[1], ms[1]), ms[2], views(v[2], ms[2]))
    out = {n: torch.empty_like(t) for n, t in v[2].items()}
    D.decode_chain(ms[2], views(v[0], ms[0]), [d12, d23], views(out, ms[2]))
    assert not ms[2].verify(out)
    with pytest.raises(E.DeltaError, match="previous one's target"):
        D.decode_chain(ms[2], views(v[0], ms[0]), [d23, d23], views(out, ms[2]))
