"""`Replicas`: the client's book of what this worker holds — the one piece of state every part reads.

    book = Replicas()
    book.hold(rid, "policy", 7, shard, "live", origin=True)   # a publish that the hub accepted
    book.entry(rid)          # ("policy", 7, shard, "live") or None
    book.drop(rid)           # out of the data-plane store and the book; returns the LocalReplica

It pairs the data-plane `ReplicaStore` (the bytes this worker serves) with what the hub was told about
them: which replicas are held (model, version, shard, slot), which this worker published itself (a
re-registration after a hub restart says origin), which are being released (a re-join skips them), and
the private copy a fetch of an already held version made into other buffers (`fetch_delta` starts
from it). Pure bookkeeping: no RPC, no thread; the parts that talk to the hub (hub/client/session.py,
publish.py, fetch.py, deltas.py) each hold this book and their own handles, nothing else.
"""
from __future__ import annotations

import bisect

import torch

from rlsync.hub import errors as E
from rlsync.hub.dataplane.store import LocalReplica, ReplicaStore
from rlsync.hub.model.replica_id import ReplicaId
from rlsync.hub.model.shard import Shard

Entry = tuple[str, int, Shard, str]
"""(model, version, shard, slot) of a held replica."""


class Replicas:
    """The local replica book (see the module doc)."""

    def __init__(self) -> None:
        self.store = ReplicaStore()
        """The bytes this worker's data-plane server serves, by wire replica id."""
        self.held: dict[str, Entry] = {}
        """Wire replica id -> (model, version, shard, slot): what the hub routes reads to here."""
        self.published: set[str] = set()
        """Live replicas this worker published (their re-registration after a hub restart says origin)."""
        self.releasing: set[str] = set()
        """Replicas whose release is under way: a re-join does not re-register them (the release
        re-registers one itself if the new hub has not heard of it, so retention still decides)."""
        self.copies: dict = {}
        """(model, shard key) -> (version, manifest, data pointers) of the last private copy a fetch of a
        version already held made into other buffers: `fetch_delta` into them starts from it."""

    # ------------------------------------------------------------------ entries
    def entry(self, rid: str) -> Entry | None:
        return self.held.get(rid)

    def hold(self, rid: str, model: str, version: int, shard: Shard, slot: str, *, origin: bool = False) -> None:
        """Book `rid` as held (its bytes are in the store already)."""
        self.held[rid] = (model, version, shard, slot)
        if origin:
            self.published.add(rid)

    def drop(self, rid: str) -> LocalReplica | None:
        """Forget `rid` entirely: out of the store and the book. Returns the store's replica, if any."""
        rep = self.store.remove(rid)
        self.held.pop(rid, None)
        self.published.discard(rid)
        return rep

    def clear(self) -> None:
        """Every replica fails its readers and goes (the worker leaves)."""
        for rep in self.store.all():
            rep.fail("worker left")
            self.store.remove(rep.id)
        self.held.clear()
        self.published.clear()

    def complete(self, rid: str) -> LocalReplica | None:
        """The held replica `rid` if its bytes are all here (what may be registered or served)."""
        rep = self.store.get(rid)
        return rep if rid in self.held and rep is not None and rep.complete else None

    def ids(self, worker_id: str | None) -> list[ReplicaId]:
        return [ReplicaId(worker_id, model, version, shard.key, slot)
                for model, version, shard, slot in (self.held[rid] for rid in sorted(self.held))]

    # ------------------------------------------------------------------ buffers
    def live_overlapping(self, into: dict[str, torch.Tensor], keep: str | None = None) -> list[str]:
        """Full live replicas held here (but `keep`) whose buffers share memory with `into`."""
        out = []
        dest = Spans(into.values())
        for rid, (_, _, _, slot) in list(self.held.items()):
            rep = self.store.get(rid)
            if slot != "live" or rep is None or rid == keep:
                continue
            if dest.meets(replica_spans(rep)):
                out.append(rid)
        return out

    def check_destination(self, into: dict[str, torch.Tensor], what: str = "into") -> None:
        """Refuse, before anything moves, destination buffers that cannot take a version: two of them
        sharing memory (one would end up holding the other's bytes, and be served so), or memory of a
        replica here that cannot be released first (a fetch still receiving into it, an offload seed).
        A full live replica in those buffers is fine: it is released first (the mutability contract)."""
        pair = aliased(into)
        if pair is not None:
            raise E.BufferMismatchError(f"{what}: tensors {pair[0]!r} and {pair[1]!r} overlap in memory; each "
                                        "destination tensor needs bytes of its own")
        dest = Spans(into.values())
        for rep in self.store.all():
            entry = self.held.get(rep.id)
            if entry is not None and entry[3] == "live" and rep.complete:
                continue
            if dest.meets(replica_spans(rep)):
                raise E.BufferMismatchError(f"{what} overlaps the buffers of replica {rep.id}, which this worker is "
                                            "still receiving or keeps as a seed: use other memory")


