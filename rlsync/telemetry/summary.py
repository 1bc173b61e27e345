"""The end-of-run summary table: what the run learned, where its worker-seconds went, what happened.

    rows = read_jsonl(run_dir / "metrics.jsonl")
    print_run_summary(run_summary(rows, totals=driver.totals, wall_s=312.0, status="done"))

`run_summary` is pure (rows of `metrics.jsonl` and the driver's running totals in, sections of
(item, value) out), so the table is tested without a run. Sections:
- learning: reward (mean over the first and the last 10 steps; first and last step), steps, versions;
- stall: worker-seconds per cause summed over the run, with their share of all stall. The causes are
  named for what they are: `rollout_wait_weights` is rollouts waiting for the trainer's next version
  (the staleness bound), not a slow transfer; moving and loading the bytes is `rollout_load_weights`
  (one state: an HF engine receives straight into its live parameters, so transfer and apply are one);
- events: only the ones that happened (preemptions, joins, workers attached, workers lost, trainer ranks
  lost or joined, failed rollout requests, samples dropped as too stale); "none" when nothing did;
- off-policy (when the run logged it): samples dropped past the version-age cap as a share of samples
  generated, mixed-version samples, spans per sample, tokens corrected, the correction's clip fraction,
  and the engines' decode pause per update when they report `sync/decode_pause_s`;
- time: wall seconds and weight bytes moved. A resumed run (`resume=auto`; RUN_DIR/parts.json, record.py) has
  one line per part (its steps, the step it resumed from, its wall time) and their sum; the learning and
  stall sections cover the whole run, since a resumed run's metrics.jsonl holds every step once.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from rich.console import Console
from rich.table import Table

from rlsync.telemetry.loggers import read_jsonl
from rlsync.telemetry.metrics import STALL_CAUSE_KEYS
from rlsync.telemetry.record import read_parts

__all__ = ["STALL_NAMES", "EVENT_NAMES", "run_summary", "summarize_run", "summary_table", "print_run_summary"]

STALL_NAMES: dict[str, str] = {
    "stall/rollout_wait_weights_s": "rollout: waiting for the next version",
    "stall/rollout_load_weights_s": "rollout: transferring + applying weights",
    "stall/rollout_idle_s": "rollout: idle / paused (no request)",
    "stall/rollout_wait_data_s": "rollout: waiting for data",
    "stall/rollout_wait_release_s": "rollout: releasing weights",
    "stall/rollout_offload_s": "rollout: offloading (retention)",
    "stall/trainer_wait_data_s": "trainer: waiting for samples",
    "stall/trainer_wait_weights_s": "trainer: waiting for weights",
    "stall/trainer_load_weights_s": "trainer: loading weights",
    "stall/trainer_wait_release_s": "trainer: waiting for readers to release",
    "stall/trainer_offload_s": "trainer: offloading (retention)",
    "stall/trainer_idle_s": "trainer: idle / paused",
}
"""Every stall cause key (metrics.STALL_CAUSE_KEYS) in words."""

EVENT_NAMES: dict[str, str] = {
    "events/preemptions_notice": "preemptions with notice",
    "events/preemptions_kill": "preemptions without notice",
    "events/joins": "joins scheduled",
    "events/joined": "workers joined",
    "events/join_failures": "joins failed",
    "events/left": "workers left",
    "events/attached": "workers attached (pools join)",
    "events/died": "workers died",
    "events/trainer_lost": "trainer ranks lost",
    "events/trainer_joined": "trainer ranks joined",
    "pool/failed_requests": "rollout requests failed",
    "pool/lost_prompts": "prompts lost with a worker",
    "staleness/dropped_total": "samples dropped (too stale)",
}
"""Counters the table shows when non-zero: per-step `events/*` summed over the rows, the rest from totals."""
_FROM_TOTALS = ("pool/failed_requests", "pool/lost_prompts", "staleness/dropped_total")


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _fmt_s(s: float) -> str:
    """`42 s`, `6 min 0 s`: whole seconds first, then split (rounding the remainder alone printed `6 min 60 s`)."""
    t = round(s)
    return f"{t} s" if t < 120 else f"{t // 60} min {t % 60} s"


def run_summary(rows: Sequence[Mapping[str, Any]], totals: Mapping[str, float] | None = None,
                wall_s: float | None = None, status: str = "done",
                parts: Sequence[Mapping[str, Any]] = ()) -> dict[str, list[tuple[str, str]]]:
    """Sections of (item, value) for the table, from the run's metric rows (one per step), the driver's totals and
    the run's parts (parts.json; more than one when it was resumed: then they give the wall times, not `wall_s`)."""
    totals = totals or {}
    resumed = [p for p in parts if p.get("resumed_from_step") is not None]
    rows = [r for r in rows if "step" in r]
    out: dict[str, list[tuple[str, str]]] = {}
    rewards = [float(r["reward/mean"]) for r in rows if isinstance(r.get("reward/mean"), (int, float))]
    learn = [("status", status), ("steps", str(int(rows[-1]["step"])) if rows else "0")]
    if rows and "version" in rows[-1]:
        learn.append(("versions published", f"{int(rows[-1]['version'])} (+ the initial one)"))
    if rewards:
        learn.append(("reward, mean of first / last 10 steps", f"{_mean(rewards[:10]):.3f} -> {_mean(rewards[-10:]):.3f}"))
        learn.append(("reward, first / last step", f"{rewards[0]:.3f} -> {rewards[-1]:.3f}"))
    if resumed:
        learn.append(("resumed from step", ", ".join(str(p["resumed_from_step"]) for p in resumed)))
    out["learning"] = learn

    stall = {k: sum(float(r.get(k, 0.0) or 0.0) for r in rows) for k in STALL_CAUSE_KEYS}
    total = sum(stall.values())
    ranked = sorted(((v, k) for k, v in stall.items() if v > 0), reverse=True)
    out["stall (worker-seconds over the run)"] = (
        [(STALL_NAMES.get(k, k), f"{v:.1f} s ({100 * v / total:.0f}%)") for v, k in ranked]
        + [("all stall", f"{total:.1f} s")]) if total > 0 else [("all stall", "0 s")]

    events = {k: sum(float(r.get(k, 0.0) or 0.0) for r in rows) for k in EVENT_NAMES if k not in _FROM_TOTALS}
    events.update({k: float(totals.get(k, 0.0)) for k in _FROM_TOTALS})
    # events/preemptions is the sum of the two kinds shown; events/* counters a newer pool policy adds still show
    other_keys = sorted({k for r in rows for k in r if k.startswith("events/")} - set(EVENT_NAMES)
                        - {"events/preemptions"})
    happened = [(EVENT_NAMES[k], f"{v:.0f}") for k, v in events.items() if v >= 0.5]
    for k in other_keys:
        if (v := sum(float(r.get(k, 0.0) or 0.0) for r in rows)) >= 0.5:
            happened.append((k.removeprefix("events/").replace("_", " "), f"{v:.0f}"))
    out["events"] = happened or [("none", "no preemption, join, failure or dropped sample")]

    if off := _off_policy(rows, totals):
        out["off-policy"] = off

    t = []
    if resumed:
        for p in parts:
            steps = f"steps {p['first_step']}-{p['last_step']}" if p["last_step"] >= p["first_step"] else "no step"
            what = f"part {p['part']}: {steps}"
            if p.get("resumed_from_step") is not None:
                what += f", resumed from step {p['resumed_from_step']}"
            t.append((what, _fmt_s(p["wall_s"]) if p.get("wall_s") is not None else "ended without a record"))
        t.append(("wall time, all parts", _fmt_s(sum(p.get("wall_s") or 0.0 for p in parts))))
    elif wall_s is not None:
        t.append(("wall time", _fmt_s(wall_s)))
    sync = totals.get("sync/bytes", sum(float(r.get("sync/bytes", 0.0) or 0.0) for r in rows))
    t.append(("weight bytes fetched by workers", f"{sync / 1e6:.1f} MB"))
    out["time"] = t
    return out


