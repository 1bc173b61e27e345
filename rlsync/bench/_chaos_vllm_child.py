"""One vLLM engine of `bench chaos_vllm`, in a process of its own that the bench kills by signal.

    python -m rlsync.bench._chaos_vllm_child HUB_ADDRESS MODEL_DIR NAME    (token in $RLSYNC_HUB_TOKEN)

A warm joiner (dummy weights, start-up cache from the hub when a peer published it), then a loop: fetch
`latest` into staging, apply it, generate 2 greedy samples. Before each phase it writes a JSON line
{"phase": "fetch"|"apply"|"generate", "version": v} so the bench can kill it inside that phase; after an
apply it writes {"applied": v} (the apply verified every unit against the version's manifest, stage.py);
after a rollout {"sample": v, "n": 2}. A sample line only ever follows its version's "applied" line.
"""
from __future__ import annotations

import json
import os
import sys
import time

PROMPT = [1, 504, 3458, 314]


def _say(**kw) -> None:
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()


def main(address: str, model_dir: str, name: str) -> None:
    from rlsync.hub import HubClient, Location
    from rlsync.rollout.vllm import engine_cache
    from rlsync.rollout.vllm.engine import VllmEngine
    from rlsync.rollout.vllm.stage import HubWeightStage

    hub = HubClient(address, token=os.environ["RLSYNC_HUB_TOKEN"])
    hub.join(Location(host=name), name=name)
    cfg = VllmEngine.Config(model_dir=model_dir, max_new_tokens=4, do_sample=False, load_format="dummy")
    key = engine_cache.cache_key(model_dir, cfg)
    engine_cache.fetch_cache(hub, key, engine_cache.cache_root())
    engine = VllmEngine(cfg)
    held = engine_cache.publish_cache(hub, engine_cache.cache_root(), key)  # noqa: F841 - served while alive
    stage = HubWeightStage(hub, engine, "policy")
    _say(started=True)
    while True:
        latest = hub.wait_latest("policy", engine.version + 1, timeout_s=5.0)
        if latest is None or latest <= engine.version:
            continue
        _say(phase="fetch", version=latest)
        stage.prefetch(latest)
        v = stage.wait_staged()
        _say(phase="apply", version=v)
        stage.apply_staged()
        _say(applied=engine.version)
        _say(phase="generate", version=engine.version)
        out = engine.generate([PROMPT] * 2)
        _say(sample=out.version, n=2, t=time.time())


if __name__ == "__main__":
    main(*sys.argv[1:4])