def buffers(rep: LocalReplica) -> dict[str, torch.Tensor]:
    """The memory a replica's version lives in (a device replica's device tensors, else its tensors)."""
    return getattr(rep, "device_tensors", rep.tensors)


def _span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


class Spans:
    """The bytes of some tensors, per device, sorted and merged: does a tensor touch any of them? One
    bisection per tensor (a fetch asks this of every tensor of every replica held here: pairwise, 135
    adapters x 121 x 121 tensors took ~98 ms per fetch, docs/tenants.md)."""

    def __init__(self, tensors):
        by_dev: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for t in tensors:
            if t.numel():
                by_dev.setdefault((t.device.type, t.device.index or 0), []).append(_span(t))
        self._idx: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
        for dev, spans in by_dev.items():
            starts: list[int] = []
            ends: list[int] = []
            for a, b in sorted(spans):
                if ends and a < ends[-1]:  # overlaps the last merged span: extend it
                    ends[-1] = max(ends[-1], b)
                else:
                    starts.append(a)
                    ends.append(b)
            self._idx[dev] = (starts, ends)

    def touches(self, t: torch.Tensor) -> bool:
        idx = self._idx.get((t.device.type, t.device.index or 0))
        if idx is None or not t.numel():
            return False
        a, b = _span(t)
        i = bisect.bisect_left(idx[0], b) - 1  # the last merged span starting before this one ends
        return i >= 0 and idx[1][i] > a

    def any(self, tensors) -> bool:
        return any(self.touches(t) for t in tensors)

    def meets(self, other: "Spans") -> bool:
        """Does any byte of `other` lie in these spans? A walk of both sorted lists per shared device."""
        for dev, (s1, e1) in other._idx.items():
            idx = self._idx.get(dev)
            if idx is None:
                continue
            s0, e0 = idx
            i = bisect.bisect_right(e0, s1[0])  # skip our spans that end before theirs begin
            j = 0
            while i < len(s0) and j < len(s1):
                if s0[i] < e1[j] and s1[j] < e0[i]:
                    return True
                if e0[i] <= e1[j]:
                    i += 1
                else:
                    j += 1
        return False


def replica_spans(rep: LocalReplica) -> Spans:
    """A held replica's `Spans`, made once: its buffers are fixed when it is made (as its served
    `addresses` are, hub/dataplane/store.py)."""
    got = getattr(rep, "_rlsync_spans", None)
    if got is None:
        got = Spans(buffers(rep).values())
        rep._rlsync_spans = got
    return got


def overlaps(xs, ys) -> bool:
    """Do any of tensors `xs` share bytes with any of tensors `ys` (on the same device)?"""
    return Spans(ys).any(xs)


def aliased(tensors: dict[str, torch.Tensor]) -> tuple[str, str] | None:
    """Two names of `tensors` whose memory overlaps (views of one storage), or None. Sorted sweep."""
    spans = sorted((t.device.type, t.device.index or 0, *_span(t), name) for name, t in tensors.items() if t.numel())
    for (d0, i0, _, end, a), (d1, i1, start, _, b) in zip(spans, spans[1:]):
        if (d0, i0) == (d1, i1) and start < end:
            return a, b
    return None
