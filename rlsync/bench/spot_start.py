"""`python -m rlsync.bench spot_start`: a spot joiner's time to first rollout, warm vs cold, in one run.

    python -m rlsync.bench spot_start [--rounds 1] [--json F]

One embedded hub; a peer in this process holds `policy` v1 (SmolLM2-135M's fp32 tensors, what a peer engine's
staging replica holds). Each round spawns, one after the other (one vLLM engine at a time), two joiner
processes (rlsync/bench/_spot_child.py), each with an empty $HOME of its own and no cache-dir overrides, so
every per-user cache starts empty, as on a fresh spot machine (vLLM's is ~/.cache/vllm; with eager execution
it holds `modelinfos/`, the result of a model-inspection subprocess that imports vLLM afresh, and `inductor/`,
torch's compile cache, which the engine keeps there: the sampler kernel vLLM compiles on the first generate):

- cold (today's joiner): vLLM reads the checkpoint from disk and makes its own start-up cache, then the engine
  takes `latest` from the peer and generates; afterwards it publishes its cache as a hub artifact and serves it;
- warm: takes that artifact from the cold joiner through the hub (rollout/vllm/engine_cache.py), starts vLLM
  with `load_format="dummy"` from a directory with no weights in it (config and tokenizer only), takes
  `latest` from the peer and generates.

Time to first rollout (TTFR) is from the process's spawn to its first rollout (4 greedy samples x 8 tokens),
timed here. Figures: TTFR of each, `ttfr_ratio_warm_vs_cold` (warm / cold, median over rounds), each
joiner's phases (imports, cache fetch, engine start, weights from peers, first rollout), and a check: the
warm joiner's greedy tokens equal the cold one's (it computes with the version, not its dummy weights).
Before the first round `import vllm` runs once, untimed, so both joiners find the same warm page cache.
The checkpoint is read from the page cache (this machine cannot drop it for one process): a fresh machine
reading 269 MB from its disk would make the cold joiner slower than here. Load average is written beside.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time

from . import register_scenario

log = logging.getLogger(__name__)


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


_CACHE_OVERRIDES = ("VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "HF_HOME",
                    "RLSYNC_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
"""Environment variables that would point a joiner at this machine's caches instead of its own empty home."""


def _spawn(mode: str, address: str, token: str, model_dir: str, home: str):
    """A joiner with an empty $HOME of its own: every per-user cache (vLLM's ~/.cache/vllm, whose `modelinfos/`
    saves its model-inspection subprocess, and any other) starts empty, as on a fresh spot machine."""
    os.makedirs(home)
    env = {k: v for k, v in os.environ.items() if k not in _CACHE_OVERRIDES}
    env.update(HOME=home, RLSYNC_HUB_TOKEN=token)
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "rlsync.bench._spot_child", mode, address, model_dir],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    return proc, t0


def _event(proc, want: str, timeout_s: float = 600.0) -> dict:
    """The child's next JSON line of event `want` (other stdout lines, e.g. vLLM's, are skipped)."""
    deadline = time.monotonic() + timeout_s
    for line in proc.stdout:
        if line.startswith("{"):
            ev = json.loads(line)
            if ev.get("event") == want:
                return ev
        if time.monotonic() > deadline:
            break
    raise RuntimeError(f"joiner exited (rc={proc.poll()}) before {want!r}")


def _round(address: str, token: str, model_dir: str, tmp: str, i: int) -> dict:
    from rlsync.rollout.vllm.model_dir import weightless_dir

    load = _load()
    cold, t0 = _spawn("cold", address, token, model_dir, os.path.join(tmp, f"home-cold-{i}"))
    try:
        c = _event(cold, "first_rollout")
        c["ttfr_s"] = round(time.monotonic() - t0, 2)
        c["artifact"] = _event(cold, "published")
        bare = weightless_dir(model_dir, os.path.join(tmp, f"weightless-{i}"))
        warm, t1 = _spawn("warm", address, token, bare, os.path.join(tmp, f"home-warm-{i}"))
        w = _event(warm, "first_rollout")
        w["ttfr_s"] = round(time.monotonic() - t1, 2)
        warm.wait(timeout=120)
    finally:
        cold.stdin.close()
        cold.wait(timeout=120)
    return {"cold": c, "warm": w, "ratio": round(w["ttfr_s"] / c["ttfr_s"], 3),
            "same_tokens": w["tokens"] == c["tokens"], "load_before": load, "load_after": _load()}