def _off_policy(rows: Sequence[Mapping[str, Any]], totals: Mapping[str, float]) -> list[tuple[str, str]]:
    """The off-policy section's items; empty when the run logged none of its keys."""
    def col(k: str) -> list[float]:
        return [float(r[k]) for r in rows if isinstance(r.get(k), (int, float)) and math.isfinite(float(r[k]))]

    out = []
    generated = sum(col("staleness/generated"))
    if generated > 0:
        dropped = float(totals.get("staleness/dropped_total", sum(col("staleness/dropped"))))
        out.append(("samples dropped past the version-age cap",
                    f"{dropped:.0f} of {generated:.0f} ({100 * dropped / generated:.2f}%)"))
    if mixed := col("offpolicy/mixed_sample_frac"):
        out.append(("mixed-version samples (mean per step)", f"{100 * _mean(mixed):.1f}%"))
        out.append(("version spans per sample", f"{_mean(col('offpolicy/spans_per_sample')):.2f}"))
    if corrected := col("offpolicy/corrected_token_frac"):
        out.append(("tokens corrected (sampled by an older version)", f"{100 * _mean(corrected):.1f}%"))
        # the clip fraction of the steps that corrected anything (the others report 0)
        clip = [float(r["offpolicy/clip_frac"]) for r in rows
                if r.get("offpolicy/corrected_token_frac", 0) and "offpolicy/clip_frac" in r]
        out.append(("correction clip fraction (ratio beyond the cap)", f"{100 * _mean(clip):.2f}%" if clip else "-"))
    if pause := col("sync/decode_pause_s"):  # engines that switch versions mid-generation report it
        updates = sum(col("sync/engine_updates"))
        out.append(("decode pause per update", f"{1e3 * sum(pause) / updates:.1f} ms" if updates else "-"))
    return out


def summary_table(sections: Mapping[str, Sequence[tuple[str, str]]], title: str = "run summary") -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("item")
    table.add_column("value", justify="right")
    for i, (name, items) in enumerate(sections.items()):
        if i:
            table.add_section()
        table.add_row(f"[bold]{name}[/bold]", "")
        for k, v in items:
            table.add_row(f"  {k}", v)
    return table


def print_run_summary(sections: Mapping[str, Sequence[tuple[str, str]]], console: Console | None = None,
                      title: str = "run summary") -> None:
    """Draw the table on `console` (default: stdout; plain text when that is a file)."""
    (console or Console(width=None if sys.stdout.isatty() else 110)).print(summary_table(sections, title))


def summarize_run(run_dir: str | os.PathLike, totals: Mapping[str, float] | None, wall_s: float | None,
                  status: str = "done") -> dict[str, list[tuple[str, str]]]:
    """`run_summary` of RUN_DIR/metrics.jsonl and parts.json (no rows when the run logged none)."""
    path = Path(run_dir) / "metrics.jsonl"
    return run_summary(read_jsonl(path) if path.exists() else [], totals, wall_s, status, parts=read_parts(run_dir))
