"""Worker processes driven over a pipe: used by `python -m rlsync.hub demo` and the hub's tests.

Each `WorkerProcess` is a real OS process (forked from a fork server that imported torch) with its own `HubClient`, data-plane server
and tensors. The parent sends it commands (join, publish, fetch, release, overwrite, ...) and gets
plain-data answers (digests of tensor bytes by `fakes.digest`, who served what), so tests can check bit-for-bit
equality across processes without shipping weights back.
"""
from __future__ import annotations

import multiprocessing as mp
import threading
import time
import traceback

import torch

from rlsync.hub.tools.fakes import digest, make_model


def _worker_main(conn, address: str, token: str, client_cfg) -> None:
    from rlsync.hub.logs import setup_logging
    from rlsync.hub.client import HubClient
    from rlsync.hub.model.location import Location
    from rlsync.hub.model.shard import Shard

    setup_logging("WARNING")
    client = HubClient(address, token, config=client_cfg)
    bufs: dict[str, dict[str, torch.Tensor]] = {}
    bg: dict[str, threading.Thread] = {}
    results: dict[str, object] = {}

    loop: dict = {"results": []}
    loop_lock = threading.Condition()

    def record(entry: dict) -> None:
        with loop_lock:
            loop["results"].append(entry)
            loop_lock.notify_all()

    def fetch_loop(kw: dict) -> None:
        """Fetch `latest` again and again into the same buffers (each fetch releases the last)."""
        from rlsync.hub.errors import HubError
        into = None
        while not loop["stop"].is_set():
            t0 = time.time()
            try:
                r = client.fetch(kw["model"], "latest", into=into)
                into = r.tensors
                if r.nbytes == 0:  # already held latest: nothing moved, nothing to check
                    loop["stop"].wait(kw.get("pause_s", 0.05))
                    continue
                record({"ok": True, "version": r.version, "digest": digest(r.tensors), "seconds": time.time() - t0})
            except HubError as e:
                record({"ok": False, "error": type(e).__name__, "message": str(e)[:200], "typed": True,
                        "seconds": time.time() - t0})
            except Exception as e:  # noqa: BLE001 - counted as an untyped failure
                record({"ok": False, "error": type(e).__name__, "message": str(e)[:200], "typed": False,
                        "seconds": time.time() - t0})
            loop["stop"].wait(kw.get("pause_s", 0.05))

    def refetch_loop(kw: dict) -> None:
        """Fetch one version again and again, releasing it after each read: a reader that keeps a source busy."""
        from rlsync.hub.errors import HubError
        while not loop["stop"].is_set():
            t0 = time.time()
            try:
                r = client.fetch(kw["model"], kw["version"])
                client.release(kw["model"], r.version)
                record({"ok": True, "nbytes": r.nbytes, "started": t0, "finished": time.time()})
            except HubError as e:
                record({"ok": False, "error": type(e).__name__, "message": str(e)[:200]})
                loop["stop"].wait(0.05)

    def publish_loop(kw: dict) -> None:
        """A trainer: every period, release the last version, overwrite the buffers in place, publish."""
        from rlsync.hub.errors import HubError
        v = kw.get("start", 1)
        live, published = None, None  # the buffers, and the version they hold that is published
        while not loop["stop"].is_set():
            try:
                if live is None:
                    live = make_model(kw["size_mb"], seed=v).tensors
                elif published is not None:  # (after a failed publish the buffers already hold v)
                    client.release(kw["model"], published)
                    published = None
                    fresh = make_model(kw["size_mb"], seed=v).tensors
                    for name, t in live.items():   # the optimizer step: in place, after release
                        t.copy_(fresh[name])
                client.publish(kw["model"], v, live)
                published = v
                record({"ok": True, "version": v, "time": time.time()})
                v += 1
            except HubError as e:
                record({"ok": False, "error": type(e).__name__, "message": str(e)[:200], "version": v})
            loop["stop"].wait(kw.get("period_s", 1.0))

    def run(cmd: str, kw: dict):
        if cmd == "join":
            return client.join(Location(**kw.get("location", {})), kw.get("name", "worker"),
                               role=kw.get("role", "worker"), follow=kw.get("follow", False))
        if cmd == "publish":
            t = make_model(kw["size_mb"], kw["seed"]).tensors
            bufs[kw.get("buf", "main")] = t
            if kw.get("delta"):  # its delta (or, the first time, the publisher's copy to encode the next from)
                client.publish_delta(kw["model"], kw["version"], t, Shard(*kw.get("shard", (0, 0, 1, 1))))
            committed = client.publish(kw["model"], kw["version"], t, Shard(*kw.get("shard", (0, 0, 1, 1))))
            return {"committed": committed, "digest": digest(t)}
        if cmd == "fetch":
            into = bufs.get(kw["into"]) if kw.get("into") else None
            t0 = time.time()
            r = client.fetch(kw["model"], kw.get("version", "latest"), into=into,
                             shard=Shard(*kw.get("shard", (0, 0, 1, 1))), group=kw.get("group"))
            fetched = time.time()
            bufs[kw.get("buf", "main")] = r.tensors
            return {"version": r.version, "digest": digest(r.tensors), "bytes_by_source": r.bytes_by_source,
                    "transports": r.transports, "seconds": r.seconds, "nbytes": r.nbytes,
                    "started": t0, "finished": fetched}
        if cmd == "publish_step":  # a trainer step: v = a copy of `from_buf` with every `stride`-th element +1
            if kw.get("from_buf") is None:  # (the first: a fresh model); its delta published first, then v
                t = make_model(kw["size_mb"], kw["seed"]).tensors
            else:
                t = {n: x.clone() for n, x in bufs[kw["from_buf"]].items()}
                for x in t.values():
                    x.view(-1)[::kw.get("stride", 64)] += 1.0
            bufs[kw["buf"]] = t
            info = client.publish_delta(kw["model"], kw["version"], t)
            return {"committed": client.publish(kw["model"], kw["version"], t), "digest": digest(t), **info}
        if cmd == "fetch_delta":
            r = client.fetch_delta(kw["model"], kw.get("version", "latest"), into=bufs[kw["buf"]])
            return {"version": r.version, "mode": r.mode, "digest": digest(r.tensors), "nbytes": r.nbytes,
                    "bytes_by_source": r.bytes_by_source}
        if cmd == "release":
            client.release(kw["model"], kw["version"], Shard(*kw.get("shard", (0, 0, 1, 1))))
            return {"finished": time.time()}
        if cmd == "overwrite":
            for t in bufs[kw.get("buf", "main")].values():
                t.fill_(kw.get("value", 7.0))
            return digest(bufs[kw.get("buf", "main")])
        if cmd == "fetch_loop":
            loop["stop"] = threading.Event()
            loop["thread"] = threading.Thread(target=fetch_loop, args=(kw,), daemon=True)
            loop["thread"].start()
            return True
        if cmd == "refetch_loop":
            loop["stop"] = threading.Event()
            loop["thread"] = threading.Thread(target=refetch_loop, args=(kw,), daemon=True)
            loop["thread"].start()
            return True
        if cmd == "shares":  # bytes this worker's data plane served per tenant (hub/dataplane/shares.py)
            return client.session.data.shares.snapshot()
        if cmd == "publish_loop":
            loop["stop"] = threading.Event()
            loop["thread"] = threading.Thread(target=publish_loop, args=(kw,), daemon=True)
            loop["thread"].start()
            return True
        if cmd == "loop_results":
            with loop_lock:
                out, loop["results"][:] = list(loop["results"]), []
            return out
        if cmd == "wait_results":  # block until the loop recorded >= n results not yet collected
            end = time.monotonic() + kw.get("within", 60.0)
            with loop_lock:
                while len(loop["results"]) < kw["n"] and (left := end - time.monotonic()) > 0:
                    loop_lock.wait(left)
                return len(loop["results"])
        if cmd == "joins":  # how many times this client re-joined the hub (restart, expiry)
            return client.session.joins
        if cmd == "wait_rejoin":
            # Block until the client re-joined (and re-registered what it holds) more than `after`
            # times; returns when it finished (time.monotonic(): one clock for every process here).
            end = time.monotonic() + kw.get("within", 60.0)
            while client.session.joins <= kw["after"]:
                if time.monotonic() > end:
                    return None
                time.sleep(0.002)  # polls a counter the heartbeat thread bumps; the time comes from it
            return client.rejoined_at
        if cmd == "stop_loop":
            if "stop" in loop:
                loop["stop"].set()
                loop["thread"].join(kw.get("timeout", 60))
            return True
        if cmd == "served":
            return {rep.id: {"units": rep.units_served, "bytes": rep.bytes_served, "readers": rep.readers}
                    for rep in client.store.all()}
        if cmd == "held":
            return client.held()
        if cmd == "leave":
            client.leave(deadline_s=kw.get("deadline_s", 0.0))
            return True
        raise ValueError(f"unknown command {cmd}")

    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        tag, cmd, kw, background = msg
        if cmd == "exit":
            conn.send((tag, True, None))
            break
        if cmd == "wait":
            bg[kw["tag"]].join()
            ok, val = results.pop(kw["tag"])
            conn.send((tag, ok, val))
            continue

        def work(tag=tag, cmd=cmd, kw=kw, background=background):
            try:
                out = (True, run(cmd, kw))
            except Exception as e:  # noqa: BLE001 - shipped to the parent as a typed error
                out = (False, (type(e).__name__, str(e), traceback.format_exc()))
            if background:
                results[tag] = out
            else:
                conn.send((tag, *out))

        if background:
            bg[tag] = threading.Thread(target=work, daemon=True)
            bg[tag].start()
            conn.send((tag, True, "started"))
        else:
            work()
    try:
        client.leave()
    except Exception:
        pass


