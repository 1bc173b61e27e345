"""`python -m rlsync.bench chaos_vllm_merge F... [--json OUT]`: chunks of a `chaos_vllm` sweep summed into one figure.

A sweep too long to hold the machine for (200 trials of a real engine) runs as chunks, each its own invocation and
JSON file (`chaos_vllm --seeds 1 --trials 25 --first-trial 25 --json F`); this sums them into the issue's keys
(`trials`, `seeds`, `trainer_hangs`, `failed_steps`, `unverified_samples_trained`) and the rest of the figures:
counters are summed, maxima taken, medians and means recomputed from every chunk's `trial_list`. A trial is
(seed, index); the same one in two chunks, or chunks of different `--kill`, are refused (a sum would lie).

    merged = merge([json.load(open(f)) for f in files])
    merged["trials"] == sum(len(c["trial_list"]) for c in chunks)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from collections import Counter

from . import register_scenario
from .chaos_vllm import split_medians

SUMMED = ("trainer_hangs", "failed_steps", "unverified_samples_trained", "unverified_samples_offered",
          "samples_trained", "trainer_steps", "other_engine_failures", "other_engine_fetches", "engine_hangs",
          "engine_deaths", "engine_died_unkilled")


class ChunkMismatch(ValueError):
    """Chunks that cannot be summed: different kinds of kill, or one trial in two chunks."""


def _stats(vals: list[float], name: str) -> dict:
    if not vals:
        return {}
    return {name: round(statistics.mean(vals), 2), f"{name}_p50": statistics.median(vals), f"{name}_max": max(vals)}


def merge(chunks: list[dict]) -> dict:
    """One figure from several `chaos_vllm` JSON results (each with its `trial_list`)."""
    kinds = {c.get("kill", "engine") for c in chunks}
    if len(kinds) != 1:
        raise ChunkMismatch(f"chunks of different kills {sorted(kinds)}: merge engine-kill and hub-kill runs apart")
    seen: dict[tuple[int, int], int] = {}
    trials: list[dict] = []
    for n, c in enumerate(chunks):
        for t in c["trial_list"]:
            if "index" not in t:
                raise ChunkMismatch(f"chunk {n} has trials without an index: re-run it with --trials/--first-trial")
            key = (t["seed"], t["index"])
            if key in seen:
                raise ChunkMismatch(f"trial {t['index']} of seed {t['seed']} is in chunks {seen[key]} and {n}: "
                                    "give each chunk its own --first-trial range")
            seen[key] = n
            trials.append(t)
    per_seed = Counter(t["seed"] for t in trials)
    res = {"kill": kinds.pop(), "chunks": len(chunks), "trials": len(trials), "seeds": sorted(per_seed),
           "trials_per_seed": {str(s): per_seed[s] for s in sorted(per_seed)}}
    for k in SUMMED:
        if any(k in c for c in chunks):
            res[k] = sum(c.get(k, 0) for c in chunks)
    behind = [t.get("versions_behind", 99) for t in trials]  # no rejoin sample at all counts as far behind
    res["rejoin_versions_behind_max"] = max(behind, default=None)
    res["rejoins_within_one_version"] = sum(b <= 1 for b in behind)
    res["killed_in"] = dict(sorted(Counter(t["killed_in"] for t in trials).items()))
    res.update(_stats([t["trial_s"] for t in trials], "trial_s"))
    loads = [t["load_1m"] for t in trials if "load_1m" in t]
    res["load_1m_min_max"] = [min(loads), max(loads)] if loads else None
    res["wall_s"] = round(sum(c.get("wall_s", 0.0) for c in chunks), 1)
    res["budget_hit_chunks"] = sum(bool(c.get("budget_hit")) for c in chunks)
    if res["kill"] == "engine":
        res["split_s"], res["start_parts_s"] = split_medians(trials), split_medians(trials, "start_parts")
        res.update(_stats([t["restart_s"] for t in trials if "restart_s" in t], "restart_s"))
    else:
        res.update(_stats([t["hub_down_s"] for t in trials if "hub_down_s" in t], "hub_down_s"))
        res.update(_stats([t["kill_to_sample_s"] for t in trials if "kill_to_sample_s" in t], "kill_to_sample_s"))
    return res


@register_scenario("chaos_vllm_merge")
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsync.bench chaos_vllm_merge", description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", help="`chaos_vllm --json` results, one per chunk")
    p.add_argument("--json", help="write the merged figures here")
    a = p.parse_args(argv)
    chunks = []
    for f in a.files:
        with open(f) as fh:
            chunks.append(json.load(fh))
    try:
        res = merge(chunks)
    except ChunkMismatch as e:
        p.error(str(e))
    print(json.dumps(res, indent=1))  # CLI output
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0
