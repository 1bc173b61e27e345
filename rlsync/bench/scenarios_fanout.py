"""`python -m rlsync.bench fanout`: 1, 2, 4, 8 readers fetch one fresh version at once.

    python -m rlsync.bench fanout --json outputs/bench/fanout.json

Every host is a network namespace with a shaped NIC (default 250 Mbit/s each way) and the model is
64 MiB: one transfer takes 2.15 s, as the issue's 256 MiB at 1 Gbit/s does (sizes and rates scaled
down together so the run fits 2 cores; the ratios are what matter). Per reader count and system,
a fresh version (the trainer's weights changed) is read by N readers started at one instant; the
figure is the wall time to the last reader done, the median of `--reps`, systems interleaved.
Systems: rlsync (planner fan-out cap 1: readers relay to each other, pipelined), trainer-only
point-to-point (UCX's shape, same data plane), gloo broadcast (NCCL's shape), Ray object store.
Each system gets one untimed warm-up round with all readers first. Needs root.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import time
from pathlib import Path

from rlsync.hub import cli_args as V

from . import register_scenario
from .cluster import BenchCluster, BenchConfig, command_line, machine_info, skip_reason, write_outputs
from .topo import TopologySpec

log = logging.getLogger(__name__)

SYSTEMS = ("rlsync", "trainer-only p2p", "gloo broadcast", "ray object store")


def fanout_spec(readers: int, nic_rate: str) -> TopologySpec:
    half = (readers + 1) // 2
    racks = {"r0": ["hub", "trainer"] + [f"ro{i}" for i in range(half)],
             "r1": [f"ro{i}" for i in range(half, readers)]}
    return TopologySpec.from_dict({"nic_rate": nic_rate, "dcs": {"dc0": {k: v for k, v in racks.items() if v}}})


def run(cfg: BenchConfig, counts: list[int], reps: int, skip: set[str]) -> dict:
    from .raybase import RayObjectStore

    spec = fanout_spec(max(counts), cfg.nic_rate)
    times: dict[str, dict[int, list[float]]] = {s: {n: [] for n in counts} for s in SYSTEMS}
    exact: dict[str, bool] = {s: True for s in SYSTEMS}
    skipped: dict[str, str] = {s: "skipped by --skip" for s in SYSTEMS if s in skip}
    with BenchCluster(spec, cfg) as c:
        readers = c.readers
        c.check_links([("trainer", readers[0]), (readers[-1], "trainer")], 8 << 20)
        c.start_hub("rlsync", cfg.rlsync_planner())
        c.start_hub("p2p", {"fanout_cap": 1 << 20, "max_sources": 1}, only_hosts=["trainer"])
        c.join_all("rlsync", ["trainer"] + readers)
        c.join_all("p2p", ["trainer"] + readers)
        c.gloo_init({f"n{n}": readers[:n] for n in counts})
        ray = None
        if "ray object store" not in skipped:
            ray = RayObjectStore(c)
            why = ray.start()
            if why:
                skipped["ray object store"] = why
                ray = None

        def one(system: str, n: int):
            waited = c.wait_quiet()
            if waited > 1.0:
                log.info("waited %.1fs for the links to go quiet before %s, N=%d", waited, system, n)
            if system == "rlsync":
                return c.hub_round("rlsync", system, readers[:n])
            if system == "trainer-only p2p":
                return c.hub_round("p2p", system, readers[:n])
            if system == "gloo broadcast":
                return c.gloo_round(f"n{n}")[0]
            return ray.round(readers[:n])

        live = [s for s in SYSTEMS if s not in skipped]

        def attempt(s: str, n: int):
            try:
                return one(s, n)
            except Exception as e:  # noqa: BLE001 - Ray is a guest here: its failure is reported, not fatal
                if s != "ray object store":
                    raise
                skipped[s] = f"failed across the namespaces: {str(e).splitlines()[0]}"
                live.remove(s)
                log.warning("%s: %s", s, skipped[s])
                return None

        for s in list(live):  # warm-up, untimed
            attempt(s, max(counts))
        for rep in range(reps):
            for n in counts:
                for s in list(live):
                    r = attempt(s, n)
                    if r is None:
                        continue
                    times[s][n].append(r.seconds)
                    exact[s] &= r.exact
                    log.info("rep %d  %-18s %d readers  %.2fs  exact=%s", rep, s, n, r.seconds, r.exact)
        if ray is not None:
            ray.close()
        nbytes = c.nbytes
        transport = c.transport
        links = c.link_check
    med = {s: {n: statistics.median(v) for n, v in times[s].items() if v} for s in SYSTEMS}
    lo, hi = min(counts), max(counts)
    ratio = {s: round(med[s][hi] / med[s][lo], 3) for s in SYSTEMS if med[s].get(hi) and med[s].get(lo)}
    one_transfer = nbytes * 8 / _bps(cfg.nic_rate)
    return {
        "scenario": "fanout",
        "config": {"model_bytes": nbytes, "nic_rate": cfg.nic_rate, "chunk_mib": cfg.chunk_mib,
                   "bucket_mib": cfg.bucket_mib, "streams": cfg.streams, "transport": transport,
                   "rlsync_planner": cfg.rlsync_planner(), "reader_counts": counts, "reps": reps},
        "ideal_one_transfer_s": round(one_transfer, 3),
        "link_check_mbit": links,
        "seconds_median": med,
        "seconds_runs": times,
        "exact": exact,
        "skipped": skipped,
        f"time_ratio_{hi}_vs_{lo}": ratio,
        "time_ratio_8_vs_1": ratio,
        "machine": machine_info(),
        "command": command_line(),
    }


def _bps(rate: str) -> float:
    from .topo import parse_rate
    return parse_rate(rate)


def print_table(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    counts = res["config"]["reader_counts"]
    t = Table(title=f"fanout: {res['config']['model_bytes'] / 2**20:.0f} MiB to N readers behind "
                    f"{res['config']['nic_rate']} NICs (one transfer = {res['ideal_one_transfer_s']:.2f}s); "
                    f"seconds, median of {res['config']['reps']}")
    t.add_column("system")
    for n in counts:
        t.add_column(f"N={n}", justify="right")
    t.add_column("N=max / N=1", justify="right")
    t.add_column("exact bytes")
    for s in SYSTEMS:
        if s in res["skipped"]:
            t.add_row(s, *["-"] * len(counts), "-", f"skipped: {res['skipped'][s]}")
            continue
        m = res["seconds_median"][s]
        t.add_row(s, *[f"{m[n]:.2f}" if n in m else "-" for n in counts],
                  f"{res['time_ratio_8_vs_1'].get(s, float('nan')):.2f}", "yes" if res["exact"][s] else "NO")
    Console(width=160).print(t)
    Console().print(f"link check (one TCP stream, Mbit/s): {res['link_check_mbit']}")


def plot(res: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    counts = res["config"]["reader_counts"]
    for s in SYSTEMS:
        m = res["seconds_median"].get(s) or {}
        if m:
            ax.plot(list(m), list(m.values()), marker="o", label=s)
    ax.axhline(res["ideal_one_transfer_s"], color="grey", ls=":", label="one transfer at NIC rate")
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.set_xlabel("readers")
    ax.set_ylabel("seconds until every reader holds the version")
    ax.set_title(f"fanout, {res['config']['model_bytes'] / 2**20:.0f} MiB, {res['config']['nic_rate']} NICs")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_common_args(p: argparse.ArgumentParser, model_mib: float) -> None:
    d = BenchConfig()
    p.add_argument("--model-mib", type=V.positive_float, default=model_mib, help="model size in MiB")
    p.add_argument("--nic-rate", default=d.nic_rate, help="every host's NIC rate, each direction (tc syntax)")
    p.add_argument("--chunk-mib", type=V.positive_float, default=d.chunk_mib, help="rlsync transfer unit (pipeline grain)")
    p.add_argument("--streams", type=V.positive_int, default=d.streams,
                   help="rlsync data-plane streams per source (each stream carries every k-th unit)")
    p.add_argument("--fanout-cap", type=V.positive_int, default=d.fanout_cap,
                   help="rlsync planner fan-out cap (readers one source serves at once)")
    p.add_argument("--transport", default=d.transport, choices=["auto", "tcp", "tcp-py"])
    p.add_argument("--json", type=Path, help="write raw figures + ratios here (and a PNG beside it)")


def config_from(a: argparse.Namespace) -> BenchConfig:
    return BenchConfig(model_mib=a.model_mib, nic_rate=a.nic_rate, chunk_mib=a.chunk_mib, transport=a.transport,
                       streams=a.streams, fanout_cap=a.fanout_cap)


@register_scenario("fanout")
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsync.bench fanout", description=__doc__.split("\n")[0])
    add_common_args(p, 64.0)
    p.add_argument("--readers", default="1,2,4,8", help="reader counts, comma separated")
    p.add_argument("--reps", type=int, default=1, help="timed repetitions (median reported)")
    p.add_argument("--skip", action="append", default=[], help="system to leave out (e.g. 'ray object store')")
    a = p.parse_args(argv)
    why = skip_reason()
    if why:
        print(f"fanout: cannot run: {why}")
        return 2
    t0 = time.monotonic()
    res = run(config_from(a), [int(x) for x in a.readers.split(",")], a.reps, set(a.skip))
    res["elapsed_s"] = round(time.monotonic() - t0, 1)
    print_table(res)
    write_outputs(res, a.json, plot)
    return 0
