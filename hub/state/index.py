"""The hub's tables with their indexes kept up to date on every write: queries cost what they return.

`HubState` keeps its replicas and fetches in a `ReplicaTable` and a `FetchTable` (dicts: every
protocol and test reads and writes them as before) and each fetch's `sources` in a `SourceMap`.
Every insert, delete and source change updates one `StateIndex`:

    shard_replicas  (model, version, shard) -> replica ids          who holds a shard
    places          (model, version, shard) -> host/rack/DC key -> replica ids   nearest holders first
    worker_replicas worker -> replica ids                           heartbeats, leave, expiry
    readers_of      replica id -> fetch ids reading from it         in-flight counts, downstream walk
    load            worker -> open (fetch, source) pairs on its replicas   the planner's fan-out load
    crossing        (model, version, DC) -> open fetches into the DC that read from another DC
    shard_fetches / relay_fetches / reader_fetches / fetch_versions / replica_versions

Each answer equals the scan over the whole table it replaces (tests/hub/state/test_scale_equivalence.py
runs random operation sequences against the scans). A worker's location is read when its replica
is indexed; a re-join that moves a worker rebuilds the index (`rebuild`), which is rare.
"""
from __future__ import annotations

from collections import Counter

from rlsync.hub.model.location import Location

Key = tuple[str, int, str]


def _add(d: dict, key, item) -> None:
    s = d.get(key)
    if s is None:
        d[key] = {item: None}
    else:
        s[item] = None


def _discard(d: dict, key, item) -> None:
    s = d.get(key)
    if s is not None:
        s.pop(item, None)
        if not s:
            del d[key]


def place_keys(loc: Location) -> tuple[tuple, tuple, tuple]:
    return ("h", loc.dc, loc.rack, loc.host), ("r", loc.dc, loc.rack), ("d", loc.dc)


class StateIndex:
    def __init__(self, workers: dict) -> None:
        self.workers = workers
        self.events = None  # HubState's ReleaseEvents: the writes a pending release depends on
        self.replicas: ReplicaTable | None = None
        self.fetches: FetchTable | None = None
        self.reset()

    def reset(self) -> None:
        self.shard_replicas: dict[Key, dict[str, None]] = {}
        self.places: dict[Key, dict[tuple, dict[str, None]]] = {}
        self.placed: dict[str, Location | None] = {}
        self.worker_replicas: dict[str, dict[str, None]] = {}
        self.replica_versions: dict[str, Counter] = {}
        self.readers_of: dict[str, dict[str, None]] = {}
        self.load: Counter = Counter()
        self.shard_fetches: dict[Key, dict[str, None]] = {}
        self.relay_fetches: dict[str, dict[str, None]] = {}
        self.reader_fetches: dict[str, dict[str, None]] = {}
        self.fetch_versions: dict[str, Counter] = {}
        self.crossing: Counter = Counter()
        self.crosses: dict[str, tuple] = {}   # fetch id -> the crossing key it is counted under

    def rebuild(self) -> None:
        """Index the tables from scratch (a worker moved: every location-derived key may change)."""
        self.reset()
        for rid, r in self.replicas.items():
            self.replica_added(rid, r)
        for fid, f in self.fetches.items():
            self.fetch_added(fid, f)

    # ------------------------------------------------------------------ replicas
    def replica_added(self, rid: str, r) -> None:
        key = (r.model, r.version, r.shard)
        if self.events is not None:
            self.events.shard(*key)
        _add(self.shard_replicas, key, rid)
        _add(self.worker_replicas, r.worker, rid)
        self.replica_versions.setdefault(r.model, Counter())[r.version] += 1
        w = self.workers.get(r.worker)
        loc = w.location if w is not None else None
        self.placed[rid] = loc
        if loc is not None:
            places = self.places.setdefault(key, {})
            for k in place_keys(loc):
                _add(places, k, rid)
        readers = self.readers_of.get(rid)
        if readers:
            self.load[r.worker] += len(readers)
            for fid in readers:
                self._recross(fid)

    def replica_removed(self, rid: str, r) -> None:
        key = (r.model, r.version, r.shard)
        if self.events is not None:
            self.events.shard(*key)
        _discard(self.shard_replicas, key, rid)
        _discard(self.worker_replicas, r.worker, rid)
        c = self.replica_versions[r.model]
        c[r.version] -= 1
        if c[r.version] <= 0:
            del c[r.version]
        loc = self.placed.pop(rid, None)
        if loc is not None:
            places = self.places[key]
            for k in place_keys(loc):
                _discard(places, k, rid)
            if not places:
                del self.places[key]
        readers = self.readers_of.get(rid)
        if readers:
            self.load[r.worker] -= len(readers)
            for fid in readers:
                self._recross(fid)

    # ------------------------------------------------------------------ fetches and their sources
    def fetch_added(self, fid: str, f) -> None:
        if self.events is not None:
            self.events.version(f.model, f.version)
        _add(self.shard_fetches, (f.model, f.version, f.shard), fid)
        if f.relay:  # "": a partial read, no relay
            _add(self.relay_fetches, f.relay, fid)
        _add(self.reader_fetches, f.reader, fid)
        self.fetch_versions.setdefault(f.model, Counter())[f.version] += 1
        for rid in f.sources:
            self._source_added(fid, rid)
        self._recross(fid)

    def fetch_removed(self, fid: str, f) -> None:
        if self.events is not None:
            self.events.version(f.model, f.version)
        _discard(self.shard_fetches, (f.model, f.version, f.shard), fid)
        if f.relay:
            _discard(self.relay_fetches, f.relay, fid)
        _discard(self.reader_fetches, f.reader, fid)
        c = self.fetch_versions[f.model]
        c[f.version] -= 1
        if c[f.version] <= 0:
            del c[f.version]
        for rid in f.sources:
            self._source_removed(fid, rid)
        old = self.crosses.pop(fid, None)
        if old is not None:
            self.crossing[old] -= 1

    def _source_added(self, fid: str, rid: str) -> None:
        _add(self.readers_of, rid, fid)
        r = self.replicas.get(rid)
        if r is not None:
            self.load[r.worker] += 1
            if self.events is not None:
                self.events.shard(r.model, r.version, r.shard)

    def _source_removed(self, fid: str, rid: str) -> None:
        _discard(self.readers_of, rid, fid)
        r = self.replicas.get(rid)
        if r is not None:
            self.load[r.worker] -= 1
            if self.events is not None:
                self.events.shard(r.model, r.version, r.shard)

    def source_changed(self, fid: str, rid: str, added: bool) -> None:
        if fid not in self.fetches:
            return  # a fetch record not (or no longer) in the table: nothing of it is indexed
        (self._source_added if added else self._source_removed)(fid, rid)
        self._recross(fid)

    def _recross(self, fid: str) -> None:
        """Re-decide whether fetch `fid` reads across DCs into its reader's DC (`Fetches._crossing_into`)."""
        f = self.fetches.get(fid)
        old = self.crosses.pop(fid, None)
        if old is not None:
            self.crossing[old] -= 1
        if f is None:
            return
        reader = self.workers.get(f.reader)
        if reader is None:
            return
        dc = reader.location.dc
        for rid in f.sources:
            r = self.replicas.get(rid)
            if r is not None:
                w = self.workers.get(r.worker)
                if w is not None and w.location.dc != dc:
                    key = (f.model, f.version, dc)
                    self.crosses[fid] = key
                    self.crossing[key] += 1
                    return


