"""`python -m rlsync.bench seeds`: a recipe on several seeds, one after another; the final rewards side by side.

    python -m rlsync.bench seeds                                   # grpo_standalone, seeds 0-4
    python -m rlsync.bench seeds --recipe grpo_elastic --seeds 0 1 2 --out runs/seeds -- steps=300

Each seed is a real `python -m rlsync.train +recipe=R seed=S task.seed=S` (its own Ray cluster), run dir
`OUT/seed_S`. Printed per seed: mean reward over the first 5 and the last 10 steps, the first step at
which the 10-step mean reached `--target`, wall time; then the median, min and max of the last-10
means and how many seeds reached the target, with the machine's load average beside them.
Overrides after `--` go to every run. A benchmark: it reports, it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rlsync.bench import register_scenario
from rlsync.telemetry.loggers import read_jsonl


def summarize(rows: list[dict], target: float) -> dict[str, float | int | None]:
    """first-5 mean, last-10 mean, first step whose trailing 10-step mean >= target (None: never)."""
    r = [x["reward/mean"] for x in rows]
    reached = next((rows[i]["step"] for i in range(9, len(r)) if sum(r[i - 9:i + 1]) / 10 >= target), None)
    return {"steps": len(r), "first5": sum(r[:5]) / max(1, len(r[:5])), "last10": sum(r[-10:]) / max(1, len(r[-10:])),
            "reached_at": reached}


@register_scenario("seeds")
def seeds_main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        argv, extra = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    p = argparse.ArgumentParser(prog="python -m rlsync.bench seeds", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="grpo_standalone")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--out", default="runs/bench_seeds", help="run dirs go to OUT/seed_S")
    p.add_argument("--target", type=float, default=0.8, help="reward the 10-step mean should reach")
    p.add_argument("--json", default=None, help="also write the results here")
    a = p.parse_args(argv)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": os.environ.get("WANDB_MODE", "offline")}
    results = []
    for s in a.seeds:
        run_dir = Path(a.out).resolve() / f"seed_{s}"
        cmd = [sys.executable, "-m", "rlsync.train", f"+recipe={a.recipe}", f"seed={s}", f"task.seed={s}",
               f"run_dir={run_dir}", f"hydra.run.dir={run_dir}/hydra", "progress=false", *extra]
        t0, load0 = time.monotonic(), os.getloadavg()[0]
        p_ = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall, load1 = time.monotonic() - t0, os.getloadavg()[0]
        if p_.returncode != 0:
            print(f"seed {s}: exit {p_.returncode}: {p_.stderr.strip().splitlines()[-1:]}", flush=True)
            results.append({"seed": s, "error": p_.returncode})
            continue
        res = {"seed": s, **summarize(read_jsonl(run_dir / "metrics.jsonl"), a.target), "wall_s": wall,
               "load": (load0, load1), "run_dir": str(run_dir)}
        results.append(res)
        print(f"seed {s}: reward first 5 {res['first5']:.3f} -> last 10 {res['last10']:.3f}; 10-step mean >= "
              f"{a.target} at step {res['reached_at']}; {wall:.0f} s (load {load0:.0f} -> {load1:.0f})", flush=True)
    ok = [r for r in results if "last10" in r]
    if ok:
        last = [r["last10"] for r in ok]
        print(f"{a.recipe} {' '.join(extra)}: last-10 mean reward over {len(ok)} seeds: median {statistics.median(last):.3f}, "
              f"min {min(last):.3f}, max {max(last):.3f}; {sum(x >= a.target for x in last)}/{len(results)} seeds >= {a.target}")
        print("final rewards: " + " ".join(f"{x:.3f}" for x in last))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0 if ok and len(ok) == len(results) else 1
