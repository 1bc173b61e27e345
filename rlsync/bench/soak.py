"""`python -m rlsync.bench soak --minutes M`: hours of publish/fetch with churn; does anything grow?

One hub process (`python -m rlsync.hub serve`), a trainer publishing a new version every `--period`
seconds (releasing the last and overwriting its buffers in place), `--readers` long-lived readers
fetching `latest` in a loop into the same buffers, and churn: a short-lived reader that joins,
fetches for `--churn-every` seconds and goes (alternately leaving with notice and `kill -9`), and a
hub restart every `--restart-every` seconds (alternately SIGTERM — a clean stop — and `kill -9`; the
hub comes back on the same address and journal).

Every `--sample-every` seconds it samples the resident set size (VmRSS) and open file descriptors
(/proc/PID/fd) of the hub and of each long-lived worker (trainer, readers). It writes the samples and
fetch counts to `--out`/soak.json and a plot to `--out`/soak.png.

Growth bound (the loud failure): for every long-lived process, and for each hub lifetime, judge the
second half of its samples (and none younger than `--warmup-s`): the least-squares slope of its RSS
may be at most `--rss-mib-per-h` MiB per hour, and its open fds (mean of the last `--window` of those
samples against the first) may grow by at most `--fds`. A slope, not a start/end difference: a slow
leak hides in noise over minutes but not in a fitted line, and allocator warm-up stays out of the
second half. Beyond the bound, or any torn fetch, the run exits 1 and says which process grew.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass

from . import register_scenario


@dataclass(kw_only=True, slots=True)
class SoakConfig:
    minutes: float = 30.0
    """How long the steady state runs."""
    readers: int = 2
    """Long-lived readers fetching `latest` in a loop."""
    size_mb: float = 4.0
    """Size of the published model."""
    period_s: float = 1.0
    """Seconds between the trainer's publishes."""
    churn_every_s: float = 20.0
    """A short-lived reader is replaced this often (alternately leave with notice / kill -9)."""
    restart_every_s: float = 300.0
    """The hub is restarted this often (alternately SIGTERM / kill -9)."""
    sample_every_s: float = 5.0
    """RSS and fd sampling period."""
    warmup_s: float = 60.0
    """Samples younger than this (per process lifetime) are never judged: imports, first buffers."""
    window: float = 0.2
    """Fraction of the judged samples averaged at their start and end (open fds)."""
    rss_mib_per_h: float = 8.0
    """Allowed RSS slope over the judged samples (MiB per hour)."""
    fds: int = 16
    """Allowed growth of open file descriptors."""


