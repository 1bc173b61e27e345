"""A run's report: plots of its stall, reward and sync, on one HTML page (`build_report(run_dir)`).

Reads `RUN_DIR/metrics.jsonl` (JsonlLogger) and `RUN_DIR/trace.json` (TraceWriter), writes to
`RUN_DIR/report/`: `stall_by_cause.png` (stall per step stacked by cause), `idle_ratio.png`,
`reward.png`, `eval.png` (held-out greedy eval, `eval/*`, when the run has one), `sync.png` (GB/s per step), `timeline.png` (every worker's states over time) and
`index.html`, which embeds the PNGs inline so the page is one file you can send. Plots whose data
is absent are skipped and named on the page. Its CLI is `python -m rlsync.report RUN_DIR` (rlsync/report.py).
"""

from __future__ import annotations

import base64
import html
import logging
import math
from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rlsync.telemetry.loggers import read_jsonl  # noqa: E402
from rlsync.telemetry.metrics import CAUSES, STALL_CAUSE_KEYS  # noqa: E402
from rlsync.core.stall import State  # noqa: E402
from rlsync.telemetry.trace import load_trace  # noqa: E402

__all__ = ["build_report", "main"]

log = logging.getLogger(__name__)

STATE_PLOT_COLORS = {
    State.GENERATING.value: "#2ca02c",
    State.TRAINING.value: "#1f77b4",
    State.WAITING_WEIGHTS.value: "#d62728",
    State.LOADING_WEIGHTS.value: "#ff7f0e",
    State.WAITING_DATA.value: "#9467bd",
    State.RELEASING.value: "#8c564b",
    State.OFFLOADING.value: "#e377c2",
    State.IDLE.value: "#c7c7c7",
}


_CAUSE_STATE = {cause: state for state, cause in CAUSES.items()}


def _series(rows: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(r["step"])
            ys.append(float(v))
    return xs, ys


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


CAUSE_NAMES = {
    "wait_weights": "waiting for the next version",
    "load_weights": "transferring + applying weights",
    "wait_data": "waiting for samples",
    "wait_release": "releasing weights (readers draining)",
    "offload": "offloading (retention)",
    "idle": "idle / paused",
}
"""What each stall cause is, in words: `rollout_wait_weights` is mostly the trainer not having published
the version the staleness bound requires yet, not a slow transfer (that is `load_weights`)."""

MAX_BARS = 100
"""The stall chart bins steps so that it never draws more bars than this: readable at any run length."""

HOW_TO_READ = {
    "Stall per step by cause": "Each bar is the mean stall per step over a bin of steps (bin size in the title), "
                               "stacked by cause; the higher the bar, the more worker-seconds per step went unused.",
    "Idle ratio per side": "Share of each side's observed time spent not generating / not training, per step; "
                           "0 is fully busy.",
    "Reward": "Mean reward of the samples trained at each step; it should rise.",
    "Sync throughput": "Weight bytes moved per second of transfer in each step (GB/s).",
    "Worker timeline": "One row per worker, coloured by state over wall time; thin lines mark step ends.",
}


def stall_bins(rows: Sequence[dict[str, Any]], keys: Sequence[str], max_bars: int = MAX_BARS
               ) -> tuple[int, list[int], dict[str, list[float]]]:
    """(bin size, first step of each bin, per key the mean per step over each bin): every step counted.

        stall_bins(rows_of_steps_1_to_250, keys)   # -> (3, [1, 4, 7, ...], {...}): 84 bars, not 250
    """
    steps = sorted({r["step"] for r in rows if any(k in r for k in keys)})
    if not steps:
        return 1, [], {k: [] for k in keys}
    size = max(1, math.ceil((steps[-1] - steps[0] + 1) / max_bars))
    by_step = {r["step"]: r for r in rows}
    starts = list(range(steps[0], steps[-1] + 1, size))
    means: dict[str, list[float]] = {k: [] for k in keys}
    for s0 in starts:
        in_bin = [by_step[s] for s in range(s0, s0 + size) if s in by_step]
        for k in keys:
            vals = [float(r.get(k) or 0.0) for r in in_bin]
            means[k].append(sum(vals) / len(vals) if vals else 0.0)
    return size, starts, means


def plot_stall(rows: Sequence[dict[str, Any]], out: Path) -> Path | None:
    keys = [k for k in STALL_CAUSE_KEYS if any(r.get(k) for r in rows)]
    if not keys:
        return None
    size, starts, means = stall_bins(rows, keys)
    fig, ax = plt.subplots(figsize=(9, 4))
    bottom = [0.0] * len(starts)
    for k in keys:
        vals = means[k]
        side, _, cause = k.removeprefix("stall/").removesuffix("_s").partition("_")
        # Same colour per state as the timeline; trainer causes hatched.
        ax.bar(starts, vals, bottom=bottom, label=f"{side}: {CAUSE_NAMES.get(cause, cause)}", width=0.9 * size,
               align="edge", color=STATE_PLOT_COLORS[_CAUSE_STATE[cause]],
               hatch="//" if side == "trainer" else None, edgecolor="white", linewidth=0.3)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xlabel("step")
    ax.set_ylabel("stall per step (worker-seconds)")
    ax.set_title("Stall per step by cause" + (f" (mean over bins of {size} steps)" if size > 1 else " (every step)"))
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, out / "stall_by_cause.png")