class WorkerError(Exception):
    def __init__(self, kind: str, message: str, tb: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind, self.message, self.tb = kind, message, tb


_PRELOAD = ["__main__", "torch", "rlsync.hub.client", "rlsync.hub.tools.procs"]  # __main__: not re-run per worker
_ctx = None


def _context():
    """Workers fork from a server process that imported torch and the hub client once: a new worker
    starts in tens of milliseconds instead of a fresh interpreter's seconds of imports (the chaos
    bench replaces hundreds of killed workers; a loaded machine made each start take 5-70 s). The
    fork server is started once per parent process, with the parent's environment at that time."""
    global _ctx
    if _ctx is None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        _ctx = ctx
    return _ctx


class WorkerProcess:
    def __init__(self, address: str, token: str, client_cfg=None, name: str = "worker") -> None:
        ctx = _context()
        self._conn, child = ctx.Pipe()
        self.name = name
        self.proc = ctx.Process(target=_worker_main, args=(child, address, token, client_cfg),
                                name=name, daemon=True)
        self.proc.start()
        self._n = 0
        self.wid: str | None = None

    def call(self, cmd: str, timeout: float = 120, **kw):
        self._n += 1
        self._conn.send((self._n, cmd, kw, False))
        return self._answer(timeout)

    def start(self, cmd: str, **kw) -> str:
        """Run a command in the background in the worker; `wait(tag)` gets its answer."""
        self._n += 1
        tag = f"bg{self._n}"
        self._conn.send((tag, cmd, kw, True))
        self._answer(30)
        return tag

    def wait(self, tag: str, timeout: float = 120):
        self._n += 1
        self._conn.send((self._n, "wait", {"tag": tag}, False))
        return self._answer(timeout)

    def _answer(self, timeout: float):
        if not self._conn.poll(timeout):
            raise TimeoutError(f"{self.name} did not answer within {timeout}s")
        _, ok, val = self._conn.recv()
        if not ok:
            raise WorkerError(*val)
        return val

    def join(self, role: str = "worker", follow: bool = False, **location) -> str:
        self.wid = self.call("join", location=location, name=self.name, role=role, follow=follow)
        return self.wid

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(5)

    def close(self) -> None:
        close_all([self])


def close_all(workers: list[WorkerProcess], timeout: float = 10.0) -> None:
    """Ask every worker to leave and exit (in parallel), then kill whatever is still alive."""
    for w in workers:
        if w.proc.is_alive():
            try:
                w._conn.send((0, "exit", {}, False))
            except (OSError, BrokenPipeError):
                pass
    deadline = time.monotonic() + timeout
    for w in workers:
        w.proc.join(max(0.0, deadline - time.monotonic()))
        if w.proc.is_alive():
            w.kill()
