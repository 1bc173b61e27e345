"""`python -m rlsync.bench real_sync`: weight-sync stall of the real loop under the three `sync.mode`s.

    python -m rlsync.bench real_sync [--recipe grpo_real] [--steps 6] [--out runs/real_sync] [--json [F]]
                                     [--modes hub,object_store,broadcast] [--inflight hub] [-- OVERRIDE ...]

Runs the recipe once per mode (`python -m rlsync.train +recipe=R sync.mode=M steps=N`, same model,
task and seeds, one process each, one after the other). The modes named by `--inflight` (default: the
hub) run with `sync.inflight=true`: the engines stage each version while they generate and swap it in
between two decode steps; the baselines keep their own pause-and-reload, as verl and OpenRLHF do. The
mode `hub_drained` is the hub with in-flight off (today's drained apply), for a side-by-side. Then it
sums from each run's metrics.jsonl:

- trainer sync stall = Σ `stall/trainer_offload_s` + `stall/trainer_wait_release_s` (gather + put,
  the broadcast collective, or the hub's release);
- engine transfer stall = Σ `stall/rollout_load_weights_s` (bytes moving into an engine and its reload);
- engine wait stall = Σ `stall/rollout_wait_weights_s` (version not there yet, or a broadcast waiting
  for every member);
- decode pause = Σ `sync/decode_pause_s` (in-flight switches: the engine's reference swap);
- **rollout-visible weight-sync stall** = trainer sync + engine transfer + decode pause: what generation
  stops for because weights move (a swap made between two calls is counted twice, in engine transfer and
  in decode pause: milliseconds, against the hub); `stall_ratio_<mode>_vs_hub` = mode's / hub's;
- total weight-sync stall = trainer sync + engine transfer + engine wait; ratio = mode's total / hub's total;
- bytes = Σ `sync/bytes`; wall seconds of the run; the machine's load average before and after.

Writes OUT/real_sync.json, OUT/real_sync.md (the table) and OUT/real_sync.png. A benchmark: it
asserts nothing; the figures are ratios against the hub run of the same invocation.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from . import register_scenario

log = logging.getLogger(__name__)

MODES = ("hub", "object_store", "broadcast")
TRAINER_KEYS = ("stall/trainer_offload_s", "stall/trainer_wait_release_s")


def summarize(rows: list[dict]) -> dict[str, float]:
    steps = [r for r in rows if "version" in r]

    def tot(*keys):
        return sum(float(r.get(k, 0.0)) for r in steps for k in keys)

    out = {"steps": len(steps), "trainer_sync_s": tot(*TRAINER_KEYS),
           "engine_transfer_s": tot("stall/rollout_load_weights_s"),
           "engine_wait_s": tot("stall/rollout_wait_weights_s"), "bytes": tot("sync/bytes"),
           "step_s_mean": tot("timing_s/step") / max(1, len(steps)),
           "weight_like_tensors": max([float(r.get("ray/weight_like_tensors", 0)) for r in steps] or [0])}
    out["decode_pause_s"] = tot("sync/decode_pause_s")
    out["total_sync_stall_s"] = out["trainer_sync_s"] + out["engine_transfer_s"] + out["engine_wait_s"]
    out["rollout_visible_stall_s"] = out["trainer_sync_s"] + out["engine_transfer_s"] + out["decode_pause_s"]
    out["dropped"] = tot("staleness/dropped")
    out["transfer_stall_s"] = out["trainer_sync_s"] + out["engine_transfer_s"]
    evals = [r for r in rows if "eval/reward_mean" in r]
    if evals:
        out["eval_first"], out["eval_last"] = evals[0]["eval/reward_mean"], evals[-1]["eval/reward_mean"]
    rewards = [r["reward/mean"] for r in steps if "reward/mean" in r]
    if rewards:
        out["reward_first"], out["reward_last"] = rewards[0], rewards[-1]
    return out


def run_mode(mode: str, recipe: str, steps: int, out: Path, overrides: list[str], timeout_s: float,
             inflight: bool = False) -> dict:
    run_dir = out / mode
    sync_mode = "hub" if mode == "hub_drained" else mode
    cmd = [sys.executable, "-m", "rlsync.train", f"+recipe={recipe}", f"sync.mode={sync_mode}", f"steps={steps}",
           f"sync.inflight={'true' if inflight else 'false'}", f"hydra.run.dir={run_dir}", "progress=false", *overrides]
    log.info("real_sync: %s", " ".join(cmd))
    load_before = os.getloadavg()
    t0 = time.monotonic()
    proc = subprocess.run(cmd, timeout=timeout_s, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"sync.mode={mode} run failed ({proc.returncode}):\n{tail}")
    from rlsync.telemetry.loggers import read_jsonl

    res = summarize(read_jsonl(run_dir / "metrics.jsonl"))
    res.update(mode=mode, inflight=inflight, wall_s=wall, run_dir=str(run_dir), loadavg_before=load_before,
               loadavg_after=os.getloadavg())
    return res


def table(results: list[dict], hub_total: float | None) -> str:
    lines = ["| mode | in flight | trainer sync s | engine transfer s | decode pause s | rollout-visible stall s | x hub | "
             "engine wait s | total sync stall s | x hub | GB moved | step s | wall s | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    hub = next((r for r in results if r["mode"] == "hub"), None)
    for r in results:
        ratio = f"{r['total_sync_stall_s'] / hub_total:.2f}" if hub_total else "-"
        vis = f"{r['rollout_visible_stall_s'] / hub['rollout_visible_stall_s']:.2f}" \
            if hub and hub["rollout_visible_stall_s"] else "-"
        lines.append(f"| {r['mode']} | {'yes' if r.get('inflight') else 'no'} | {r['trainer_sync_s']:.2f} | "
                     f"{r['engine_transfer_s']:.2f} | {r['decode_pause_s']:.3f} | {r['rollout_visible_stall_s']:.2f} | "
                     f"{vis} | {r['engine_wait_s']:.2f} | {r['total_sync_stall_s']:.2f} | {ratio} | "
                     f"{r['bytes'] / 1e9:.2f} | {r['step_s_mean']:.1f} | {r['wall_s']:.0f} | "
                     f"{r['loadavg_before'][0]:.1f} -> {r['loadavg_after'][0]:.1f} |")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = [r["mode"] for r in results]
    bottom = [0.0] * len(results)
    for key, label in (("trainer_sync_s", "trainer sync"), ("engine_transfer_s", "engine transfer"),
                       ("decode_pause_s", "decode pause (in flight)"), ("engine_wait_s", "engine wait")):
        vals = [r[key] for r in results]
        ax.bar(names, vals, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("worker-seconds over the run")
    ax.set_title("Weight-sync stall by sync.mode (same recipe, seeds, steps)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@register_scenario("real_sync")
def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlsync.bench real_sync", description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="grpo_real")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", default="runs/real_sync")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per mode's run")
    ap.add_argument("--inflight", default="hub", help="modes run with sync.inflight=true ('' for none)")
    ap.add_argument("--json", nargs="?", const="-", help="write the results as JSON to this file (no file: print them)")
    ap.add_argument("overrides", nargs="*", help="more overrides for every run (after --)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    inflight = set(filter(None, a.inflight.split(",")))
    results = [run_mode(m, a.recipe, a.steps, out, a.overrides, a.timeout, m in inflight) for m in a.modes.split(",")]
    load_after = os.getloadavg()
    hub = next((r for r in results if r["mode"] == "hub"), None)
    hub_total = hub["total_sync_stall_s"] if hub else None
    for r in results:
        r["ratio_vs_hub"] = r["total_sync_stall_s"] / hub_total if hub_total else None
        r["transfer_ratio_vs_hub"] = r["transfer_stall_s"] / hub["transfer_stall_s"] if hub and hub["transfer_stall_s"] else None
    doc = {"recipe": a.recipe, "steps": a.steps, "overrides": a.overrides, "results": results,
           "loadavg_before": load_before, "loadavg_after": load_after, "cpus": os.cpu_count()}
    for r in results:  # the keys: the rollout-visible stall of each baseline over the hub's
        if hub and r["mode"] != "hub" and hub["rollout_visible_stall_s"]:
            doc[f"stall_ratio_{r['mode']}_vs_hub"] = r["rollout_visible_stall_s"] / hub["rollout_visible_stall_s"]
    (out / "real_sync.json").write_text(json.dumps(doc, indent=1))
    md = (f"`python -m rlsync.bench real_sync --recipe {a.recipe} --steps {a.steps}"
          f"{' -- ' + ' '.join(a.overrides) if a.overrides else ''}` (load {load_before[0]:.1f} -> "
          f"{load_after[0]:.1f} on {os.cpu_count()} CPUs)\n\n" + table(results, hub_total))
    (out / "real_sync.md").write_text(md + "\n")
    plot(results, out / "real_sync.png")
    if a.json and a.json != "-":
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1) if a.json == "-" else md)
    return 0