def proc_sample(pid: int) -> tuple[float, int] | None:
    """(RSS in MiB, open fds) of `pid`, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss_kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        return rss_kb / 1024, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration, ValueError):
        return None


def judge(series: list[dict], cfg: SoakConfig) -> dict | None:
    """Slope of RSS and growth of fds over the second half of a series (None: too short to judge)."""
    t0 = series[0]["t"] if series else 0.0
    span = series[-1]["t"] - t0 if series else 0.0
    pts = [s for s in series if s["t"] - t0 >= max(cfg.warmup_s, span / 2)]
    if len(pts) < 10:
        return None
    mt = statistics.mean(s["t"] for s in pts)
    mr = statistics.mean(s["rss_mib"] for s in pts)
    den = sum((s["t"] - mt) ** 2 for s in pts)
    slope = sum((s["t"] - mt) * (s["rss_mib"] - mr) for s in pts) / den * 3600 if den else 0.0
    k = max(2, int(len(pts) * cfg.window))
    fd0, fd1 = statistics.mean(s["fds"] for s in pts[:k]), statistics.mean(s["fds"] for s in pts[-k:])
    return {"rss_start_mib": pts[0]["rss_mib"], "rss_end_mib": pts[-1]["rss_mib"],
            "rss_mib_per_h": round(slope, 1), "rss_bound_mib_per_h": cfg.rss_mib_per_h,
            "fds_start": round(fd0, 1), "fds_end": round(fd1, 1), "fds_bound": cfg.fds,
            "grew": slope > cfg.rss_mib_per_h or (fd1 - fd0) > cfg.fds,
            "seconds_judged": round(pts[-1]["t"] - pts[0]["t"], 1)}


def run_soak(cfg: SoakConfig) -> dict:
    from rlsync.hub import ClientConfig, HubClient, ManifestConfig
    from rlsync.hub.dataplane.config import DataPlaneConfig
    from rlsync.hub.tools.demo import start_hub_process
    from rlsync.hub.tools.fakes import digest, make_model
    from rlsync.hub.tools.procs import WorkerProcess, close_all
    from rlsync.trainer import free_port

    port = free_port()
    tmp = tempfile.mkdtemp(prefix="rlsync-soak-")
    hub, address, token = start_hub_process(tmp, port=port, worker_timeout_s=5.0)
    ccfg = ClientConfig(dataplane=DataPlaneConfig(io_timeout_s=5.0), hub_deadline_s=30.0, heartbeat_s=0.5,
                        manifest=ManifestConfig(chunk_bytes=256 << 10), transport="tcp-py")
    samples: dict[str, list[dict]] = {}
    hub_life = 0
    counts = {"fetches_ok": 0, "fetches_failed": 0, "torn": 0, "publishes": 0, "publish_errors": 0,
              "churn_joins": 0, "hub_restarts": 0}
    errors: dict[str, int] = {}
    expected: dict[int, str] = {}
    workers: list[WorkerProcess] = []
    t_start = time.monotonic()

    def collect(w: WorkerProcess) -> None:
        try:
            results = w.call("loop_results", timeout=60)
        except Exception:  # noqa: BLE001 - a killed churn reader's last results are gone with it
            return
        for r in results:
            if not r["ok"]:
                counts["fetches_failed"] += 1
                errors[r["error"]] = errors.get(r["error"], 0) + 1
                continue
            want = expected.get(r["version"])
            if want is None:
                want = expected[r["version"]] = digest(make_model(cfg.size_mb, seed=r["version"]).tensors)
            counts["fetches_ok" if r["digest"] == want else "torn"] += 1

    def sample(name: str, pid: int) -> None:
        got = proc_sample(pid)
        if got is not None:
            samples.setdefault(name, []).append({"t": round(time.monotonic() - t_start, 2),
                                                 "rss_mib": round(got[0], 2), "fds": got[1]})

    def reader(name: str, host: str) -> WorkerProcess:
        w = WorkerProcess(address, token, ccfg, name=name)
        workers.append(w)
        w.join(host=host)
        w.call("fetch_loop", model="policy", pause_s=0.05)
        return w

    try:
        trainer = WorkerProcess(address, token, ccfg, name="trainer")
        workers.append(trainer)
        trainer.join(host="trainer")
        trainer.call("publish_loop", model="policy", size_mb=cfg.size_mb, period_s=cfg.period_s)
        pool = [reader(f"reader{i}", f"node{i}") for i in range(cfg.readers)]
        churn, churn_n = None, 0
        end = t_start + cfg.minutes * 60
        next_sample = next_churn = time.monotonic()
        next_restart = time.monotonic() + cfg.restart_every_s
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_sample:
                sample(f"hub#{hub_life}", hub.pid)
                sample("trainer", trainer.proc.pid)
                for w in pool:
                    sample(w.name, w.proc.pid)
                for w in pool:
                    collect(w)
                next_sample = now + cfg.sample_every_s
            if now >= next_churn:
                if churn is not None:
                    collect(churn)
                    if churn_n % 2:
                        churn.call("stop_loop")
                        churn.call("leave", deadline_s=5.0)
                        churn.close()
                    else:
                        churn.kill()
                    workers.remove(churn)
                churn_n += 1
                churn = reader(f"churn{churn_n}", f"churn{churn_n % 3}")
                counts["churn_joins"] += 1
                next_churn = now + cfg.churn_every_s
            if now >= next_restart:
                if counts["hub_restarts"] % 2 == 0:
                    hub.send_signal(signal.SIGTERM)
                    rc = hub.wait(30)
                    if rc != 0:
                        errors["hub_sigterm_exit_nonzero"] = errors.get("hub_sigterm_exit_nonzero", 0) + 1
                else:
                    hub.kill()
                    hub.wait()
                hub, _, _ = start_hub_process(tmp, port=port, worker_timeout_s=5.0)
                hub_life += 1
                counts["hub_restarts"] += 1
                next_restart = time.monotonic() + cfg.restart_every_s
            time.sleep(max(0.0, min(next_sample, next_churn, next_restart, end) - time.monotonic()))
        for w in pool + ([churn] if churn else []):
            w.call("stop_loop")
            collect(w)
        trainer.call("stop_loop")
        for r in trainer.call("loop_results"):
            counts["publishes" if r["ok"] else "publish_errors"] += 1
        stats = HubClient(address, token).stats()
    finally:
        close_all(workers)
        hub.send_signal(signal.SIGTERM)
        try:
            hub.wait(30)
        except Exception:  # noqa: BLE001
            hub.kill()
    verdicts = {name: judge(series, cfg) for name, series in samples.items()}
    grew = sorted(n for n, v in verdicts.items() if v and v["grew"])
    return {"config": asdict(cfg), "counts": counts, "errors": errors, "verdicts": verdicts, "grew": grew,
            "seconds": round(time.monotonic() - t_start, 1), "load_avg_end": os.getloadavg(),
            "hub_stats_end": {k: stats[k] for k in ("workers", "replicas", "fetches")},
            "samples": samples}


def plot(res: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_rss, ax_fd) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for name, series in sorted(res["samples"].items()):
        style = dict(color="black", lw=1) if name.startswith("hub#") else dict(lw=1)
        label = "hub (each lifetime)" if name == "hub#0" else (None if name.startswith("hub#") else name)
        t = [s["t"] / 60 for s in series]
        ax_rss.plot(t, [s["rss_mib"] for s in series], label=label, **style)
        ax_fd.plot(t, [s["fds"] for s in series], label=label, **style)
    ax_rss.set_ylabel("RSS (MiB)")
    ax_fd.set_ylabel("open fds")
    ax_fd.set_xlabel("minutes")
    ax_rss.legend(loc="upper left", fontsize=8)
    c = res["counts"]
    ax_rss.set_title(f"rlsync soak: {res['seconds'] / 60:.0f} min, {c['fetches_ok']} fetches ok, "
                     f"{c['publishes']} publishes, {c['churn_joins']} churn joins, {c['hub_restarts']} hub restarts")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


@register_scenario("soak")
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsync.bench soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = SoakConfig()
    p.add_argument("--minutes", type=float, default=d.minutes)
    p.add_argument("--readers", type=int, default=d.readers)
    p.add_argument("--size-mb", type=float, default=d.size_mb)
    p.add_argument("--period", type=float, default=d.period_s)
    p.add_argument("--churn-every", type=float, default=d.churn_every_s)
    p.add_argument("--restart-every", type=float, default=d.restart_every_s)
    p.add_argument("--sample-every", type=float, default=d.sample_every_s)
    p.add_argument("--warmup-s", type=float, default=d.warmup_s)
    p.add_argument("--rss-mib-per-h", type=float, default=d.rss_mib_per_h)
    p.add_argument("--rejudge", default=None, help="judge the samples of an earlier soak.json again, run nothing")
    p.add_argument("--fds", type=int, default=d.fds)
    p.add_argument("--out", default="soak-out", help="directory for soak.json and soak.png")
    a = p.parse_args(argv)
    cfg = SoakConfig(minutes=a.minutes, readers=a.readers, size_mb=a.size_mb, period_s=a.period,
                     churn_every_s=a.churn_every, restart_every_s=a.restart_every, sample_every_s=a.sample_every,
                     warmup_s=a.warmup_s, rss_mib_per_h=a.rss_mib_per_h, fds=a.fds)
    os.makedirs(a.out, exist_ok=True)
    if a.rejudge:
        with open(a.rejudge) as f:
            res = json.load(f)
        res["verdicts"] = {name: judge(series, cfg) for name, series in res["samples"].items()}
        res["grew"] = sorted(n for n, v in res["verdicts"].items() if v and v["grew"])
    else:
        def interrupt(*_):
            raise KeyboardInterrupt  # SIGTERM: the same clean-up as Ctrl-C (workers and hub stopped)
        signal.signal(signal.SIGTERM, interrupt)
        load0 = os.getloadavg()
        res = run_soak(cfg)
        res["load_avg_start"] = load0
    with open(os.path.join(a.out, "soak.json"), "w") as f:
        json.dump(res, f, indent=1)
    plot(res, os.path.join(a.out, "soak.png"))
    print(f"counts  {res['counts']}")
    print(f"errors  {res['errors']}")
    for name, v in sorted(res["verdicts"].items()):
        if v is None:
            print(f"{name:10s} (too short to judge)")
            continue
        print(f"{name:10s} RSS {v['rss_start_mib']:7.1f} -> {v['rss_end_mib']:7.1f} MiB, slope "
              f"{v['rss_mib_per_h']:+6.1f} MiB/h (bound {v['rss_bound_mib_per_h']:.0f})  fds {v['fds_start']:.0f} -> "
              f"{v['fds_end']:.0f} (bound +{v['fds_bound']})  {'GREW' if v['grew'] else 'ok'}")
    print(f"wrote {a.out}/soak.json and {a.out}/soak.png; load avg {res.get('load_avg_start')} -> "
          f"{res['load_avg_end']}")
    if res["grew"] or res["counts"]["torn"]:
        print(f"FAIL: {'grew beyond the bound: ' + ', '.join(res['grew']) if res['grew'] else ''}"
              f"{' torn fetches: ' + str(res['counts']['torn']) if res['counts']['torn'] else ''}")
        return 1
    return 0
