"""One spot joiner of `bench spot_start`, in a process of its own (the bench's parent times it from spawn).

    python -m rlsync.bench._spot_child cold|warm HUB_ADDRESS MODEL_DIR    (token in $RLSYNC_HUB_TOKEN)

cold: vLLM reads the checkpoint from MODEL_DIR and makes its own start-up cache (VLLM_CACHE_ROOT is empty, as
on a fresh machine), then the engine joins the hub and takes `latest` of `policy` from peers, generates, and
publishes its start-up cache as a hub artifact (rollout/vllm/engine_cache.py); it serves it until stdin closes.
warm: the engine takes the cache artifact from the peer that made it, starts with dummy weights from MODEL_DIR
(config and tokenizer only: no weights there), takes `latest` from peers and generates.
Each writes one JSON line per event to stdout: {"event": "first_rollout", phases...}, then (cold) {"event": "published"}.
"""
from __future__ import annotations

import json
import os
import sys
import time

PROMPT = [1, 504, 3458, 314, 253, 1234]


def main(mode: str, address: str, model_dir: str) -> None:
    t0 = time.monotonic()
    phases: dict[str, float] = {}

    last = [t0]

    def lap(name: str) -> None:
        now = time.monotonic()
        phases[name] = round(now - last[0], 3)
        last[0] = now

    import vllm  # noqa: F401 - every joiner pays it; timed here, not inside the next phase
    from rlsync.hub import HubClient, Location
    from rlsync.rollout.vllm import engine_cache
    from rlsync.rollout.vllm.engine import VllmEngine
    from rlsync.rollout.vllm.stage import HubWeightStage
    lap("import_s")
    hub = HubClient(address, token=os.environ["RLSYNC_HUB_TOKEN"])
    hub.join(Location(host=f"spot-{mode}"), name=f"spot-{mode}")
    cfg = VllmEngine.Config(model_dir=model_dir, max_new_tokens=8, do_sample=False,
                            load_format="dummy" if mode == "warm" else "auto")
    key = engine_cache.cache_key(model_dir, cfg)
    root = engine_cache.cache_root()
    files = engine_cache.fetch_cache(hub, key, root) if mode == "warm" else []
    lap("cache_fetch_s")
    engine = VllmEngine(cfg)
    lap("engine_start_s")
    stats = HubWeightStage(hub, engine, "policy").update("latest")
    lap("weights_from_peers_s")
    out = engine.generate([PROMPT] * 4)
    lap("first_rollout_s")
    print(json.dumps({"event": "first_rollout", "mode": mode, "phases": phases, "version": out.version,
                      "tokens": out.response_ids[0], "cache_files": files, "fetch_s": round(stats.fetch_s, 3),
                      "apply_s": round(stats.apply_s, 3), "cache_root_files": sorted(_files(root))}), flush=True)
    if mode == "cold":
        engine.shutdown()  # one engine at a time on this machine; the artifact is served by the hub client
        held = engine_cache.publish_cache(hub, root, key)
        print(json.dumps({"event": "published", "key": key,
                          "bytes": sum(t.numel() for t in held.values()) if held else 0}), flush=True)
        sys.stdin.read()  # serve the artifact until the bench is done with it
    hub.leave()


def _files(root: str) -> list[str]:
    return [os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs]


if __name__ == "__main__":
    main(*sys.argv[1:4])
