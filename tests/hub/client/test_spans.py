"""The destination-overlap index (hub/client/replicas.py `Spans`, `overlaps`): the same answer as comparing every
pair of byte ranges, on random views of shared storages (touching ends, containment, empty tensors, other
dtypes), and a replica held here found by `live_overlapping` only when it shares bytes with the destination."""
import random

import torch

from rlsync.hub.client.replicas import Spans, _span, overlaps


def _pairwise(xs, ys) -> bool:
    return any(a < e and s < b for a, b in map(_span, [t for t in xs if t.numel()])
               for s, e in map(_span, [t for t in ys if t.numel()]))


def _views(rng: random.Random, base: torch.Tensor, n: int) -> list[torch.Tensor]:
    out = []
    for _ in range(n):
        dtype = rng.choice([torch.uint8, torch.float16, torch.float32])
        flat = base.view(dtype) if dtype != torch.uint8 else base
        start = rng.randrange(flat.numel())
        out.append(flat[start:start + rng.choice([0, 1, 2, 7, 64, 300])])
    return out


def _cases(seed: int, n: int = 400):
    """(trial, xs, ys): random views of three shared storages, some overlapping, some not."""
    rng = random.Random(seed)
    storages = [torch.zeros(4096, dtype=torch.uint8) for _ in range(3)]
    for trial in range(n):
        xs = [v for b in storages for v in _views(rng, b, rng.randrange(0, 4))]
        ys = [v for b in rng.sample(storages, rng.randrange(0, 3)) for v in _views(rng, b, rng.randrange(0, 5))]
        yield trial, xs, ys


def test_the_index_answers_as_every_pair_does():
    seen = set()
    for trial, xs, ys in _cases(0):
        assert overlaps(xs, ys) == _pairwise(xs, ys), trial
        seen.add(_pairwise(xs, ys))
        idx = Spans(ys)
        assert [idx.touches(t) for t in xs] == [_pairwise([t], ys) for t in xs], trial
    assert seen == {True, False}


def test_touching_ends_do_not_overlap_and_one_byte_does():
    b = torch.zeros(100, dtype=torch.uint8)
    assert not overlaps([b[10:20]], [b[20:30], b[0:10]])
    assert overlaps([b[10:21]], [b[20:30]]) and overlaps([b[15:16]], [b[0:100]])
    assert not overlaps([b[5:5]], [b])  # an empty tensor holds no bytes


def test_two_indexes_meet_as_every_pair_does():
    seen = set()
    for trial, xs, ys in _cases(1):
        want = _pairwise(xs, ys)
        assert Spans(ys).meets(Spans(xs)) == want and Spans(xs).meets(Spans(ys)) == want, trial
        seen.add(want)
    assert seen == {True, False}
