"""`python -m rlsync.sim validate`: simulated vs measured for the four emulated-topology benchmarks.

"Measured" is the --json output of real runs of `python -m rlsync.bench fanout|elastic|standalone|
crossdc` (netns hosts, tc-shaped links, real hub and data plane), bundled into one fixture file
with the command, commit, date and load of each run (`MEASURED_DIR`, made by `bundle`), or re-measured
with `--measure` (needs root; heavy: run it under /work/tools/heavy). The simulator replays each
run's own configuration (model size, NIC and DC rates, transfer unit, planner knobs); the one
figure it takes from the run is the link check (one TCP flow's goodput on a shaped link), which sets
the network's efficiency. Nothing is fitted to the figures being predicted.

Rows: rlsync's figure in every scenario (what the simulator exists to predict; `max_rel_error` is
over these), and the trainer-only baselines, compared too (`baseline_max_rel_error`).
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from . import scenarios as S

MEASURED_DIR = Path(__file__).with_name("measured")
"""Dated bundles `bench-DATE[-how].json`; the newest is the default."""
SCENARIOS = ("fanout", "elastic", "standalone", "crossdc")
COMMANDS = {
    "fanout": ["fanout", "--skip", "ray object store"],
    "elastic": ["elastic"],
    "standalone": ["standalone"],
    "crossdc": ["crossdc"],
}


def model_from(run: dict, efficiency: float, rpc_s: float) -> S.BenchModel:
    cfg = run["config"]
    return S.BenchModel(model_bytes=int(cfg["model_bytes"]), nic_rate=str(cfg["nic_rate"]),
                        chunk_bytes=int(float(cfg["chunk_mib"]) * (1 << 20)), planner=dict(cfg["rlsync_planner"]),
                        efficiency=efficiency, rpc_s=rpc_s)


def efficiency_of(runs: dict) -> float:
    """One TCP flow's goodput / the shaped NIC rate, from the fanout run's link check (median of pairs)."""
    fan = runs["fanout"]
    mbit = statistics.median(fan["link_check_mbit"].values())
    return min(1.0, mbit * 1e6 / (S.bytes_per_s(fan["config"]["nic_rate"]) * 8))


ORDER_SEEDS = (0, 1, 2, 3, 4)
"""The readers' arrival order at the hub is random in a benchmark: each figure is the median over these."""


def _median(fn, m: S.BenchModel, *args, key=None, **kw) -> float:
    vals = [fn(replace(m, order_seed=s), *args, **kw) for s in ORDER_SEEDS]
    return statistics.median(v[key] if key else v for v in vals)


def rows(runs: dict, rpc_s: float = S.BenchModel().rpc_s, superseded: dict | None = None) -> list[dict]:
    eff = efficiency_of(runs)
    out = []

    def row(scenario, system, figure, measured, simulated, counted, superseded=False):
        err = abs(simulated - measured) / measured
        out.append({"scenario": scenario, "system": system, "figure": figure, "measured": round(measured, 3),
                    "simulated": round(simulated, 3), "rel_error": round(err, 4), "counted": counted,
                    "superseded": superseded})

    r = runs["fanout"]
    m = model_from(r, eff, rpc_s)
    for n in r["config"]["reader_counts"]:
        for system, p2p, counted in (("rlsync", False, True), ("trainer-only p2p", True, False)):
            meas = r["seconds_median"].get(system, {}).get(str(n), r["seconds_median"].get(system, {}).get(n))
            if meas is not None:
                row("fanout", system, f"s to the last of {n} readers", meas, _median(S.fanout, m, n, p2p=p2p), counted)
    r = runs["elastic"]
    m, cfg = model_from(r, eff, rpc_s), r["config"]
    for system, p2p, counted in (("rlsync", False, True), ("trainer-only p2p", True, False)):
        row("elastic", system, f"s until {cfg['joiners']} joiners hold it", r["seconds_median"][system],
            _median(S.elastic, m, cfg["holders"], cfg["joiners"], p2p=p2p), counted)
    r = runs["standalone"]
    m, cfg = model_from(r, eff, rpc_s), r["config"]
    sim = _median(S.standalone, m, cfg["rollouts"], cfg["steps"], cfg["train_s"], cfg["trainer_gpus"],
                  key="total_stall_s")
    meas = r["systems"]["rlsync"]
    row("standalone", "rlsync", f"total GPU stall, {cfg['steps']} steps (s)", meas["total_stall_s"], sim, True)
    for name, old in (superseded or {}).items():
        if old.get("scenario") == "standalone":
            cfg = old["config"]
            sim = {"total_stall_s": _median(S.standalone, model_from(old, eff, rpc_s), cfg["rollouts"], cfg["steps"],
                                            cfg["train_s"], cfg["trainer_gpus"], key="total_stall_s")}
            load = old.get("machine", {}).get("loadavg", ["?"])[0]
            row("standalone", f"rlsync, {name} (load {load:.0f})", "total GPU stall (s)",
                old["systems"]["rlsync"]["total_stall_s"], sim["total_stall_s"], False, superseded=True)
    r = runs["crossdc"]
    m, cfg = model_from(r, eff, rpc_s), r["config"]
    ratio = cfg["dc_link_rate_bps"] / (S.bytes_per_s(cfg["nic_rate"]) * 8)
    for system, p2p, counted in (("rlsync", False, True), ("per-worker pull", True, False)):
        stall = _median(S.crossdc, m, cfg["rollouts"], ratio, p2p=p2p, key="total_stall_s")
        wall = _median(S.crossdc, m, cfg["rollouts"], ratio, p2p=p2p, key="wall_s")
        row("crossdc", system, f"total stall of {cfg['rollouts']} rollouts (s)", r["total_stall_s_median"][system],
            stall, counted)
        row("crossdc", system, "wall (s)", r["wall_s_median"][system], wall, counted)
    return out