def run(rounds: int) -> dict:
    import torch
    import transformers

    from rlsync.hub import HubClient, Location, start_embedded_hub
    from rlsync.rollout.vllm.model_dir import prepare_smollm2

    model_dir = prepare_smollm2()
    subprocess.run([sys.executable, "-c", "import vllm"], check=True, capture_output=True)  # page cache, untimed
    hub = start_embedded_hub()
    peer = HubClient(hub.address, token=hub.token)
    peer.join(Location(host="peer"), name="peer-engine")
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peer.publish("policy", 1, {n: p.data for n, p in model.named_parameters()})
    with tempfile.TemporaryDirectory(prefix="rlsync-spot-") as tmp:
        per = [_round(hub.address, hub.token, model_dir, tmp, i) for i in range(rounds)]
    peer.leave()
    hub.stop()
    return {"rounds": per, "ttfr_cold_s": statistics.median(r["cold"]["ttfr_s"] for r in per),
            "ttfr_warm_s": statistics.median(r["warm"]["ttfr_s"] for r in per),
            "ttfr_ratio_warm_vs_cold": statistics.median(r["ratio"] for r in per),
            "warm_matches_cold": all(r["same_tokens"] for r in per),
            "cache_artifact_files": per[0]["warm"]["cache_files"],
            "cold_started_empty": all(not r["cold"]["home_before"] and not r["cold"]["cache_root_before"] for r in per),
            "warm_started_with_artifact_only": all(not r["warm"]["home_before"] and r["warm"]["cache_root_before"]
                                                   == sorted(r["warm"]["cache_files"]) for r in per),
            "compile_cache_in_home": all((r[m]["inductor_dir"] or "").startswith(r[m]["home"])
                                         for r in per for m in ("cold", "warm")),
            "cold_compiled": all(r["cold"]["compile_cache"].get("fxgraph_cache_miss", 0) > 0 for r in per),
            "warm_compile_cache_hit": all(r["warm"]["compile_cache"].get("fxgraph_cache_hit", 0) > 0
                                          and not r["warm"]["compile_cache"].get("fxgraph_cache_miss") for r in per),
            "cold_home_writes": per[0]["cold"]["home_after"],
            "cache_artifact_bytes": per[0]["cold"]["artifact"]["bytes"]}


def _table(res: dict) -> str:
    rows = ["| round | joiner | TTFR s | " + " | ".join(res["rounds"][0]["cold"]["phases"]) + " | load before/after |",
            "|---" * (4 + len(res["rounds"][0]["cold"]["phases"])) + "|"]
    for i, r in enumerate(res["rounds"]):
        for mode in ("cold", "warm"):
            ph = r[mode]["phases"]
            rows.append(f"| {i} | {mode} | {r[mode]['ttfr_s']} | " + " | ".join(str(v) for v in ph.values())
                        + f" | {r['load_before'][0]} / {r['load_after'][0]} |")
    for i, r in enumerate(res["rounds"]):
        rows.append(f"round {i} engine start in parts (vLLM's own log): cold {r['cold']['engine_parts']}, "
                    f"warm {r['warm']['engine_parts']}")
        rows.append(f"round {i} torch compile cache (the sampler kernel vLLM compiles on the first generate): "
                    f"cold {r['cold']['compile_cache']}, warm {r['warm']['compile_cache']}")
    rows.append(f"compile cache under each joiner's own home: {res['compile_cache_in_home']}; cold compiled: "
                f"{res['cold_compiled']}; warm hit the artifact's: {res['warm_compile_cache_hit']}")
    rows.append(f"cold joiners started with an empty home: {res['cold_started_empty']}; warm ones with only the "
                f"artifact: {res['warm_started_with_artifact_only']}; a cold start wrote {res['cold_home_writes']}")
    rows.append(f"\nttfr_ratio_warm_vs_cold {res['ttfr_ratio_warm_vs_cold']} (median); warm tokens == cold tokens: "
                f"{res['warm_matches_cold']}; cache artifact {res['cache_artifact_bytes']} B: {res['cache_artifact_files']}")
    return "\n".join(rows)


@register_scenario("spot_start")
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsync.bench spot_start", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=1, help="cold/warm pairs (each ~1-2 min on 2 cores)")
    p.add_argument("--json", help="write every figure here")
    a = p.parse_args(argv)
    res = run(a.rounds)
    print(_table(res))  # CLI output
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0
