"""One spot joiner of `bench spot_start`, in a process of its own (the bench's parent times it from spawn).

    python -m rlsync.bench._spot_child cold|warm HUB_ADDRESS MODEL_DIR    (token in $RLSYNC_HUB_TOKEN)

The parent gives each joiner a fresh, empty $HOME (and no cache-dir overrides), as on a fresh spot machine:
every per-user cache (vLLM's ~/.cache/vllm, which holds its model-inspection cache `modelinfos/`, and any
other) starts empty. cold: vLLM reads the checkpoint from MODEL_DIR and makes its own start-up cache, then
the engine joins the hub and takes `latest` of `policy` from peers, generates, and publishes its start-up
cache as a hub artifact (rollout/vllm/engine_cache.py); it serves it until stdin closes.
warm: the engine takes the cache artifact from the peer that made it, starts with dummy weights from MODEL_DIR
(config and tokenizer only: no weights there), takes `latest` from peers and generates.
Each writes one JSON line per event to stdout: {"event": "first_rollout", phases...}, then (cold) {"event": "published"}.
`engine_parts` splits the engine start by vLLM's own log records: the model-class inspection (`inspect_s`,
and whether its cache hit), the model load, the engine's profile/KV-cache/warm-up. The child runs with
VLLM_CONFIGURE_LOGGING=0 and owns the `vllm` logger: vLLM's own dictConfig (applied inside `LLM()`) clears the
handlers of every existing `vllm.*` logger, so handlers attached before it never saw a record.
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys
import time

PROMPT = [1, 504, 3458, 314, 253, 1234]
_TIMED = {"inspect_s": re.compile(r"Registry inspect model class: Elapsed time ([\d.]+)"),
          "weights_read_s": re.compile(r"Loading weights took ([\d.]+) seconds"),
          "model_load_s": re.compile(r"Model loading took \S+ GiB memory and ([\d.]+) seconds"),
          "model_init_s": re.compile(r"Initializing model took ([\d.]+) seconds"),
          "init_engine_s": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+)")}

_REGISTRY_LOGGER = "vllm.model_executor.models.registry"


class _VllmTimings(logging.Handler):
    """The seconds vLLM logs for its own start-up steps, and whether the inspection's cache hit."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.parts: dict = {}
        self.timeline: list = []
        """(seconds since the engine start began, message) of vLLM's records, to read its start-up's steps."""
        self.t0 = time.monotonic()

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if len(self.timeline) < 60:
            self.timeline.append((round(time.monotonic() - self.t0, 2), msg[:100]))
        for key, pat in _TIMED.items():
            m = pat.search(msg)
            if m:
                self.parts[key] = round(float(m.group(1)), 3)
        if "Cached model info file" in msg or "Cache model info" in msg:
            self.parts["inspect_cache_hit"] = False
        elif "from cache" in msg and "model info" in msg:
            self.parts["inspect_cache_hit"] = True


def own_vllm_logging(handler: logging.Handler) -> None:
    """Before vLLM is imported: this process owns the `vllm` logger (VLLM_CONFIGURE_LOGGING=0, module docstring);
    `handler` gets vLLM's INFO records (and the registry's DEBUG one), its warnings still reach stderr."""
    os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
    vllm_log = logging.getLogger("vllm")
    vllm_log.setLevel(logging.INFO)
    vllm_log.addHandler(handler)
    warnings_out = logging.StreamHandler(sys.stderr)
    warnings_out.setLevel(logging.WARNING)
    vllm_log.addHandler(warnings_out)
    logging.getLogger(_REGISTRY_LOGGER).setLevel(logging.DEBUG)  # its inspection timing is a DEBUG record


def main(mode: str, address: str, model_dir: str) -> None:
    t0 = time.monotonic()
    phases: dict[str, float] = {}

    last = [t0]

    def lap(name: str) -> None:
        now = time.monotonic()
        phases[name] = round(now - last[0], 3)
        last[0] = now

    home_before = sorted(_files(os.path.expanduser("~")))
    timings = _VllmTimings()
    own_vllm_logging(timings)
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
    cache_before = sorted(_files(root))
    lap("cache_fetch_s")
    timings.t0 = time.monotonic()
    timings.timeline.clear()  # the engine start only (import-time records would take its slots)
    engine = VllmEngine(cfg)
    lap("engine_start_s")
    stats = HubWeightStage(hub, engine, "policy").update("latest")
    lap("weights_from_peers_s")
    out = engine.generate([PROMPT] * 4)
    lap("first_rollout_s")
    compiles = _compile_counters()
    print(json.dumps({"event": "first_rollout", "mode": mode, "phases": phases, "version": out.version,
                      "tokens": out.response_ids[0], "cache_files": files, "fetch_s": round(stats.fetch_s, 3),
                      "apply_s": round(stats.apply_s, 3), "engine_parts": timings.parts, "cache_root": root,
                      "engine_timeline": timings.timeline, "compile_cache": compiles,
                      "inductor_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
                      "home": os.path.expanduser("~"), "home_before": home_before, "cache_root_before": cache_before,
                      "cache_root_files": sorted(_files(root)),
                      "home_after": sorted(_files(os.path.expanduser("~")))}), flush=True)
    if mode == "cold":
        engine.shutdown()  # one engine at a time on this machine; the artifact is served by the hub client
        held = engine_cache.publish_cache(hub, root, key)
        print(json.dumps({"event": "published", "key": key,
                          "bytes": sum(t.numel() for t in held.values()) if held else 0}), flush=True)
        sys.stdin.read()  # serve the artifact until the bench is done with it
    hub.leave()


def _compile_counters() -> dict:
    """torch's compile-cache counters so far: whether the kernel vLLM compiles on the first `generate` came from
    the inductor cache (`fxgraph_cache_hit`) or was compiled here (`fxgraph_cache_miss`)."""
    from torch._dynamo.utils import counters

    return {k: v for group in ("inductor", "aot_autograd") for k, v in counters[group].items() if "cache" in k}


def _files(root: str) -> list[str]:
    return [os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs]


if __name__ == "__main__":
    main(*sys.argv[1:4])
