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
0), and failover seconds: hub kill → every live worker re-registered with the new hub, and hub kill →
a probe reader's fetch of `latest` succeeded (kill-to-successful-fetch).

`--seeds N` (seeds 1..N) or `--seeds 3,7,9` runs one schedule per seed back to back, on a fresh
cluster each, and prints a row per seed and a total; the exit status is 0 only if no seed tore,
lost or failed untyped.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time

from . import register_scenario


def run_chaos(kills: int = 30, hub_kills: int = 2, seed: int = 0, readers: int = 4, size_mb: float = 2.0,
              period_s: float = 1.0, interval_s: float = 1.5, max_seconds: float = 600.0,
              settle_s: float = 2.0) -> dict:
    """One seeded schedule on a fresh cluster. `settle_s`: fetching before the first kill and after the last."""
    import socket

    from rlsync.hub import ClientConfig, HubClient, Location, ManifestConfig
    from rlsync.hub.errors import HubError
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
    samples: dict[str, list[str]] = {}  # a few messages per failure kind, to say why
    failovers: list[float] = []
    fetch_failovers: list[float] = []
    restarts: list[float] = []      # hub kill -> the restarted hub listens
    after_listen: list[float] = []  # the restarted hub listens -> the probe's fetch succeeded
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
        if not spares:
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
                if len(samples.setdefault(r["error"], [])) < 3:
                    samples[r["error"]].append(r.get("message", ""))
                if r["error"] == "VersionLostError":
                    counts["lost"] += 1
            fetch_seconds.append(r["seconds"])

    t_start = time.monotonic()
    probe = None
    try:
        trainer = spawn("trainer", host="trainer")
        trainer.call("publish_loop", model="policy", size_mb=size_mb, period_s=period_s)
        seed_w = spawn("seed", host="seedhost", role="seed", follow=True)
        pool = [start_reader() for _ in range(readers)]
        # The failover probe: a reader that fetches only right after a hub restart (then releases).
        probe = HubClient(address, token, config=cfg)
        probe.join(Location(host="probe"), "probe")
        time.sleep(settle_s)
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
                t_listen = time.monotonic()  # the new hub process listens (its start-up is the machine's)
                restarts.append(t_listen - t0)
                # Kill-to-successful-fetch: the probe's fetch waits (parked by the hub) until a holder
                # of `latest` has re-registered; then the time until every live worker is back.
                try:
                    got = probe.fetch("policy", "latest")
                    fetch_failovers.append(time.monotonic() - t0)
                    after_listen.append(time.monotonic() - t_listen)
                    if digest(got.tensors) != expected.setdefault(got.version, digest(make_model(size_mb, got.version))):
                        counts["torn"] += 1
                    probe.release("policy", got.version)
                except HubError as e:
                    key = "probe:" + type(e).__name__
                    errors[key] = errors.get(key, 0) + 1
                    samples.setdefault(key, []).append(str(e)[:200])
                live = 3 + len(pool)
                while probe.stats()["workers"] < live and time.monotonic() - t0 < 30:
                    time.sleep(0.02)
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
        time.sleep(settle_s)
        for w in pool:
            w.call("stop_loop")
            collect(w)
        trainer.call("stop_loop")
        for r in trainer.call("loop_results"):
            counts["publishes" if r["ok"] else "publish_errors"] += 1
            if not r["ok"]:
                errors["publish:" + r["error"]] = errors.get("publish:" + r["error"], 0) + 1
    finally:
        if probe is not None:
            probe.leave()
        close_all(workers + spares)
        hub.kill()
        hub.wait()
    out = dict(counts)
    out.update(errors=errors, error_samples=samples, seconds=time.monotonic() - t_start, seed=seed,
               failover_seconds=failovers,
               failover_seconds_max=max(failovers) if failovers else None,
               failover_seconds_median=statistics.median(failovers) if failovers else None,
               failover_fetch_seconds=fetch_failovers,
               failover_fetch_seconds_max=max(fetch_failovers) if fetch_failovers else None,
               restart_seconds=restarts, restart_seconds_max=max(restarts) if restarts else None,
               after_listen_seconds=after_listen,
               after_listen_seconds_max=max(after_listen) if after_listen else None,
               fetch_seconds_max=max(fetch_seconds) if fetch_seconds else None)
    return out


def parse_seeds(text: str) -> list[int]:
    """'10' → seeds 1..10; '3,7,9' → those seeds."""
    if "," in text:
        return [int(x) for x in text.split(",") if x.strip()]
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError("--seeds N needs N >= 1")
    return list(range(1, n + 1))


