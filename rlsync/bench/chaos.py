"""`python -m rlsync.bench chaos`: a seeded schedule of kills against real rlsync processes.

One hub process, one trainer publishing a new version every `--period` seconds (releasing the last
one and overwriting its buffers in place, as an optimizer would), a seed worker following the
latest version, and a pool of readers fetching `latest` in a loop into the same buffers. A seeded
RNG picks victims: readers mid-fetch (which are also sources and relays for each other) killed
with `kill -9` or leaving with notice, the seed worker, and the hub itself (kill -9, then restarted
on the same address and journal). Victims are replaced.

Every fetched version is checked against the bytes the trainer published for it (the trainer's
model for version v is a pure function of v). Counted: kills, fetches ok, fetches failed with a
typed error, fetches failed untyped, torn (bytes that differ from the version's: must be 0), lost
(`VersionLostError` although the trainer, never killed, held or had handed off the version: must be
0), and failover seconds (hub kill → every live worker re-registered with the new hub).
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time

from . import register_scenario


def run_chaos(kills: int = 30, hub_kills: int = 2, seed: int = 0, readers: int = 4, size_mb: float = 2.0,
              period_s: float = 1.0, interval_s: float = 1.5, max_seconds: float = 600.0) -> dict:
    import socket

    from rlsync.hub import ClientConfig, HubClient, ManifestConfig
    from rlsync.hub.dataplane import DataPlaneConfig
    from rlsync.hub.demo import start_hub_process
    from rlsync.hub.procs import WorkerProcess, close_all, digest, make_model

    rng = random.Random(seed)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = tempfile.mkdtemp(prefix="rlsync-chaos-")
    hub, address, token = start_hub_process(tmp, port=port, worker_timeout_s=3.0)
    cfg = ClientConfig(dataplane=DataPlaneConfig(io_timeout_s=3.0, relay_wait_s=10.0), hub_deadline_s=20.0,
                       manifest=ManifestConfig(chunk_bytes=128 << 10), heartbeat_s=0.5, transport="tcp-py")
    expected: dict[int, str] = {}
    counts = {"kills": 0, "hub_kills": 0, "reader_kills": 0, "notice_leaves": 0, "seed_kills": 0,
              "fetches_ok": 0, "fetches_failed_typed": 0, "fetches_failed_untyped": 0, "torn": 0, "lost": 0,
              "publishes": 0, "publish_errors": 0}
    errors: dict[str, int] = {}
    failovers: list[float] = []
    fetch_seconds: list[float] = []
    workers: list[WorkerProcess] = []
    n = 0

    spares: list[WorkerProcess] = []

    def spawn(name: str, **join) -> WorkerProcess:
        """A new worker: a spare process started earlier (its imports are done), joined now."""
        nonlocal n
        n += 1
        w = spares.pop(0) if spares else WorkerProcess(address, token, cfg, name=f"{name}{n}")
        workers.append(w)
        spares.append(WorkerProcess(address, token, cfg, name=f"spare{n}"))  # warms up while we wait
        w.name = f"{name}{n}"
        w.join(**join)
        return w

    def start_reader() -> WorkerProcess:
        w = spawn("reader", host=f"node{rng.randrange(4)}")
        w.call("fetch_loop", model="policy", pause_s=0.05)
        return w

    def collect(w: WorkerProcess) -> None:
        try:
            results = w.call("loop_results", timeout=30)
        except Exception:  # noqa: BLE001 - a dying worker's last results are gone with it
            return
        for r in results:
            if r["ok"]:
                want = expected.get(r["version"])
                if want is None:
                    want = expected[r["version"]] = digest(make_model(size_mb, seed=r["version"]))
                if r["digest"] == want:
                    counts["fetches_ok"] += 1
                else:
                    counts["torn"] += 1
            else:
                key = "fetches_failed_typed" if r["typed"] else "fetches_failed_untyped"
                counts[key] += 1
                errors[r["error"]] = errors.get(r["error"], 0) + 1
                if r["error"] == "VersionLostError":
                    counts["lost"] += 1
            fetch_seconds.append(r["seconds"])

    t_start = time.monotonic()
    try:
        trainer = spawn("trainer", host="trainer")
        trainer.call("publish_loop", model="policy", size_mb=size_mb, period_s=period_s)
        seed_w = spawn("seed", host="seedhost", role="seed", follow=True)
        pool = [start_reader() for _ in range(readers)]
        time.sleep(2.0)
        plan = ["hub"] * hub_kills + [rng.choice(["reader", "reader", "reader", "notice", "seed"])
                                      for _ in range(max(0, kills - hub_kills))]
        rng.shuffle(plan)
        for victim in plan:
            if time.monotonic() - t_start > max_seconds:
                break
            time.sleep(interval_s * rng.uniform(0.5, 1.5))
            for w in pool:
                collect(w)
            if victim == "hub":
                t0 = time.monotonic()
                hub.kill()
                hub.wait()
                hub, _, _ = start_hub_process(tmp, port=port, worker_timeout_s=3.0)
                probe = HubClient(address, token)
                live = 2 + len(pool)
                while probe.stats()["workers"] < live and time.monotonic() - t0 < 30:
                    time.sleep(0.05)
                failovers.append(time.monotonic() - t0)
                counts["hub_kills"] += 1
            elif victim == "seed":
                seed_w.kill()
                seed_w = spawn("seed", host="seedhost", role="seed", follow=True)
                counts["seed_kills"] += 1
            else:
                i = rng.randrange(len(pool))
                w = pool[i]
                if victim == "notice":
                    collect(w)
                    w.call("stop_loop")
                    w.call("leave", deadline_s=10.0)
                    w.close()
                    counts["notice_leaves"] += 1
                else:
                    w.kill()  # kill -9, most likely mid-fetch (and mid-serve to other readers)
                    counts["reader_kills"] += 1
                pool[i] = start_reader()
            counts["kills"] += 1
        time.sleep(2.0)
        for w in pool:
            w.call("stop_loop")
            collect(w)
        trainer.call("stop_loop")
        for r in trainer.call("loop_results"):
            counts["publishes" if r["ok"] else "publish_errors"] += 1
            if not r["ok"]:
                errors["publish:" + r["error"]] = errors.get("publish:" + r["error"], 0) + 1
    finally:
        close_all(workers + spares)
        hub.kill()
        hub.wait()
    out = dict(counts)
    out.update(errors=errors, seconds=time.monotonic() - t_start, seed=seed,
               failover_seconds=failovers,
               failover_seconds_max=max(failovers) if failovers else None,
               failover_seconds_median=statistics.median(failovers) if failovers else None,
               fetch_seconds_max=max(fetch_seconds) if fetch_seconds else None)
    return out


@register_scenario("chaos")
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsync.bench chaos", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=200)
    p.add_argument("--hub-kills", type=int, default=None, help="default: kills // 10")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--readers", type=int, default=4)
    p.add_argument("--size-mb", type=float, default=2.0)
    p.add_argument("--interval", type=float, default=1.5, help="mean seconds between kills")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    res = run_chaos(a.kills, a.hub_kills if a.hub_kills is not None else max(2, a.kills // 10), a.seed,
                    a.readers, a.size_mb, interval_s=a.interval, max_seconds=max(600.0, a.kills * 5.0))
    for k in ("kills", "hub_kills", "reader_kills", "notice_leaves", "seed_kills", "fetches_ok",
              "fetches_failed_typed", "fetches_failed_untyped", "torn", "lost", "publishes",
              "failover_seconds_max", "failover_seconds_median", "fetch_seconds_max", "seconds"):
        v = res[k]
        print(f"{k:26s} {v:.2f}" if isinstance(v, float) else f"{k:26s} {v}")
    print(f"{'errors':26s} {res['errors']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0 if res["torn"] == 0 and res["lost"] == 0 else 1
