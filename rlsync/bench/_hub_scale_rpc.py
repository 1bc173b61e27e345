"""hub_scale's real-server phases: `python -m rlsync.hub serve` driven by lightweight client processes.

Each client process (this module's `__main__`) holds a few DEALER sockets and speaks the hub's wire
protocol directly (no HubClient: no data plane, no heartbeat thread), keeping `window` requests in
flight per socket for the workers it plays. Phases, in step across processes (the parent says go on
stdin, each process answers one JSON line): join its workers; heartbeats for S seconds; fetch plans
(fetch latest, then fetch_done not ok, so the state stays put) for S seconds. Loopback only; every
phase is bounded in time.
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
import time

import msgpack
import zmq

from rlsync.bench.hub_scale_fixtures import big_manifest, location

MODEL = "policy"
_MORE = int(zmq.SNDMORE)


def _pack(op: str, rid: int, token: str, args: dict, raw: dict | None = None) -> bytes:
    """A request as `RpcChannel` packs it. `raw`: argument values already packed (the same bytes)."""
    if raw:
        from rlsync.hub.server.load import packed_map
        return packed_map({"id": rid, "op": op, "token": token}, {"args": packed_map(args, raw)})
    return msgpack.packb({"id": rid, "op": op, "token": token, "args": args}, use_bin_type=True)


def _location(i: int) -> dict:
    return location(i).to_wire()


def _peek(data: bytes) -> dict:
    """A reply's id, ok and the leading scalars of its result map, without decoding the rest (a plan's
    61 KB manifest): the clients share the hub's 2 cores, so they must cost it as little as possible."""
    u = msgpack.Unpacker(raw=False, strict_map_key=False)
    u.feed(data)
    out: dict = {}
    for _ in range(u.read_map_header()):
        k = u.unpack()
        if k != "result":
            out[k] = u.unpack()
            continue
        try:
            n = u.read_map_header()
        except msgpack.UnpackValueError:  # not a map (heartbeats answer maps, fetch_done True)
            out[k] = u.unpack()
            continue
        res = out[k] = {}
        for _ in range(n):
            rk = u.unpack()
            if rk in ("sources", "manifest", "drops", "tasks"):
                u.skip()
            else:
                res[rk] = u.unpack()
    return out


class Driver:
    """`workers` simulated workers over `sockets` DEALER sockets, `window` requests in flight per socket."""

    def __init__(self, address: str, token: str, first: int, workers: int, sockets: int, window: int) -> None:
        self.ctx = zmq.Context()
        self.socks = []
        for _ in range(sockets):
            s = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(address)
            self.socks.append(s)
        self.token, self.first, self.n, self.window = token, first, workers, window
        self.wids: list[str | None] = [None] * workers
        self.ids = itertools.count(1)

    def run(self, make, seconds: float, total: int | None = None) -> dict:
        """Send `make(i, state)` requests (i: worker index) until `seconds` pass or `total` replies came.
        `make` returns (op, args) or None (that worker is done); replies go to `make.reply`."""
        poller = zmq.Poller()
        for s in self.socks:
            poller.register(s, zmq.POLLIN)
        pending: dict[int, int] = {}
        order = itertools.cycle(range(self.n))
        replies = errors = 0
        t0 = time.perf_counter()
        end = t0 + seconds

        def send(sock) -> bool:
            for _ in range(self.n):
                i = next(order)
                req = make(i)
                if req is not None:
                    rid = next(self.ids)
                    pending[rid] = i
                    sock.send(b"", _MORE)  # RpcChannel's frames, without send_multipart's per-call cost
                    sock.send(_pack(req[0], rid, self.token, *req[1:]), 0)
                    return True
            return False

        for s in self.socks:
            for _ in range(self.window):
                send(s)
        while pending and time.perf_counter() < end and (total is None or replies < total):
            for s, _ in poller.poll(100):
                while True:
                    try:
                        frames = s.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    msg = _peek(frames[-1])
                    i = pending.pop(msg["id"], None)
                    if i is None:
                        continue
                    replies += 1
                    if not msg.get("ok"):
                        errors += 1
                    make.reply(i, msg)
                    if total is None or replies + len(pending) < total:
                        send(s)
        return {"replies": replies, "errors": errors, "seconds": time.perf_counter() - t0}


class Join:
    def __init__(self, d: Driver) -> None:
        self.d, self.sent = d, set()

    def __call__(self, i):
        if i in self.sent:
            return None
        self.sent.add(i)
        g = self.d.first + i
        return "join", {"name": f"w{g}", "location": _location(g),
                        "endpoint": {"tcp": f"127.0.0.1:{7000 + g % 50000}", "reader_key": g.to_bytes(32, "little")}}

    def reply(self, i, msg) -> None:
        if msg.get("ok"):
            self.d.wids[i] = msg["result"]["wid"]