def plot_lines(rows, keys: Sequence[str], title: str, ylabel: str, path: Path,
               ylim: tuple[float | None, float | None] = (None, None)) -> Path | None:
    present = [(k, *_series(rows, k)) for k in keys]
    present = [p for p in present if p[1]]
    if not present:
        return None
    fig, ax = plt.subplots(figsize=(9, 3.5))
    for k, xs, ys in present:
        ax.plot(xs, ys, marker="." if len(xs) < 50 else None, label=k)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_ylim(*ylim)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def reward_keys(rows: Sequence[dict[str, Any]]) -> list[str]:
    keys = sorted({k for r in rows for k in r if "reward" in k})
    return ["reward/mean"] if "reward/mean" in keys else keys[:4]


def plot_timeline(trace: dict[str, Any], path: Path, max_tracks: int = 64) -> Path | None:
    events = trace.get("traceEvents", [])
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    tracks: dict[tuple[int, int], list[tuple[float, float, str]]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "state":
            tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"] / 1e6, e["dur"] / 1e6, e["name"]))
    if not tracks:
        return None
    order = sorted(tracks)[:max_tracks]
    steps = [e for e in events if e.get("ph") == "X" and e.get("cat") == "step"]
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(order) + 1.6))
    for row, key in enumerate(order):
        by_state: dict[str, list[tuple[float, float]]] = {}
        for start, dur, state in tracks[key]:
            by_state.setdefault(state, []).append((start, dur))
        for state, spans in by_state.items():
            ax.broken_barh(spans, (row - 0.4, 0.8), color=STATE_PLOT_COLORS.get(state, "k"))
    for s in steps:
        ax.axvline(s["ts"] / 1e6, color="k", lw=0.5, alpha=0.3)
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels([f"{procs.get(p, p)}: {threads.get((p, t), t)}" for p, t in order], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since trace start (thin lines: step ends)")
    ax.set_title("Worker timeline")
    seen = {st for k in order for _, _, st in tracks[k]}
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for s, c in STATE_PLOT_COLORS.items() if s in seen]
    ax.legend(handles, [s for s in STATE_PLOT_COLORS if s in seen], fontsize=8, ncol=4,
              loc="upper center", bbox_to_anchor=(0.5, -0.25 if len(order) < 4 else -0.1))
    return _save(fig, path)


def _summary(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    def mean(k: str) -> str:
        _, ys = _series(rows, k)
        return f"{sum(ys) / len(ys):.3f}" if ys else "-"

    rk = reward_keys(rows)
    last_reward = _series(rows, rk[0])[1][-1:] if rk else []
    return [
        ("steps", str(len({r['step'] for r in rows}))),
        ("mean stall/total_s per step", mean("stall/total_s")),
        ("mean stall/rollout_wait_weights_s", mean("stall/rollout_wait_weights_s")),
        ("mean stall/trainer_wait_data_s", mean("stall/trainer_wait_data_s")),
        ("mean stall/rollout_idle_ratio", mean("stall/rollout_idle_ratio")),
        ("mean stall/trainer_idle_ratio", mean("stall/trainer_idle_ratio")),
        ("mean sync/gbps (GB/s)", mean("sync/gbps")),
        (f"last {rk[0]}" if rk else "last reward", f"{last_reward[0]:.3f}" if last_reward else "-"),
    ]


def build_report(run_dir: str | Path) -> Path:
    """Write RUN_DIR/report/*.png and index.html; returns the index path."""
    run_dir = Path(run_dir)
    out = run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    metrics_path, trace_path = run_dir / "metrics.jsonl", run_dir / "trace.json"
    rows = read_jsonl(metrics_path) if metrics_path.exists() else []
    trace = load_trace(trace_path) if trace_path.exists() else {}
    if not rows and not trace:
        raise FileNotFoundError(f"{run_dir} has neither metrics.jsonl nor trace.json")

    plots: list[tuple[str, Path | None]] = [
        ("Stall per step by cause", plot_stall(rows, out)),
        ("Idle ratio per side", plot_lines(rows, ["stall/rollout_idle_ratio", "stall/trainer_idle_ratio"],
                                           "Idle ratio (non-productive / observed)", "ratio",
                                           out / "idle_ratio.png", ylim=(0, 1.05))),
        ("Reward", plot_lines(rows, reward_keys(rows), "Reward", "reward", out / "reward.png")),
        ("Sync throughput", plot_lines(rows, ["sync/gbps"], "Weight sync throughput (sync/gbps)", "GB/s",
                                       out / "sync.png", ylim=(0, None))),
        ("Worker timeline", plot_timeline(trace, out / "timeline.png") if trace else None),
    ]
    if any(k.startswith("eval/") for r in rows for k in r):  # only runs with `eval.every` > 0 have one
        plots.insert(3, ("Held-out eval (greedy)", plot_lines(rows, ["eval/reward_mean", "eval/accuracy"],
                                                              "Held-out eval (greedy)", "eval", out / "eval.png",
                                                              ylim=(0, 1.05))))
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>rlsync report: {html.escape(run_dir.name)}</title>",
        "<style>body{font-family:sans-serif;max-width:1150px;margin:auto}"
        "td,th{padding:2px 10px;text-align:left}img{max-width:100%}</style></head><body>",
        f"<h1>rlsync run {html.escape(str(run_dir))}</h1><table>",
    ]
    parts += [f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in _summary(rows)]
    parts.append("</table>")
    for title, path in plots:
        parts.append(f"<h2>{html.escape(title)}</h2>")
        if title in HOW_TO_READ:
            parts.append(f"<p><i>How to read: {html.escape(HOW_TO_READ[title])}</i></p>")
        if path is None:
            parts.append("<p><i>no data for this plot in the run</i></p>")
        else:
            b64 = base64.b64encode(path.read_bytes()).decode()
            parts.append(f"<img alt='{html.escape(title)}' src='data:image/png;base64,{b64}'>")
    parts.append("</body></html>")
    index = out / "index.html"
    index.write_text("\n".join(parts), encoding="utf-8")
    return index

