"""Argument checks of the hub's control operations: every frame is checked before any handler runs.

A frame with a valid token can still carry anything msgpack can (a map for a version, a float for a
shard, 2**63 for a unit id). Each operation declares its arguments here once; `check_args` turns a
missing, unknown, wrong-typed or out-of-range argument into a typed error (nothing changed):
`VersionError` for a version, `ShardError` for a shard, `InvalidArgumentError` for anything else;
and hands the handler values of the declared types.

    check_args("latest", {"model": "policy"})    # -> {"model": "policy"}
    check_args("latest", {"model": 7})           # InvalidArgumentError: latest: model must be ...
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import msgpack

from rlsync.hub.errors import HubError, InvalidArgumentError, ProtocolError, ShardError, VersionError
from rlsync.hub.model.location import Location
from rlsync.hub.model.manifest import Manifest
from rlsync.hub.model.shard import Shard
from rlsync.hub.protocol.messages import Endpoint

MAX_ID = 2**63 - 1
"""Largest version number or unit id (a signed 64-bit integer, what the journal stores)."""
MAX_STR = 256
MAX_LIST = 1 << 20


class Bad(Exception):
    """One argument's complaint; `check_args` names the argument and the operation."""


def _int(lo: int = 0, hi: int = MAX_ID) -> Callable:
    def check(v):
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise Bad(f"must be an int in [{lo}, {hi}]")
        return v
    return check


def _str(v):
    if not isinstance(v, str) or not v or len(v) > MAX_STR:
        raise Bad(f"must be a non-empty string of at most {MAX_STR} chars")
    return v


def _model(v):
    if _str(v) and ":" in v:
        raise Bad("must not contain ':'")
    return v


def _bool(v):
    if not isinstance(v, bool):
        raise Bad("must be a bool")
    return v


MAX_WAIT_S = 600.0
"""Longest one `wait_latest` call may stay parked (a caller that waits longer asks again)."""


def _wait_s(v):
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= MAX_WAIT_S:  # NaN fails too
        raise Bad(f"must be seconds in [0, {MAX_WAIT_S:g}]")
    return float(v)


def _version_or_latest(v):
    return v if v == "latest" else _int()(v)


def _shard(v):
    if not isinstance(v, (list, tuple)) or len(v) != 4 or not all(
            isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= 1 << 20 for x in v):
        raise Bad("must be [tp, pp, tp_size, pp_size] of small ints")
    try:
        return Shard(*v)
    except HubError as e:
        raise Bad(str(e)) from None


def _location(v):
    if not isinstance(v, dict) or not all(isinstance(k, str) and isinstance(x, str) and len(x) <= MAX_STR
                                          for k, x in v.items()):
        raise Bad("must be a map of str -> str (dc, rack, host, device)")
    return Location.from_wire(v)


def _endpoint(v):
    try:
        Endpoint.from_wire(v)  # the shape every reader will type it with (hub/protocol/messages.py)
    except ProtocolError as e:
        raise Bad(f"must be a data-plane endpoint ({str(e).removeprefix('malformed endpoint: ')})") from None
    key = v.get("reader_key")
    if not isinstance(key, bytes) or len(key) != 32:
        raise Bad("must carry the reader's 32-byte session key 'reader_key'")
    return v


def _manifest(v):
    if isinstance(v, Manifest):  # the server recognized a manifest it knows (hub/server/known_manifests.py)
        return v
    if not isinstance(v, dict):
        raise Bad("must be a manifest map")
    try:
        return manifest_from_wire(v)
    except HubError as e:
        raise Bad(str(e)) from None
    except Exception as e:  # noqa: BLE001 - any other shape msgpack can carry
        raise Bad(f"malformed manifest ({type(e).__name__})") from None


def _list(item: Callable) -> Callable:
    def check(v):
        if not isinstance(v, list) or len(v) > MAX_LIST:
            raise Bad(f"must be a list of at most {MAX_LIST} items")
        return [item(x) for x in v]
    return check


MAX_DIGESTS = 64


def _digests(v):
    """Digests of the manifests a reader has (`fetch`'s `have_manifests`): a short list of hex strings."""
    if not isinstance(v, list) or len(v) > MAX_DIGESTS or not all(
            isinstance(d, str) and 0 < len(d) <= 64 and all(c in "0123456789abcdef" for c in d) for d in v):
        raise Bad(f"must be a list of at most {MAX_DIGESTS} lowercase hex digests")
    return frozenset(v)


