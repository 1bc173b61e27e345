import pytest
import torch

from rlsync.hub.errors import BufferMismatchError, ManifestMismatchError
from rlsync.hub.model.manifest import Manifest, ManifestConfig, build_manifest


def test_large_tensors_are_chunked_and_tiny_ones_packed():
    cfg = ManifestConfig(chunk_bytes=1000, pack_below=100, pack_bytes=200)
    t = {"big": torch.zeros(600), "a": torch.zeros(10), "b": torch.zeros(10), "c": torch.zeros(20),
         "empty": torch.zeros(0, 3)}
    m = build_manifest(t, cfg)
    big = [u for u in m.units if u.segments[0][0] == 0]
    assert [u.nbytes for u in big] == [1000, 1000, 400]
    packed = [u for u in m.units if u.segments[0][0] != 0]
    # a (40 B) + b (40 B) fit in 200; c (80 B) too: one unit for the three tiny tensors
    assert len(packed) == 1 and [g[0] for g in packed[0].segments] == [1, 2, 3]
    assert m.nbytes == 2400 + 160
    m.validate()


def test_checksums_change_with_bytes_and_wire_round_trips():
    t = {"w": torch.arange(1000, dtype=torch.float32)}
    m1 = build_manifest(t, ManifestConfig())
    t["w"][5] = -1
    m2 = build_manifest(t, ManifestConfig())
    assert m1.units[0].checksum != m2.units[0].checksum
    assert Manifest.from_wire(m1.to_wire()) == m1


def test_malformed_manifest_is_refused():
    m = build_manifest({"w": torch.zeros(10)}, ManifestConfig()).to_wire()
    m["u"][0][2][0][2] = 3  # segment shorter than the tensor
    with pytest.raises(ManifestMismatchError):
        Manifest.from_wire(m)
    with pytest.raises(ManifestMismatchError):
        Manifest.from_wire({"t": "nope"})


def test_non_contiguous_and_non_tensor_inputs_are_refused():
    with pytest.raises(BufferMismatchError, match="contiguous"):
        build_manifest({"w": torch.zeros(4, 4).t()}, ManifestConfig())
    with pytest.raises(BufferMismatchError):
        build_manifest({"w": [1, 2]}, ManifestConfig())


def test_bf16_and_int_dtypes():
    t = {"a": torch.randn(33).to(torch.bfloat16), "b": torch.arange(7)}
    m = build_manifest(t, ManifestConfig())
    assert [s.dtype for s in m.tensors] == ["bfloat16", "int64"]
