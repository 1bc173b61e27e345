"""Fuzz (hypothesis): thousands of generated control frames and data-plane requests against a live hub
process and a live worker process. Every one gets a typed refusal; no handler raises (the hub's log has
no traceback, the data plane answers every request with a typed error frame); the hub's state and its
journal are exactly as before.

Frames include valid-token frames for every operation with each argument replaced by wrong-typed or
out-of-range values (what crashed handlers on ea01902: 20 of 300 such frames), and frames with another
tenant's credential (issue 34): refused (`tenant_access` for the operator's models and workers), and
`stats` / `models` answered without the models that tenant may not list.

Resharding (pure logic, no hub): generated `ShardedLayout`s either tile every tensor exactly or are
refused with `LayoutError`, and plans of generated destinations over them fill each destination
element exactly once or are refused with `LayoutError` (on 0f12831 a gap was accepted, issue 30).
"""
import hashlib
import os
import socket
import sqlite3
import string

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlsync.hub import ClientConfig, HubClient, Location
from rlsync.hub import errors as E
from rlsync.hub.dataplane.wire import MAGIC, REQ, UNIT
from rlsync.hub.tools.demo import start_hub_process
from rlsync.hub.tools.procs import WorkerProcess, close_all
from rlsync.hub.protocol.args import MAX_WAIT_S, SPECS, check_args