def _optional(check: Callable) -> Callable:
    return lambda v: None if v is None else check(v)


def _group(v):
    if not isinstance(v, (list, tuple)) or len(v) != 2:
        raise Bad("must be [name, size]")
    return (_str(v[0]), _int(1, 1 << 20)(v[1]))


def _into_spec(v):
    def one(x):
        if not (isinstance(x, list) and len(x) == 3 and isinstance(x[0], str) and isinstance(x[1], str)):
            raise Bad("must be [[name, dtype, shape], ...]")
        _list(_int())(x[2])
        return x
    return _list(one)(v)


_PARSED: OrderedDict[tuple, tuple[dict, Manifest]] = OrderedDict()
PARSED_MANIFESTS = 16
"""Manifests parsed lately: a re-join storm re-registers the same few manifests thousands of times;
parsing and validating a 1,000-unit one costs ~3.5 ms of CPU, comparing its map to a cached one ~0.1."""


def manifest_from_wire(v: dict) -> Manifest:
    """`Manifest.from_wire(v)`; the same (immutable) object for a map equal to one parsed lately.

    A map equal to a cached manifest's own `to_wire()` parses to that manifest (`from_wire` coerces with
    int()/str(), which agree on values that compare equal), so a hit is exactly what parsing gives; any
    other map (extra keys, tuples) is parsed as always."""
    try:
        t, u = v["t"], v["u"]
        key = (len(t), len(u), repr(t[:1]), repr(u[:1]), repr(u[-1:]))
    except Exception:  # noqa: BLE001 - not the shape of a manifest: from_wire says what is wrong
        return Manifest.from_wire(v)
    hit = _PARSED.get(key)
    if hit is not None and hit[0] == v:
        _PARSED.move_to_end(key)
        return hit[1]
    m = Manifest.from_wire(v)
    _PARSED[key] = (m.to_wire(), m)  # our own lists (the caller's map may change later): half a deepcopy
    if len(_PARSED) > PARSED_MANIFESTS:
        _PARSED.popitem(last=False)
    return m


def _params(v):
    """A transform's parameters: a small map of names to scalars (what the hub records beside its name)."""
    if not isinstance(v, dict) or len(v) > 32 or not all(
            isinstance(k, str) and len(k) <= 64 and (v[k] is None or isinstance(v[k], (str, int, float, bool)))
            and (not isinstance(v[k], str) or len(v[k]) <= MAX_STR) for k in v):
        raise Bad("must be a map of at most 32 names to scalars")
    return v


MAX_ANNOTATION_BYTES = 16 << 10
"""Largest annotation value, packed: a note on a version (a few probe log-probs), never tensor data."""


def _annotation_value(v):
    """A JSON-able value (None, bool, int, float, str, list, str-keyed map), at most 16 KiB packed."""
    todo, seen = [(v, 0)], 0
    while todo:
        x, depth = todo.pop()
        seen += 1
        if depth > 16 or seen > MAX_ANNOTATION_BYTES:
            raise Bad("must be nested at most 16 deep and hold at most 16384 items")
        if isinstance(x, (list, tuple)):
            todo.extend((y, depth + 1) for y in x)
        elif isinstance(x, dict):
            if not all(isinstance(k, str) for k in x):
                raise Bad("must be JSON-able: map keys are strings")
            todo.extend((y, depth + 1) for y in x.values())
        elif not (x is None or isinstance(x, (bool, float, str))
                  or (isinstance(x, int) and -MAX_ID - 1 <= x <= MAX_ID)):
            raise Bad(f"must be JSON-able (None, bool, int, float, str, list, map), not {type(x).__name__}")
    size = len(msgpack.packb(v))
    if size > MAX_ANNOTATION_BYTES:
        raise Bad(f"must be at most {MAX_ANNOTATION_BYTES} bytes packed ({size} here): store bulk data elsewhere")
    return msgpack.unpackb(msgpack.packb(v))  # the value as every reader will see it (tuples are lists)


