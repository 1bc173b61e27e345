"""One vLLM engine of `bench chaos_vllm`, in a process of its own that the bench kills by signal.

    python -m rlsync.bench._chaos_vllm_child HUB_ADDRESS MODEL_DIR NAME [--spare]   (token in $RLSYNC_HUB_TOKEN)

A warm joiner (dummy weights, start-up cache from the hub when a peer published it, one warm-up batch on the dummy
weights, dropped; {"started": true, "parts": {...}} gives the seconds of each start-up step), then a loop: fetch
`latest` into staging, apply it, check it, generate 2 greedy samples. Before each phase it writes a JSON line
{"phase": "fetch"|"apply"|"generate", "version": v} so the bench can kill it inside that phase; after an
apply it writes {"applied": v} only once the version passed the receiver's checks (the stage's unit re-check
during the apply, then the engine's own bf16 buffers against the digests made as the version landed:
rlsync/sync/verify.py, docs/verify.md; a failure is {"verify_failed": v} and the version is taken again);
after a rollout {"sample": v, "n": 2}. A sample line only ever follows its version's "applied" line.
`--spare`: import vLLM, torch and rlsync first, write {"ready": true} and wait for a line on stdin before
joining (the bench keeps one such spare so a restart does not pay the imports).
"""
from __future__ import annotations

import json
import os
import sys
import time

PROMPT = [1, 504, 3458, 314]


def parse(line: str) -> dict:
    """One of these lines, read by the bench; {} for anything else (vLLM's output, a line cut by the kill)."""
    try:
        return json.loads(line) if line.startswith("{") else {}
    except ValueError:
        return {}


def _say(**kw) -> None:
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()


def main(address: str, model_dir: str, name: str, spare: bool = False) -> None:
    import torch

    from rlsync.hub import HubClient, Location
    from rlsync.rollout.vllm import engine_cache
    from rlsync.rollout.vllm.engine import VllmEngine
    from rlsync.rollout.vllm.rl_engine import HubFedVllmEngine
    from rlsync.rollout.vllm.stage import HubWeightStage
    from rlsync.sync.verify import check_weights, expected_digests

    import vllm  # noqa: F401 - what a restart pays most for; a spare has paid it before the bench needs it
    if spare:
        _say(ready=True)
        sys.stdin.readline()
    parts, t = {}, time.monotonic()

    def part(step: str) -> None:
        nonlocal t
        parts[step], t = round(time.monotonic() - t, 2), time.monotonic()

    hub = HubClient(address, token=os.environ["RLSYNC_HUB_TOKEN"])
    hub.join(Location(host=name), name=name)
    part("join")
    cfg = VllmEngine.Config(model_dir=model_dir, max_new_tokens=4, do_sample=False, load_format="dummy")
    key = engine_cache.cache_key(model_dir, cfg)
    engine_cache.fetch_cache(hub, key, engine_cache.cache_root())
    part("cache_fetch")
    engine = VllmEngine(cfg)
    part("engine")
    engine.warm_up(PROMPT)  # a process's first generate pays its set-up here, not after it takes a version
    part("warm_up")
    held = engine_cache.publish_cache(hub, engine_cache.cache_root(), key)  # noqa: F841 - served while alive
    part("cache_publish")
    fed = HubFedVllmEngine(engine)
    fed.stage = stage = HubWeightStage(hub, engine, "policy")
    fed.verify_ahead(lambda m, staged, recheck: expected_digests(m, staged, torch.bfloat16, recheck))
    _say(started=True, parts=parts)
    while True:
        latest = hub.wait_latest("policy", engine.version + 1, timeout_s=5.0)
        if latest is None or latest <= engine.version:
            continue
        _say(phase="fetch", version=latest)
        stage.prefetch(latest)
        v = stage.wait_staged()
        _say(phase="apply", version=v)
        stage.apply_staged()
        while check_weights(*_weights(fed)):  # the receiver's check (here before generating: nothing to drop)
            _say(verify_failed=v)
            fed.reapply(v)
        _say(applied=engine.version)
        _say(phase="generate", version=engine.version)
        out = engine.generate([PROMPT] * 2)
        _say(sample=out.version, n=2, t=time.time())


def _weights(fed) -> tuple:
    manifest, expected = fed.verify_source()
    return manifest, fed.weights_readback(), expected


if __name__ == "__main__":
    main(*sys.argv[1:4], spare="--spare" in sys.argv[4:])