pytestmark = pytest.mark.timeout(300)
CONTROL_FRAMES = 2000
DATA_REQUESTS = 300
CODES = set(E._BY_CODE) - {"hub_error"}  # every typed error; "hub_error" is the internal-error reply
SAFE_VALID = {"ping", "stats", "models", "latest", "versions", "wait_latest", "annotations"}  # read-only ops a frame may call validly
TENANT_TOKEN = "fuzz-tenant-token"  # a second tenant's credential: may publish fz/* only
BAD = {"bad": 1}  # refused by every argument's check (see wire_args)
PLAUSIBLE = {  # per argument, values that pass its check, so frames reach the state machine too
    "model": st.sampled_from(["policy", "nope"]), "version": st.one_of(st.integers(0, 4), st.just("latest")),
    "shard": st.sampled_from([[0, 0, 1, 1], [1, 0, 2, 1]]), "slot": st.sampled_from(["live", "seed", "x"]),
    "manifest": st.just({"t": [], "u": []}), "fetch_id": st.sampled_from(["f1", "1.f2"]),
    "failed": st.just([]), "units": st.lists(st.integers(0, 40), max_size=3), "ok": st.booleans(),
    "handoff": st.booleans(), "follow": st.booleans(), "origin": st.booleans(), "name": st.just("n"),
    "location": st.just({"dc": "d"}),
    "endpoint": st.just({"tcp": "127.0.0.1:1", "reader_key": b"k" * 32}), "group": st.just(["g", 1]),
    "into_spec": st.just([]), "base": st.integers(0, 4), "worker_id": st.just("w9.9"),
    "role": st.sampled_from(["worker", "seed", "x"]), "have_manifests": st.sampled_from([[], ["0" * 32]]),
    "explain": st.booleans(), "relay": st.booleans(), "home": st.sampled_from([None, "h0"]), "manifest_digest": st.just("0" * 32), "done": st.sampled_from([[], ["f1"]]),
    "release_deltas": st.sampled_from([[], [1]]), "gone": st.sampled_from([[], ["w1.1:policy:1:tp0-pp0:live"]]), "at_least": st.integers(0, 4),
    "timeout_s": st.sampled_from([0, 0.05]), "transform": st.sampled_from(["bf16", "int8", "delta"]),
    "params": st.sampled_from([None, {}, {"revision": 1}]), "key": st.just("k"), "value": st.just([1.5])}

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=True),
                    st.text(max_size=20), st.binary(max_size=40), st.sampled_from(["latest", "policy", "live", "seed"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("fuzz"))
    log_path = os.path.join(tmp, "hub.log")
    log = open(log_path, "w")
    os.environ["RLSYNC_HUB_LOG"] = "INFO"
    try:
        with open(os.path.join(tmp, "tenant.token"), "w") as f:
            f.write(TENANT_TOKEN)
        with open(os.path.join(tmp, "tenants.yaml"), "w") as f:
            f.write("tenants:\n- {name: fz, token_file: tenant.token, publish: ['fz/*']}\n")
        hub, address, token = start_hub_process(tmp, stderr=log, extra=("--tenants", os.path.join(tmp, "tenants.yaml")))
    finally:
        os.environ.pop("RLSYNC_HUB_LOG")
    trainer = WorkerProcess(address, token, ClientConfig(transport="tcp-py"), name="trainer")
    reader = HubClient(address, token, config=ClientConfig(transport="tcp-py"))
    try:
        trainer.join(host="t")
        trainer.call("publish", model="policy", version=1, size_mb=0.25, seed=1)
        reader.join(Location(host="r"), "reader")
        yield {"hub": hub, "address": address, "token": token, "trainer": trainer, "reader": reader,
               "journal": os.path.join(tmp, "journal.db"), "log": log_path}
    finally:
        reader.leave()
        close_all([trainer])
        hub.kill()
        hub.wait()
        log.close()


def snapshot(live) -> tuple:
    """The hub's state as a client sees it, and a digest of every row of its journal."""
    s = live["reader"].stats()
    state = {k: s[k] for k in ("workers", "replicas", "fetches", "models")}
    db = sqlite3.connect(f"file:{live['journal']}?mode=ro", uri=True)
    try:
        h = hashlib.sha256()
        for table in ("versions", "meta"):
            for row in db.execute(f"SELECT * FROM {table} ORDER BY 1, 2"):
                h.update(repr(row).encode())
    finally:
        db.close()
    return state, h.hexdigest(), sorted(live["trainer"].call("held"))


def hub_log(live) -> str:
    with open(live["log"]) as f:
        return f.read()


# ----------------------------------------------------------------------------- control plane
@st.composite
def frames(draw, wids):
    kind = draw(st.sampled_from(["op", "op", "op", "op", "token", "shape", "tenant"]))
    op = draw(st.sampled_from(sorted(SPECS) + ["nope", "", "_handle"]))
    if kind == "shape":  # a map that is not a request, or a request whose args are not a map
        return draw(st.one_of(st.dictionaries(st.text(max_size=6), values, max_size=4),
                              st.builds(lambda a: {"id": 1, "op": op, "args": a}, values))), "op"
    args = {}
    for name, (_, required) in SPECS.get(op, {}).items():
        if not required and draw(st.booleans()):
            continue
        plausible = st.sampled_from(wids + ["w9.9"]) if name == "wid" else PLAUSIBLE[name]
        args[name] = draw(plausible) if draw(st.integers(0, 9)) < 7 else draw(values)
    if draw(st.integers(0, 9)) == 0:
        args[draw(st.text(string.ascii_lowercase, min_size=1, max_size=6))] = draw(values)
    t = args.get("timeout_s")
    if op == "wait_latest" and isinstance(t, (int, float)) and not isinstance(t, bool) and 0.05 < t <= MAX_WAIT_S:
        args["timeout_s"] = 0.05  # a valid wait parks until its timeout: keep it short (a bad one is refused at once)
    real_token = kind != "token"
    if real_token and op in SPECS and op not in SAFE_VALID:  # (a tenant's valid join would change state too)
        try:
            check_args(op, args)
            valid = True
        except E.HubError:
            valid = False
        if valid and (op in ("join", "annotate") or args.get("wid") in wids):  # would really change state: spoil it
            args[draw(st.sampled_from(_spoilable(op, args)))] = BAD
    return {"id": draw(st.integers(0, 2**32)), "op": op, "args": args}, kind if kind == "tenant" else \
        ("op" if real_token else "token")


def _spoilable(op: str, args: dict) -> list[str]:
    """The arguments of `op` that BAD makes invalid (an annotation's `value` is any plain data: BAD is one)."""
    out = []
    for name in sorted(SPECS[op]):
        try:
            check_args(op, {**args, name: BAD})
        except E.HubError:
            out.append(name)
    return out


class Sender:
    def __init__(self, address: str, token: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        self.token, self.sent = token, 0

    def send(self, frame: dict, who: str) -> dict:
        frame = dict(frame)
        frame["token"] = {"op": self.token, "tenant": TENANT_TOKEN}.get(who, "not-the-token")
        self.sock.send_multipart([b"", msgpack.packb(frame)])
        self.sent += 1
        assert self.sock.poll(10_000), f"no reply to {frame!r}"
        return msgpack.unpackb(self.sock.recv_multipart()[-1], strict_map_key=False)


def test_fuzzed_control_frames_get_typed_errors_and_change_nothing(live):
    wids = [live["trainer"].wid, live["reader"].worker_id]
    sender = Sender(live["address"], live["token"])
    before = snapshot(live)
    seen: dict[str, int] = {}

    @settings(max_examples=CONTROL_FRAMES // 20, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(frames(wids), min_size=20, max_size=20))
    def run(batch):
        for frame, who in batch:
            reply = sender.send(frame, who)
            assert isinstance(reply, dict), reply
            if reply.get("ok"):
                assert frame.get("op") in SAFE_VALID and who != "token", (frame, reply)
                if who == "tenant":  # only what needs no scope: nothing of the operator's models shows
                    assert frame["op"] in ("ping", "stats", "models"), (frame, reply)
                    assert "policy" not in (reply["result"].get("models", {}) if frame["op"] == "stats"
                                            else reply["result"] or {}), (frame, reply)
                continue
            code = reply["error"][0]
            seen[code] = seen.get(code, 0) + 1
            assert code in CODES, (frame, reply)
            if who == "token":
                assert code == "auth", (frame, reply)

    run()
    sender.sock.close()
    assert sender.sent >= CONTROL_FRAMES
    # The frames reached every layer: auth, framing, argument checks, and the state machine behind them.
    assert {"auth", "protocol", "invalid_argument", "version", "shard", "not_joined", "tenant_access"} <= set(seen), seen
    assert snapshot(live) == before
    text = hub_log(live)
    assert "Traceback" not in text and "internal error" not in text, text[-3000:]
    assert live["hub"].poll() is None


# ----------------------------------------------------------------------------- data plane
def data_request(endpoint: str, body: bytes, kind: int) -> tuple[int, str | None]:
    host, port = endpoint.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=15)
    try:
        s.sendall(REQ.pack(MAGIC, 1, kind, 0, len(body)) + body)
        head = s.recv(UNIT.size, socket.MSG_WAITALL)
        assert len(head) == UNIT.size, "the data plane closed without a typed answer (a handler raised?)"
        _, status, n = UNIT.unpack(head)
        if status != 1:
            return status, None
        code, _ = msgpack.unpackb(s.recv(n, socket.MSG_WAITALL))
        return status, code
    finally:
        s.close()


@st.composite
def requests(draw):
    """(what to do with a fresh genuine plan, transport kind)."""
    how = draw(st.sampled_from(["garbage", "map", "units", "replica", "nonce", "proof", "ticket", "thief"]))
    return how, draw(values), draw(st.sampled_from([1, 1, 1, 0, 2, 6, 255])), draw(st.binary(max_size=80))


def test_fuzzed_data_plane_requests_get_typed_errors(live):
    from rlsync.hub.protocol.tickets import ReaderKey

    reader, thief = live["reader"], ReaderKey()
    before = snapshot(live)
    sent = []

    @settings(max_examples=DATA_REQUESTS, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(requests())
    def run(req):
        how, junk, kind, raw = req
        plan = reader.session.rpc.call("fetch", wid=reader.worker_id, model="policy", version=1, shard=[0, 0, 1, 1])
        reader.session.rpc.call("fetch_done", wid=reader.worker_id, fetch_id=plan["fetch_id"], ok=False)
        src = plan["sources"][0]
        ticket, rid, n_units = src["ticket"], src["replica"], len(plan["manifest"]["u"])
        units = [n_units + 5]  # out of range: a request that passes every other check is still refused
        key = reader.session.reader_key
        if how == "garbage":
            body = raw
        elif how == "map":
            body = msgpack.packb(junk if isinstance(junk, dict) else {"req": junk, "proof": raw})
        elif how == "units":
            body = key.sign_request(ticket, rid, junk if isinstance(junk, list) and junk else units)
        elif how == "replica":
            body = key.sign_request(ticket, junk if isinstance(junk, str) else raw.hex(), units)
        elif how == "nonce":
            req = {"ticket": ticket, "replica": rid, "units": units, "nonce": junk}
            signed = msgpack.packb(req)
            body = msgpack.packb({"req": signed, "proof": key._key.sign(signed)})
        elif how == "proof":
            signed = msgpack.unpackb(key.sign_request(ticket, rid, units))["req"]
            body = msgpack.packb({"req": signed, "proof": raw if len(raw) != 64 else bytes(64)})
        elif how == "ticket":
            bad = bytearray(ticket)
            bad[len(raw) % len(bad)] ^= 0x01 if not raw else raw[0] | 1
            body = key.sign_request(bytes(bad), rid, [0])
        else:
            body = thief.sign_request(ticket, rid, [0])
        status, code = data_request(src["endpoint"]["tcp"], body, kind)
        sent.append(code)
        if how == "units" and status == 0:  # junk that happened to be valid unit ids: served, fine
            return
        assert status == 1 and code in CODES, (how, kind, status, code)

    run()
    assert len(sent) >= DATA_REQUESTS
    assert snapshot(live) == before
    got = reader.fetch("policy", 1)  # the worker still serves the genuine reader
    assert got.version == 1 and got.nbytes > 0
    reader.release("policy", 1)
    assert "Traceback" not in hub_log(live)


# ----------------------------------------------------------------------------- resharding layouts, destinations
LAYOUT_EXAMPLES = 600
ints = st.one_of(st.integers(-2, 14), st.sampled_from([True, None, "3", 1.5]))


@st.composite
def layouts(draw):
    """Hand-built layouts of `a` (3, 4) and `b` (5,) over 1-3 ranks: cuts at random points, each field
    now and then spoiled (a wrong type, a gap, an overlap, a piece past the end, another dtype/shape)."""
    from rlsync.hub.reshard.layout import FlatPiece

    def maybe(good, bad):
        return draw(bad) if draw(st.integers(0, 59)) == 0 else good

    world = maybe(draw(st.integers(1, 3)), st.sampled_from([0, -1, True]))
    n = max(world, 1) if isinstance(world, int) else 1
    tensors = (("a", 12, (3, 4)), ("b", 5, (5,)))
    cuts = {name: [0, *sorted(draw(st.lists(st.integers(0, numel), min_size=n - 1, max_size=n - 1))), numel]
            for name, numel, _ in tensors}
    ranks = []
    for r in range(n):
        pieces = []
        for name, numel, shape in tensors:
            bounds = cuts[name]
            start, length = (bounds[r], bounds[r + 1] - bounds[r]) if r + 1 < len(bounds) else (0, numel)
            pieces.append(FlatPiece(maybe(name, st.sampled_from(["", "__rlsync_layout__", 3])),
                                    maybe("float32", st.sampled_from(["bfloat16", "nope", None])),
                                    maybe(shape, st.sampled_from([(4, 3), (numel,), (numel, -1), [numel], (2, 2)])),
                                    maybe(start, ints), maybe(length, ints), maybe(0, st.sampled_from([1, -1, "0"]))))
        if draw(st.integers(0, 19)) == 0:
            pieces = draw(st.permutations(pieces))
        ranks.append(tuple(pieces))
    if draw(st.integers(0, 19)) == 0:
        ranks = ranks[:-1] if draw(st.booleans()) else ranks + ranks[:1]
    return maybe("rows", st.sampled_from(["", None])), world, tuple(ranks)


@st.composite
def destinations(draw):
    from rlsync.hub.reshard.layout import Dest, Slice

    def one():
        name = draw(st.sampled_from(["a"] * 6 + ["b"] * 3 + ["zz"]))
        if draw(st.integers(0, 2)) == 0:
            return Slice(name)
        return Slice(name, draw(st.sampled_from([0, 0, 0, 1, 1, 2, -1, None, "0"])), draw(st.integers(-1, 3)),
                     draw(st.sampled_from([1, 1, 2, 2, 3, 4, 0, -1])))
    n = draw(st.sampled_from([1, 1, 2, 3, 0]))
    names = [f"d{i}" for i in range(n)] if draw(st.integers(0, 5)) else ["x"] * n  # now and then one name twice
    return [Dest(nm, tuple(one() for _ in range(draw(st.sampled_from([1, 1, 1, 1, 2, 3, 0]))))) for nm in names]


def test_fuzzed_layouts_tile_exactly_or_are_refused_typed():
    """A layout either tiles every tensor (each element in exactly one rank's piece, every rank declaring
    one dtype and shape) or its constructor raises LayoutError; any other outcome is a failure. A plan of
    random destinations over a valid layout fills each destination element exactly once, or LayoutError."""
    from rlsync.hub.reshard.layout import ShardedLayout, plan

    seen = {"ok": 0, "refused": 0, "plans": 0}

    @settings(max_examples=LAYOUT_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(layouts(), destinations())
    def run(lay, dests):
        kind, world, ranks = lay
        try:
            layout = ShardedLayout(kind, world, ranks)
        except E.LayoutError:
            seen["refused"] += 1
            return
        seen["ok"] += 1
        for name, numel in (("a", 12), ("b", 5)):
            cover = [0] * numel
            decl = {(p.shape, p.dtype) for r in layout.ranks for p in r if p.name == name}
            assert len(decl) == 1, (name, layout)
            for r in layout.ranks:
                for p in r:
                    if p.name == name:
                        for i in range(p.start, p.start + p.length):
                            cover[i] += 1
            assert cover == [1] * numel, (name, cover, layout)
        try:
            p = plan(layout, dests)
        except E.LayoutError:
            return
        seen["plans"] += 1
        for d, shape in p.shapes.items():
            n = 1
            for x in shape:
                n *= x
            cover = [0] * n
            for c in p.copies:
                if c.dst == d:
                    for _, o, k in c.runs():
                        for i in range(o, o + k):
                            cover[i] += 1
            assert cover == [1] * n, (d, cover, dests)

    run()
    assert seen["ok"] > 0 and seen["refused"] > 0 and seen["plans"] > 0, seen
