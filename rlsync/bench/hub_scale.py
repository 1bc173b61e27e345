"""`python -m rlsync.bench hub_scale`: the hub's control plane at 100 / 1,000 / 10,000 workers.

    python -m rlsync.bench hub_scale [--sizes 100,1000,10000] [--json F] [--budget-s 60] [--no-rpc]

In-process (the project's own `HubState` and planner, no sockets), on a realistic topology (4 DCs x
16 racks, hosts of 8 workers; a 1,001-unit 8 GiB manifest; the trainer in dc0):
- plan latency p50/p99 of one fetch of the newest version (half the workers hold it), idle and with
  open fetches (N/10, at most 1,000, left open by other readers);
- a herd: every worker plans a fetch of a new version at once (none completes meanwhile):
  time until all are planned;
- a re-join storm: a restarted hub (the version restored from the journal) and every worker joining
  again under its id and re-registering what it holds, each message checked as the server checks it
  (`wire_args.check_args`, i.e. the manifest parsed from its wire form);
- a pending release's re-check (`poll_releases`, which the server runs every loop pass) at N holders,
  per pass without an event and once after its reader finishes.
Against a real `python -m rlsync.hub serve` process (bench/_hub_scale_rpc.py): control RPCs per
second from many concurrent lightweight clients (heartbeats; fetch plans), and the hub's RSS per
worker and per connection. Every phase is bounded by `--budget-s`: a phase that runs out reports how
far it got (`*_done`) and no figure. CPU time is reported beside wall time (2 shared cores). Both
sides take their topology and manifest from bench/hub_scale_fixtures.py.
A benchmark: it reports, it asserts nothing (docs/scale.md quotes it).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import time

import logging

from rlsync.bench import register_scenario
from rlsync.bench._hub_scale_rpc import rpc_throughput
from rlsync.bench.hub_scale_fixtures import MODEL, SHARD, HubStateFixture, big_manifest, endpoint, location
from rlsync.hub.model.manifest import Manifest
from rlsync.hub.server.known_manifests import KnownManifests
from rlsync.hub.server.loop import serving_gc
from rlsync.hub.state import HubConfig, HubState
from rlsync.hub.protocol.rpc import pack
from rlsync.hub.protocol.args import check_args, manifest_from_wire


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def plan_latency(c: HubStateFixture, readers: list[str], samples: int, budget_s: float) -> dict:
    """Time single plans of the newest version; each is undone (fetch_done not ok) so the state stays put."""
    s, wall, cpu = c.state, [], []
    end = time.monotonic() + budget_s
    for w in readers[:samples]:
        t0, c0 = time.perf_counter(), time.process_time()
        p = s.plan_fetch(w, MODEL, "latest", SHARD)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        s.fetch_done(w, p.fetch_id, False)
        if time.monotonic() > end and len(wall) >= 5:
            break
    return {"n": len(wall), "p50_ms": 1e3 * statistics.median(wall), "p99_ms": 1e3 * _pct(wall, 0.99),
            "cpu_p99_ms": 1e3 * _pct(cpu, 0.99)}


def herd(c: HubStateFixture, version: int, budget_s: float) -> dict:
    """Every worker plans a fetch of `version` (only the trainer holds it); none completes meanwhile."""
    c.publish(version, [])
    t0, c0 = time.perf_counter(), time.process_time()
    end = time.monotonic() + budget_s
    done = 0
    for w in c.workers:
        c.state.plan_fetch(w, MODEL, version, SHARD)
        done += 1
        if time.monotonic() > end:
            break
    wall = time.perf_counter() - t0
    out = {"done": done, "of": len(c.workers), "cpu_s": time.process_time() - c0, "elapsed_s": wall}
    out["s"] = wall if done == len(c.workers) else None
    return out


def rejoin_storm(c: HubStateFixture, budget_s: float) -> dict:
    """A restarted hub: v1 restored, every worker re-joins under its id and re-registers v1. Timed: what
    the server does per message (unpack, `check_args`, the state call); not timed: the clients packing."""
    s = HubState(HubConfig(worker_timeout_s=1e9), id_prefix="2.")
    wire = c.manifest.to_wire()
    restored = manifest_from_wire(wire)
    s.restore_committed(MODEL, 1, SHARD.group, {SHARD.key: restored})  # as the server does
    known = KnownManifests()  # the server decodes requests through it (hub/server/known_manifests.py)
    known.add(restored)
    wall = cpu = 0.0
    end = time.monotonic() + budget_s
    done = 0
    for i, w in enumerate(c.workers):
        msgs = [("join", {"name": f"w{i}", "location": location(i).to_wire(), "endpoint": endpoint(i), "worker_id": w}),
                ("register", {"wid": w, "model": MODEL, "version": 1, "shard": SHARD.to_wire(), "slot": "live",
                              "manifest": wire})]
        msgs = [(op, pack({"id": i, "op": op, "token": "t" * 48, "args": a})) for op, a in msgs]  # as RpcChannel
        t0, c0 = time.perf_counter(), time.process_time()
        for op, data in msgs:
            a = check_args(op, known.decode(data)["args"])
            s.join(**a) if op == "join" else s.register_replica(**a)
        wall += time.perf_counter() - t0
        cpu += time.process_time() - c0
        done += 1
        if time.monotonic() > end:
            break
    return {"done": done, "of": len(c.workers), "elapsed_s": wall, "cpu_s": cpu,
            "s": wall if done == len(c.workers) else None}


def release_recheck(c: HubStateFixture, budget_s: float) -> dict:
    """The server's per-pass re-check of pending releases (`poll_releases`) with one release pending at
    N holders: a holder releases its copy while a reader still reads from it (it waits for that read).
    Timed: passes with no event in between, as most event-loop passes are; then after an event."""
    s = c.state
    reader = s.join("late-reader", location(3), endpoint(10**6 + 1))
    plan = s.plan_fetch(reader, MODEL, 1, SHARD)
    src = plan.sources[0][0]
    if str(s.release(src.worker, MODEL, 1, SHARD)) != "pending":
        return {"pending": 0}
    out, end = {"pending": len(s.pending_releases), "holders": len(s.replicas_of(MODEL, 1, SHARD.key))}, time.monotonic() + budget_s
    n, c0 = 0, time.process_time()
    while n < 2000 and (n < 20 or time.monotonic() < end):
        s.poll_releases()
        n += 1
    out["idle_pass_us"] = 1e6 * (time.process_time() - c0) / n
    s.fetch_done(reader, plan.fetch_id, False)  # the event: its read ends, so the release can go
    c0 = time.process_time()
    done = s.poll_releases()
    out["event_pass_us"], out["released"] = 1e6 * (time.process_time() - c0), len(done)
    return out


def in_process(n: int, manifest: Manifest, samples: int, budget_s: float) -> dict:
    rng = random.Random(n)
    t0 = time.perf_counter()
    c = HubStateFixture(n, manifest)
    out: dict = {"workers": n, "setup_s": time.perf_counter() - t0}
    half = c.workers[::2]
    c.publish(2, half)                                   # v2: every other worker holds it
    readers = c.workers[1::2]
    rng.shuffle(readers)
    out["plan_idle"] = plan_latency(c, readers, samples, budget_s)
    nopen, end = 0, time.monotonic() + budget_s
    for w in readers[samples:samples + min(n // 10, 1000)]:  # open fetches by other readers, left open
        c.state.plan_fetch(w, MODEL, "latest", SHARD)
        nopen += 1
        if time.monotonic() > end:
            break
    out["open_fetches"] = nopen
    out["plan_open"] = plan_latency(c, readers, samples, budget_s)
    del c
    gc.collect()
    c = HubStateFixture(n, manifest)
    out["herd"] = herd(c, 2, budget_s)
    out["rejoin_storm"] = rejoin_storm(c, budget_s)
    del c
    gc.collect()
    out["release_recheck"] = release_recheck(HubStateFixture(n, manifest), budget_s)
    return out


@register_scenario("hub_scale")
def hub_scale_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsync.bench hub_scale", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="100,1000,10000", help="joined workers, comma-separated")
    p.add_argument("--units", type=int, default=1001, help="transfer units in the manifest")
    p.add_argument("--samples", type=int, default=300, help="plans timed per latency figure")
    p.add_argument("--budget-s", type=float, default=60.0, help="wall-time bound of every phase")
    p.add_argument("--rpc-workers", type=int, default=2000, help="workers joined over RPC for the throughput run")
    p.add_argument("--rpc-clients", type=int, default=2, help="client processes driving the hub")
    p.add_argument("--rpc-seconds", type=float, default=5.0, help="length of each RPC throughput phase")
    p.add_argument("--no-rpc", action="store_true", help="skip the real-server phases")
    p.add_argument("--default-gc", action="store_true", help="in-process phases with Python's default GC thresholds")
    p.add_argument("--json", help="write every figure here")
    a = p.parse_args(argv)
    sizes = [int(x) for x in a.sizes.split(",") if x]
    if not sizes or min(sizes) < 2 or a.units < 1 or a.samples < 1 or a.budget_s <= 0:
        p.error("--sizes >= 2 each, --units/--samples >= 1, --budget-s > 0")
    logging.getLogger("rlsync.hub.state").setLevel(logging.WARNING)  # a commit line per phase is noise
    if not a.default_gc:
        serving_gc()  # what `python -m rlsync.hub serve` sets: the in-process figures are the server's
    manifest = big_manifest(a.units)
    res: dict = {"load_start": os.getloadavg()[0], "units": a.units, "gc_threshold": gc.get_threshold(), "by_size": {}}
    for n in sizes:
        r = in_process(n, manifest, a.samples, a.budget_s)
        res["by_size"][str(n)] = r
        pi, po, h, st = r["plan_idle"], r["plan_open"], r["herd"], r["rejoin_storm"]
        print(f"{n:>6} workers: plan p50/p99 {pi['p50_ms']:.2f}/{pi['p99_ms']:.2f} ms idle (CPU p99 "
              f"{pi['cpu_p99_ms']:.2f}, n={pi['n']}), {po['p50_ms']:.2f}/{po['p99_ms']:.2f} ms with "
              f"{r['open_fetches']} open (CPU p99 {po['cpu_p99_ms']:.2f}, n={po['n']}); "
              f"herd {_fmt(h)}; re-join storm {_fmt(st)}; {_fmt_rr(r['release_recheck'])}; "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
    if not a.no_rpc:
        res["rpc"] = rpc_throughput(a.rpc_workers, a.rpc_clients, a.rpc_seconds, manifest, a.budget_s)
        rp = res["rpc"]
        print(f"RPC ({a.rpc_workers} workers, {a.rpc_clients} client processes, {rp['connections']} connections): "
              f"heartbeat {rp['heartbeat_per_s']:.0f}/s, fetch cycle {rp['fetch_rpc_per_s']:.0f} RPC/s ({rp['fetch_plans_per_s']:.0f} plans/s); hub CPU "
              f"{rp['hub_cpu_share']:.2f} core; hub RSS {rp['rss_per_worker_kb']:.2f} KB/worker; after a hub restart "
              f"{rp['storm_registered']} of {rp['joined']} re-joined and re-registered in {rp['storm_elapsed_s']:.2f} s "
              f"({rp['storm_hub_cpu_s']:.2f} s hub CPU); load {os.getloadavg()[0]:.1f}", flush=True)
        res["rpc_per_s"] = rp["rpc_per_s"]  # the slower of heartbeats and fetch cycles
        res["rpc_storm_s"] = rp["storm_s"]
    big = res["by_size"].get("10000")
    if big:
        res["plan_p99_ms_10k"] = big["plan_idle"]["p99_ms"]
        res["plan_open_p99_ms_10k"] = big["plan_open"]["p99_ms"]
        res["herd_10k_s"] = big["herd"]["s"]
        res["rejoin_10k_s"] = big["rejoin_storm"]["s"]
        res["release_recheck_us_10k"] = big["release_recheck"].get("idle_pass_us")
    res["load_end"] = os.getloadavg()[0]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


def _fmt_rr(rr: dict) -> str:
    if not rr.get("pending"):
        return "release re-check: no pending release made"
    return (f"a pending release re-checked in {rr['idle_pass_us']:.1f} us per loop pass without an event, "
            f"{rr['event_pass_us']:.0f} us after one ({rr['holders']} holders)")


def _fmt(ph: dict) -> str:
    if ph["s"] is not None:
        return f"{ph['s']:.2f} s ({ph['cpu_s']:.2f} s CPU)"
    return f"{ph['done']} of {ph['of']} in {ph['elapsed_s']:.0f} s (budget out)"