class Heartbeat:
    def __init__(self, d: Driver) -> None:
        self.d = d

    def __call__(self, i):
        return ("heartbeat", {"wid": self.d.wids[i]}) if self.d.wids[i] else None

    def reply(self, i, msg) -> None:
        pass


class FetchCycle:
    """fetch latest, then fetch_done(ok=False) of that plan: one plan per two RPCs, state unchanged.
    Like a `HubClient`, each worker names the manifest it was sent (`have_manifests`): its first plan
    carries the manifest, the later ones only its digest."""

    def __init__(self, d: Driver) -> None:
        self.d, self.open, self.busy, self.plans, self.have = d, {}, set(), 0, {}

    def __call__(self, i):
        if i in self.busy or not self.d.wids[i]:
            return None
        self.busy.add(i)
        w = self.d.wids[i]
        if i in self.open:
            return "fetch_done", {"wid": w, "fetch_id": self.open.pop(i), "ok": False}
        return "fetch", {"wid": w, "model": MODEL, "version": "latest", "shard": [0, 0, 1, 1],
                         "have_manifests": self.have.get(i, [])}

    def reply(self, i, msg) -> None:
        self.busy.discard(i)
        if msg.get("ok") and isinstance(msg["result"], dict) and msg["result"].get("fetch_id"):
            self.open[i] = msg["result"]["fetch_id"]
            self.have[i] = [msg["result"]["manifest_digest"]]
            self.plans += 1


class Storm:
    """After a hub restart: every worker joins again under its id, then re-registers a full copy of v1."""

    def __init__(self, d: Driver, manifest_wire: dict) -> None:
        # Packed once: the clients share the hub's 2 cores, and packing 61 KB per re-registration took
        # as much CPU as the hub spent (the bytes the hub gets are the same).
        self.d, self.raw, self.stage, self.registered = d, {"manifest": msgpack.packb(manifest_wire)}, {}, 0

    def __call__(self, i):
        st = self.stage.get(i, 0)
        if st in (1, 3) or st >= 4 or not self.d.wids[i]:
            return None  # waiting for its answer, or done
        self.stage[i] = st + 1
        g, w = self.d.first + i, self.d.wids[i]
        if st == 0:
            return "join", {"name": f"w{g}", "location": _location(g), "worker_id": w,
                            "endpoint": {"tcp": f"127.0.0.1:{7000 + g % 50000}", "reader_key": g.to_bytes(32, "little")}}
        return "register", {"wid": w, "model": MODEL, "version": 1, "shard": [0, 0, 1, 1], "slot": "live"}, self.raw

    def reply(self, i, msg) -> None:
        self.stage[i] += 1
        if self.stage[i] == 4 and msg.get("ok"):
            self.registered += 1


def client_main(argv: list[str]) -> int:
    address, token, first, n, sockets, window, seconds = argv[0], argv[1], *map(int, argv[2:6]), float(argv[6])
    units = int(argv[7])
    d = Driver(address, token, first, n, sockets, window)
    for line in sys.stdin:
        phase = line.strip()
        if phase == "join":
            j = Join(d)
            r = d.run(j, seconds * 20, total=n)
            r["joined"] = sum(1 for w in d.wids if w)
        elif phase == "heartbeat":
            r = d.run(Heartbeat(d), seconds)
        elif phase == "fetch":
            f = FetchCycle(d)
            r = d.run(f, seconds)
            r["plans"] = f.plans
        elif phase == "storm":
            s = Storm(d, big_manifest(units).to_wire())
            r = d.run(s, seconds * 20, total=2 * n)
            r["registered"] = s.registered
        else:
            break
        print(json.dumps(r), flush=True)
    d.ctx.destroy(linger=0)
    return 0


def _proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _load_stats(rpc) -> dict:
    """The hub's own latency figures (what a run logs as hub/plan_ms ...), where the hub reports them."""
    s = rpc.call("stats")
    return {k: s[k] for k in ("plan_ms", "plan_ms_p99", "plans_timed", "rpc_per_s", "heartbeat_lag_ms") if k in s}


def _serve(tmp: str, port: int) -> tuple[subprocess.Popen, str]:
    hub = subprocess.Popen([sys.executable, "-m", "rlsync.hub", "serve", "--host", "127.0.0.1", "--port", str(port),
                            "--token-file", os.path.join(tmp, "tok"), "--journal", os.path.join(tmp, "j.db"),
                            "--worker-timeout", "3600"], stdout=subprocess.PIPE, text=True,
                           stderr=open(os.path.join(tmp, "hub.log"), "a"))
    return hub, hub.stdout.readline().split("listening on ")[1].strip()