_WID = _str
SPECS: dict[str, dict[str, tuple[Callable, bool]]] = {  # op -> argument -> (check, required)
    "ping": {},
    "stats": {},
    "models": {},
    "latest": {"model": (_model, True)},
    "versions": {"model": (_model, True)},
    "wait_latest": {"model": (_model, True), "at_least": (_int(), True), "timeout_s": (_wait_s, True)},
    "join": {"name": (_str, True), "location": (_location, True), "endpoint": (_endpoint, True),
             "worker_id": (_optional(_str), False), "role": (_str, False), "follow": (_bool, False)},
    "heartbeat": {"wid": (_WID, True)},
    "leave": {"wid": (_WID, True)},
    "publish": {"wid": (_WID, True), "model": (_model, True), "version": (_int(), True),
                "shard": (_shard, True), "manifest": (_manifest, True), "home": (_optional(_str), False)},
    "register": {"wid": (_WID, True), "model": (_model, True), "version": (_int(), True),
                 "shard": (_shard, True), "slot": (_str, True), "manifest": (_manifest, True),
                 "origin": (_bool, False)},
    "fetch": {"wid": (_WID, True), "model": (_model, True), "version": (_version_or_latest, True),
              "shard": (_shard, True), "group": (_optional(_group), False),
              "into_spec": (_optional(_into_spec), False),
              "have_manifests": (_optional(_digests), False), "relay": (_bool, False)},
    "replan": {"wid": (_WID, True), "fetch_id": (_str, True), "failed": (_list(_str), True),
               "units": (_list(_int(0, 2**32)), True), "gone": (_list(_str), False)},
    "delta_choose": {"wid": (_WID, True), "model": (_model, True), "version": (_version_or_latest, True),
                     "shard": (_shard, True), "base": (_int(), True), "into_spec": (_optional(_into_spec), False),
                     "explain": (_bool, False)},
    "fetch_done": {"wid": (_WID, True), "fetch_id": (_str, True), "ok": (_bool, True)},
    "applied": {"wid": (_WID, True), "model": (_model, True), "version": (_int(), True),
                "shard": (_shard, True), "manifest_digest": (_str, True), "done": (_list(_str), True),
                "release_deltas": (_list(_int()), False)},
    "derive": {"wid": (_WID, True), "model": (_model, True), "version": (_version_or_latest, True),
               "transform": (_str, True), "shard": (_shard, True), "params": (_optional(_params), False)},
    "derive_abandon": {"wid": (_WID, True), "model": (_model, True), "version": (_int(), True),
                       "shard": (_shard, True)},
    "derived_from": {"model": (_model, True), "version": (_int(), True)},
    "release": {"wid": (_WID, True), "model": (_model, True), "version": (_int(), True),
                "shard": (_shard, True), "slot": (_str, False), "handoff": (_bool, False)},
    "annotate": {"model": (_model, True), "version": (_int(), True), "key": (_str, True),
                 "value": (_annotation_value, True)},
    "annotations": {"model": (_model, True), "version": (_int(), True)},
}


ERROR_FOR = {"version": VersionError, "shard": ShardError}
"""A bad version or shard is the error these always were; any other argument: InvalidArgumentError."""


def _refuse(op: str, name: str, why: Bad, value) -> HubError:
    return ERROR_FOR.get(name, InvalidArgumentError)(f"{op}: {name} {why}, got {_short(value)}")


def check_args(op: str, args: dict) -> dict:
    """`args` checked against `op`'s declaration: the values handlers get (Shard, Location, Manifest)."""
    spec = SPECS[op]
    unknown = sorted(str(k) for k in args if k not in spec)
    if unknown:
        raise InvalidArgumentError(f"{op}: unknown arguments {unknown[:5]}")
    out = {}
    for name, (check, required) in spec.items():
        if name not in args:
            if required:
                raise InvalidArgumentError(f"{op}: missing argument {name!r}")
            continue
        try:
            out[name] = check(args[name])
        except Bad as e:
            raise _refuse(op, name, e, args[name]) from None
    return out


def check_value(op: str, name: str, value):
    """One argument of `op` checked as the hub would (client-side, before anything is sent)."""
    try:
        return SPECS[op][name][0](value)
    except Bad as e:
        raise _refuse(op, name, e, value) from None


def check_coords(op: str, model, version, shard) -> None:
    """A client call's (model, version, shard), checked before anything is sent or changed."""
    check_value(op, "model", model)
    check_value(op, "version", version)
    if not isinstance(shard, Shard):
        raise ShardError(f"{op}: shard must be a Shard, got {type(shard).__name__}")


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."
