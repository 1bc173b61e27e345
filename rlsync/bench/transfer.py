"""`python -m rlsync.bench transfer`: raw transfer rate between two processes on loopback.

    python -m rlsync.bench transfer --size 1GiB --json outputs/bench/transfer.json

Contenders, all measured in one run, each moving `--size` bytes from one process to another:
- `rlsync default`: the path a client's reader takes towards a same-host peer, chosen by the
  host's data-path calibration (rlsync.hub.dataplane.tuning; `--recalibrate` measures it anew first);
- every candidate that calibration chooses among: rlsync `tcp` (native engine) with 1, 2, 4 streams,
  each with the source's zero-copy send and with its copying send, rlsync `tcp-py` and rlsync `shm`.
  In every rlsync row a source process holds the bytes as a full replica behind a real
  `DataServer`; this process reads them with `read_from_source` into its own buffers — the same
  request framing, ticket check and per-unit xxh3 verification a fetch does (no control-plane RPC:
  the ticket is signed locally).
- `iperf3` single stream (`-n SIZE`, defaults otherwise): the machine's loopback TCP ceiling.
- Mooncake's transfer engine over TCP (`transfer_sync_write`, in its own venv so its wheels never
  touch the project's).
Buffers are allocated and touched before timing (warm). Repetitions are interleaved across
contenders (round-robin, after one untimed warm-up round) so load from other processes on a
shared machine falls on all of them alike; each figure is the median. Set-up installs what is
missing (`apt-get install -y iperf3`; Mooncake and its Debian libraries); a contender that cannot
run is skipped with the reason in the table and the JSON.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from . import register_scenario
from .contenders import Contender, Iperf3Contender, MooncakeContender, RlsyncContender, RlsyncSource
from .provision import Skip

log = logging.getLogger(__name__)

@dataclass(slots=True)
class Figure:
    name: str
    gbps: list[float] = field(default_factory=list)
    """GB/s (1e9 bytes per second) of each timed repetition."""
    skipped: str = ""
    """Why the contender did not run ('' if it ran)."""
    note: str = ""

    @property
    def median(self) -> float | None:
        return statistics.median(self.gbps) if self.gbps else None


def cpu_pressure() -> float | None:
    """Share of the last 10 s in which some runnable task waited for a CPU (Linux PSI), in percent."""
    try:
        return float(Path("/proc/pressure/cpu").read_text().split()[1].split("=")[1])
    except (OSError, IndexError, ValueError):
        return None


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)B?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use e.g. 1GiB, 256MiB, 1e9 as 1000000000")
    num, unit, binary = float(m.group(1)), m.group(2).upper(), m.group(3)
    scale = (1024 if binary or not unit else 1000) ** " KMGT".index(unit or " ")
    return int(num * scale)




# ---------------------------------------------------------------- the run
DEFAULT = "rlsync default"
"""Name prefix of the row that reads as a client does: the path measured fastest on this host."""


def _ratio(figures: dict[str, Figure], a: str | None, b: str | None) -> float | None:
    fa, fb = figures.get(a or ""), figures.get(b or "")
    return round(fa.median / fb.median, 3) if fa and fb and fa.median and fb.median else None


def _paired(figures: dict[str, Figure], a: str | None, b: str | None) -> float | None:
    """Median over rounds of a/b within the round: steadier when other load comes and goes."""
    fa, fb = figures.get(a or ""), figures.get(b or "")
    if not (fa and fb and fa.gbps and len(fa.gbps) == len(fb.gbps)):
        return None
    return round(statistics.median(x / y for x, y in zip(fa.gbps, fb.gbps)), 3)


def run(size: int, reps: int, streams: int | None, skip: set[str], cache: Path, command: str = "",
        chunk_bytes: int | None = None, recalibrate: bool = False) -> dict:
    from rlsync.hub.dataplane.tuning import CANDIDATES, SAME_HOST, load_or_calibrate
    from rlsync.hub.dataplane.native import identity, warn_if_stale
    from rlsync.hub.model.manifest import ManifestConfig

    chunk_bytes = chunk_bytes or ManifestConfig().chunk_bytes
    load_cal = os.getloadavg()
    cal = load_or_calibrate(refresh=recalibrate)
    chosen = cal.choice(SAME_HOST)
    source = RlsyncSource(size, chunk_bytes)
    contenders: list[Contender] = [RlsyncContender(source, None, streams, f"{DEFAULT} ({chosen.label})", None)]
    for c in CANDIDATES:
        if streams is None or c.transport != "tcp" or c.streams in (1, streams):
            contenders.append(RlsyncContender(source, c.transport, c.streams, f"rlsync {c.label}", c.zero_copy,
                                              key=c.transport if c.transport != "tcp" or c.zero_copy else "copy-send"))
    if streams is not None and streams not in (1, 2, 4):
        contenders += [RlsyncContender(source, "tcp", streams, f"rlsync tcp x{streams} {m}", m == "zero-copy",
                                       key="tcp" if m == "zero-copy" else "copy-send") for m in ("zero-copy", "copying")]
    contenders += [Iperf3Contender(size), MooncakeContender(size, cache)]
    figures = {c.name: Figure(c.name) for c in contenders}
    running = []
    for c in contenders:
        if c.key in skip:
            figures[c.name].skipped = "skipped by --skip"
            continue
        try:
            c.setup()
            running.append(c)
        except Skip as e:
            figures[c.name].skipped = str(e)
            log.warning("%s: skipped: %s", c.name, e)
    load0, psi0 = os.getloadavg(), cpu_pressure()
    try:
        for rep in range(reps + 1):  # round 0 warms up, untimed
            for c in list(running):
                try:
                    g = c.run_once()
                except Exception as e:  # noqa: BLE001 - a contender failing mid-run is reported, not fatal
                    figures[c.name].skipped = f"failed: {e}"
                    log.warning("%s failed: %s", c.name, e)
                    running.remove(c)
                    continue
                if rep:
                    figures[c.name].gbps.append(g)
            log.info("round %d/%d done", rep, reps)
    finally:
        for c in contenders:
            c.close()
        source.close()
    default = contenders[0].name
    rows = [n for n, f in figures.items() if n.startswith("rlsync ") and n != default and f.median]
    best = max(rows, key=lambda n: figures[n].median, default=None)
    iperf, mooncake = Iperf3Contender.name, MooncakeContender.name
    return {
        "scenario": "transfer",
        "size_bytes": size,
        "chunk_bytes": chunk_bytes,
        "reps": reps,
        "unit": "GB/s (1e9 bytes/s), median of reps",
        "default_path": chosen.label,
        "engine": {"build": identity(), "stale": warn_if_stale()},
        "calibration": {"loadavg": cal.loadavg, "loadavg_now": load_cal[0], "when": cal.when,
                        "size_bytes": cal.size_bytes, "fresh": recalibrate,
                        "gbps_median": {c.label: round(statistics.median(v), 3) for c, v in cal.measured.items() if v}},
        "figures": {n: {"median_gbps": f.median, "runs_gbps": [round(x, 4) for x in f.gbps], "skipped": f.skipped}
                    for n, f in figures.items()},
        "best_rlsync_row": best,
        "ratio_vs_iperf3": _ratio(figures, default, iperf),
        "ratio_vs_mooncake": _ratio(figures, default, mooncake),
        "ratio_vs_best_rlsync": _ratio(figures, default, best),
        "paired_ratio_vs_iperf3": _paired(figures, default, iperf),
        "paired_ratio_vs_mooncake": _paired(figures, default, mooncake),
        "paired_ratio_vs_best_rlsync": _paired(figures, default, best),
        "ratio_zero_copy_vs_copy_x2": _ratio(figures, "rlsync tcp x2 zero-copy", "rlsync tcp x2 copying"),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
                    "loadavg_before": load0, "loadavg_after": os.getloadavg(),
                    "cpu_pressure_pct_before": psi0, "cpu_pressure_pct_after": cpu_pressure()},
        "command": command,
    }


def print_table(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"transfer of {res['size_bytes'] / 2**30:.2f} GiB on loopback, median of {res['reps']}")
    t.add_column("contender")
    t.add_column("GB/s", justify="right")
    t.add_column("Gbit/s", justify="right")
    t.add_column("runs (GB/s) / reason skipped")
    for name, f in res["figures"].items():
        m = f["median_gbps"]
        t.add_row(name, f"{m:.2f}" if m else "-", f"{m * 8:.1f}" if m else "-",
                  " ".join(f"{x:.2f}" for x in f["runs_gbps"]) if m else f["skipped"])
    c = Console()
    c.print(t)
    m = res["machine"]
    c.print(f"machine: {m['cpus']} CPUs, load {m['loadavg_before'][0]:.1f} -> {m['loadavg_after'][0]:.1f}, "
            f"CPU pressure {m['cpu_pressure_pct_before']}% -> {m['cpu_pressure_pct_after']}% (shared machine)")
    if res["engine"]["stale"]:
        c.print(f"[bold red]STALE ENGINE[/]: {res['engine']['stale']}")
    cal = res["calibration"]
    c.print(f"default path (measured on this host at load {cal['loadavg']:.1f}, "
            f"{'now' if cal['fresh'] else 'cached'}): {res['default_path']}; best rlsync row: {res['best_rlsync_row']}")
    for k in ("ratio_vs_iperf3", "ratio_vs_mooncake", "ratio_vs_best_rlsync", "paired_ratio_vs_iperf3",
              "paired_ratio_vs_mooncake", "paired_ratio_vs_best_rlsync", "ratio_zero_copy_vs_copy_x2"):
        c.print(f"{k}: {res[k]}")


@register_scenario("transfer")
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsync.bench transfer", description=__doc__.split("\n")[0])
    p.add_argument("--size", type=parse_size, default=parse_size("1GiB"), help="bytes per transfer (1GiB, 256MiB)")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per contender (median reported)")
    p.add_argument("--streams", type=int, default=None,
                   help="fix the default row's streams (and add native rows with this count); default: measured")
    p.add_argument("--chunk-bytes", type=parse_size, default=None,
                   help="transfer unit size of the source's manifest (default ManifestConfig.chunk_bytes, 8MiB)")
    p.add_argument("--skip", action="append", default=[],
                   help="contender to leave out: default, tcp (zero-copy rows), copy-send, tcp-py, shm, iperf3, mooncake")
    p.add_argument("--recalibrate", action="store_true",
                   help="measure the data path anew first (rlsync.hub.dataplane.tuning) instead of the host's cached choice")
    p.add_argument("--cache", type=Path, default=Path(os.environ.get("RLSYNC_BENCH_CACHE", "~/.cache/rlsync/bench")),
                   help="where set-up keeps the Mooncake venv")
    p.add_argument("--json", type=Path, help="write every figure and the ratios here")
    a = p.parse_args(argv)
    res = run(a.size, a.reps, a.streams, {s.lower() for s in a.skip}, a.cache.expanduser(),
              command=" ".join(["python -m rlsync.bench transfer", *argv]), chunk_bytes=a.chunk_bytes,
              recalibrate=a.recalibrate)
    print_table(res)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(res, indent=2))
        log.info("wrote %s", a.json)
    return 0