class _Watched(dict):
    """A dict whose every write goes through `__setitem__`/`__delitem__` (the subclass reports them to
    the index), including pop, setdefault, update, clear and popitem."""

    _missing = object()

    def pop(self, key, default=_missing):
        if key in self:
            v = dict.__getitem__(self, key)
            del self[key]
            return v
        if default is _Watched._missing:
            raise KeyError(key)
        return default

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return dict.__getitem__(self, key)

    def update(self, *a, **kw) -> None:
        for k, v in dict(*a, **kw).items():
            self[k] = v

    def clear(self) -> None:
        for k in list(self):
            del self[k]

    def popitem(self):
        k = next(reversed(self))
        return k, self.pop(k)


class ReplicaTable(_Watched):
    """replica id -> ReplicaRec; every write also goes to the index."""

    def __init__(self, index: StateIndex) -> None:
        super().__init__()
        self.index = index
        index.replicas = self

    def __setitem__(self, rid, r) -> None:
        old = self.get(rid)
        if old is not None and (old.worker, old.model, old.version, old.shard) == (r.worker, r.model, r.version, r.shard):
            super().__setitem__(rid, r)  # the same place in every index (ids only): nothing moves
            if self.index.events is not None:  # but its flags may differ
                self.index.events.shard(r.model, r.version, r.shard)
            return
        if old is not None:
            self.index.replica_removed(rid, old)
        super().__setitem__(rid, r)
        self.index.replica_added(rid, r)

    def __delitem__(self, rid) -> None:
        r = self[rid]
        super().__delitem__(rid)
        self.index.replica_removed(rid, r)


class FetchTable(ReplicaTable):
    """fetch id -> FetchRec; a record's `sources` becomes a `SourceMap` that reports its changes."""

    def __init__(self, index: StateIndex) -> None:
        dict.__init__(self)
        self.index = index
        index.fetches = self

    def __setitem__(self, fid, f) -> None:
        old = self.get(fid)
        if old is not None:
            dict.__delitem__(self, fid)
            self.index.fetch_removed(fid, old)
        if not isinstance(f.sources, SourceMap) or f.sources.fid != fid:
            f.sources = SourceMap(self.index, fid, f.sources)
        dict.__setitem__(self, fid, f)
        self.index.fetch_added(fid, f)

    def __delitem__(self, fid) -> None:
        f = self[fid]
        dict.__delitem__(self, fid)
        self.index.fetch_removed(fid, f)


class SourceMap(_Watched):
    """A fetch's replica id -> unit list; adding or removing a replica id updates the index."""

    def __init__(self, index: StateIndex, fid: str, items) -> None:
        super().__init__(items)
        self.index, self.fid = index, fid

    def __setitem__(self, rid, units) -> None:
        new = rid not in self
        super().__setitem__(rid, units)
        if new:
            self.index.source_changed(self.fid, rid, True)

    def __delitem__(self, rid) -> None:
        super().__delitem__(rid)
        self.index.source_changed(self.fid, rid, False)