def result(bundle: dict, rpc_s: float) -> dict:
    rs = rows(bundle["runs"], rpc_s, bundle.get("superseded"))
    counted = [r["rel_error"] for r in rs if r["counted"]]
    others = [r["rel_error"] for r in rs if not r["counted"] and not r["superseded"]]
    return {"max_rel_error": max(counted), "baseline_max_rel_error": max(others) if others else None,
            "within_10pct": max(counted) <= 0.10, "rows": rs, "efficiency": round(efficiency_of(bundle["runs"]), 4),
            "rpc_s": rpc_s, "measured_from": {k: bundle.get(k) for k in ("date", "commit", "commands", "load", "note")}}


def measure(out_dir: Path) -> dict:
    """Run the four benchmarks now, one after another (root; minutes), and bundle their JSON."""
    runs, commands, load = {}, {}, {}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    for name in SCENARIOS:
        path = out_dir / f"{name}.json"
        cmd = [sys.executable, "-m", "rlsync.bench", *COMMANDS[name], "--json", str(path)]
        load[name] = {"before": _load()}
        subprocess.run(cmd, check=True)
        load[name]["after"] = _load()
        runs[name] = json.loads(path.read_text())
        commands[name] = "python -m rlsync.bench " + " ".join(cmd[3:])
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit, "commands": commands,
            "load": load, "runs": runs}


def bundle(run_dir: Path, note: str = "") -> dict:
    """Bundle `run_dir`/{fanout,elastic,standalone,crossdc}.json (benchmark --json outputs) and its
    meta.txt (commit, start/end times and load per run, written by the script that ran them)."""
    runs = {name: json.loads((run_dir / f"{name}.json").read_text()) for name in SCENARIOS}
    meta = (run_dir / "meta.txt").read_text() if (run_dir / "meta.txt").exists() else ""
    first = meta.split()
    return {"date": time.strftime("%Y-%m-%d", time.gmtime((run_dir / "fanout.json").stat().st_mtime)),
            "commit": first[1] if len(first) > 1 and first[0] == "commit" else None,
            "commands": {k: v.get("command") for k, v in runs.items()},
            "load": {k: v.get("machine", {}).get("loadavg") for k, v in runs.items()},
            "log": meta.splitlines(), "note": note, "runs": runs,
            # Earlier runs of a scenario the same session re-ran (e.g. `standalone-load20.json`): kept, shown.
            "superseded": {p.stem: json.loads(p.read_text()) for p in sorted(run_dir.glob("*-*.json"))
                           if p.stem.split("-")[0] in SCENARIOS}}


def _load() -> list[float]:
    return [round(x, 2) for x in Path("/proc/loadavg").read_text().split()[:3]] if Path("/proc/loadavg").exists() else []


def load_bundle(path: Path | None, do_measure: bool) -> dict:
    if do_measure:
        with tempfile.TemporaryDirectory() as d:
            return measure(Path(d))
    stored = sorted(MEASURED_DIR.glob("bench-*.json"))
    path = path or (stored[-1] if stored else MEASURED_DIR / "bench-*.json")
    if not path.exists():
        raise SystemExit(f"validate: no measured fixture at {path}; pass --measured FILE or --measure")
    return json.loads(path.read_text())


def print_table(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"simulated vs measured (efficiency {res['efficiency']}, rpc {res['rpc_s'] * 1e3:.1f} ms)")
    for col in ("scenario", "system", "figure", "measured", "simulated", "error"):
        t.add_column(col, justify="right" if col in ("measured", "simulated", "error") else "left")
    for r in res["rows"]:
        tag = "" if r["counted"] else (" (superseded run)" if r["superseded"] else " (baseline)")
        t.add_row(r["scenario"], r["system"] + tag, r["figure"],
                  f"{r['measured']:.2f}", f"{r['simulated']:.2f}", f"{100 * r['rel_error']:.1f}%")
    c = Console(width=150)
    c.print(t)
    src = res["measured_from"]
    c.print(f"measured: {src.get('date')} at commit {str(src.get('commit'))[:10]}; commands and load in the fixture")
    if src.get("note"):
        c.print(src["note"])
    c.print(f"max_rel_error (rlsync rows): {res['max_rel_error']:.3f}   baselines: {res['baseline_max_rel_error']:.3f}")