COLUMNS = ("seed", "kills", "hub_kills", "fetches_ok", "fetches_failed_typed", "fetches_failed_untyped", "torn",
           "lost", "failover_fetch_seconds_max", "restart_seconds_max", "after_listen_seconds_max", "seconds")


def total(results: list[dict]) -> dict:
    """Sums over seeds; maxima for the failover and fetch times."""
    out: dict = {"seed": "total"}
    for k in COLUMNS[1:]:
        vals = [r[k] for r in results if r.get(k) is not None]
        out[k] = (max(vals) if vals else None) if k.endswith("_max") else sum(vals)
    out["fetch_seconds_max"] = max((r["fetch_seconds_max"] for r in results if r["fetch_seconds_max"]), default=None)
    errors: dict[str, int] = {}
    for r in results:
        for e, n in r["errors"].items():
            errors[e] = errors.get(e, 0) + n
    out["errors"] = errors
    return out


def _print_table(rows: list[dict]) -> None:
    heads = ("seed", "kills", "hub", "ok", "typed", "untyped", "torn", "lost", "failover max", "listen max",
             "fetch after", "secs")
    print("  ".join(f"{h:>11s}" for h in heads))
    for r in rows:
        print("  ".join(f"{r[k]:>11.2f}" if isinstance(r[k], float) else f"{str(r[k]):>11s}" for k in COLUMNS))


@register_scenario("chaos")
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsync.bench chaos", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=200)
    p.add_argument("--hub-kills", type=int, default=None, help="default: kills // 10")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", default=None, help="N (seeds 1..N) or a comma list: one run per seed, back to back")
    p.add_argument("--readers", type=int, default=4)
    p.add_argument("--size-mb", type=float, default=2.0)
    p.add_argument("--interval", type=float, default=1.5, help="mean seconds between kills")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    seeds = parse_seeds(a.seeds) if a.seeds else [a.seed]
    load_before = os.getloadavg()
    results = []
    for seed in seeds:
        res = run_chaos(a.kills, a.hub_kills if a.hub_kills is not None else max(2, a.kills // 10), seed,
                        a.readers, a.size_mb, interval_s=a.interval, max_seconds=max(600.0, a.kills * 5.0))
        res["load"] = os.getloadavg()
        results.append(res)
        if len(seeds) > 1:
            print(f"seed {seed}: kills {res['kills']} (hub {res['hub_kills']}) ok {res['fetches_ok']} "
                  f"typed {res['fetches_failed_typed']} untyped {res['fetches_failed_untyped']} torn {res['torn']} "
                  f"lost {res['lost']} failover max {res['failover_fetch_seconds_max']} s (hub listening "
                  f"{res['restart_seconds_max']} s, then fetch {res['after_listen_seconds_max']} s; all "
                  f"re-registered {res['failover_seconds_max']} s) {res['seconds']:.0f} s load {res['load'][0]:.1f} "
                  f"errors {res['errors']}", flush=True)
            if a.json:  # after every seed: a long sweep cut short keeps what it measured
                with open(a.json, "w") as f:
                    json.dump({"seeds": results, "total": total(results), "load_before": load_before}, f, indent=2)
    if len(seeds) == 1:
        res = results[0]
        for k in ("kills", "hub_kills", "reader_kills", "notice_leaves", "seed_kills", "fetches_ok",
                  "fetches_failed_typed", "fetches_failed_untyped", "torn", "lost", "publishes",
                  "failover_seconds_max", "failover_seconds_median", "failover_fetch_seconds_max",
                  "restart_seconds_max", "after_listen_seconds_max",
                  "fetch_seconds_max", "seconds"):
            v = res[k]
            print(f"{k:26s} {v:.2f}" if isinstance(v, float) else f"{k:26s} {v}")
        print(f"{'errors':26s} {res['errors']}")
    tot = total(results)
    if len(seeds) > 1:
        _print_table(results + [tot])
        print(f"errors: {tot['errors']}")
    print(f"load average before: {load_before[0]:.1f}, after: {os.getloadavg()[0]:.1f} (1 min)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"seeds": results, "total": tot, "load_before": load_before} if len(seeds) > 1 else results[0],
                      f, indent=2)
    ok = all(r["torn"] == 0 and r["lost"] == 0 and r["fetches_failed_untyped"] == 0 for r in results)
    return 0 if ok else 1