def _stop(hub: subprocess.Popen) -> None:
    hub.terminate()
    try:
        hub.wait(timeout=30)
    except subprocess.TimeoutExpired:
        hub.kill()
        hub.wait()


def rpc_throughput(workers: int, clients: int, seconds: float, manifest, budget_s: float) -> dict:
    """Start a hub, publish `manifest` as v1, then run the phases; hub CPU and RSS from /proc. Last, a
    restart on the same journal and port, and every worker re-joining and re-registering v1 (the storm)."""
    from rlsync.hub.protocol.rpc import RpcChannel
    tmp = tempfile.mkdtemp(prefix="rlsync-hubscale-")
    tok_file = os.path.join(tmp, "tok")
    procs = []
    hub, address = _serve(tmp, 0)
    try:
        token = open(tok_file).read().strip()
        rpc = RpcChannel(address, token, timeout_s=30.0)
        me = rpc.call("join", name="trainer", location={"dc": "dc0", "rack": "r0", "host": "trainer"},
                      endpoint={"tcp": "127.0.0.1:6999", "reader_key": b"t" * 32})["wid"]
        rpc.call("publish", wid=me, model=MODEL, version=1, shard=[0, 0, 1, 1], manifest=manifest.to_wire())
        rss0 = _rss_kb(hub.pid)
        per = workers // clients
        sockets, window = 32, 4
        for c in range(clients):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "rlsync.bench._hub_scale_rpc", address, token, str(c * per), str(per),
                 str(sockets), str(window), str(seconds), str(len(manifest.units))], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        out: dict = {"workers": per * clients, "clients": clients, "connections": clients * sockets + 1}

        def phase(name: str) -> tuple[list[dict], float, float]:
            """Replies, wall time, hub CPU; the client processes' CPU goes to out[name + '_client_cpu_s']
            (they share the 2 cores with the hub: wall figures carry their cost too)."""
            c0, t0 = _proc_cpu_s(hub.pid), time.perf_counter()
            k0 = sum(_proc_cpu_s(p.pid) for p in procs)
            for p in procs:
                p.stdin.write(name + "\n")
                p.stdin.flush()
            rs = [json.loads(p.stdout.readline()) for p in procs]
            wall, cpu = time.perf_counter() - t0, _proc_cpu_s(hub.pid) - c0
            out[f"{name}_client_cpu_s"] = sum(_proc_cpu_s(p.pid) for p in procs) - k0
            out[f"{name}_hub_cpu_s"], out[f"{name}_wall_s"] = cpu, wall
            return rs, wall, cpu

        rs, wall, cpu = phase("join")
        out["joined"] = sum(r["joined"] for r in rs)
        out["join_per_s"] = out["joined"] / wall
        rss_joined = _rss_kb(hub.pid)
        # Connections and joined workers together (ZeroMQ allocates a connection's buffers on first use).
        out["rss_per_worker_kb"] = (rss_joined - rss0) / max(1, out["joined"])
        out["rss_kb"] = rss_joined
        rs, wall, cpu = phase("heartbeat")
        out["heartbeat_per_s"] = sum(r["replies"] for r in rs) / wall
        out["heartbeat_errors"] = sum(r["errors"] for r in rs)
        out["hub_cpu_share"] = cpu / wall
        out["heartbeat_per_hub_cpu_s"] = sum(r["replies"] for r in rs) / max(cpu, 1e-9)
        out["hub_stats_after_heartbeats"] = _load_stats(rpc)
        rs, wall, cpu = phase("fetch")
        out["fetch_rpc_per_s"] = sum(r["replies"] for r in rs) / wall
        out["rpc_per_s"] = min(out["heartbeat_per_s"], out["fetch_rpc_per_s"])
        out["fetch_plans_per_s"] = sum(r["plans"] for r in rs) / wall
        out["fetch_errors"] = sum(r["errors"] for r in rs)
        out["fetch_hub_cpu_share"] = cpu / wall
        out["fetch_rpc_per_hub_cpu_s"] = sum(r["replies"] for r in rs) / max(cpu, 1e-9)
        out["hub_stats_after_fetches"] = _load_stats(rpc)
        rpc.close()
        _stop(hub)  # failover: the same journal and port; the clients' sockets reconnect by themselves
        hub, _ = _serve(tmp, int(address.rsplit(":", 1)[1]))
        rs, wall, cpu = phase("storm")
        out["storm_registered"] = sum(r["registered"] for r in rs)
        out["storm_s"] = wall if out["storm_registered"] == out["joined"] else None
        out["storm_elapsed_s"], out["storm_hub_cpu_s"] = wall, cpu
        return out
    finally:
        for p in procs:
            try:
                p.stdin.close()
            except OSError:
                pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        _stop(hub)


if __name__ == "__main__":
    sys.exit(client_main(sys.argv[1:]))
