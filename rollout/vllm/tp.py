"""Tensor-parallel vLLM: each TP rank reads only its own slices of a sharded version from the hub and
applies them in place (issue 20 item 3).

    llm = LLM(model=DIR, tensor_parallel_size=2, distributed_executor_backend="mp",
              worker_extension_cls=EXTENSION)                      # rlsync's methods on every worker
    llm.collective_rpc("rlsync_join", args=(hub.address, hub.token, "h0", "engine0"))
    got = load_slices(llm, "policy", version, layout)               # every rank: read + apply, one version

Inside each worker (a process of its own under the `mp` executor) `TPSliceLoader` holds a hub client.
`rlsync_load_slices` asks `ReshardReader.read` for the blocks vLLM's Llama/Qwen2 layers keep on this
rank (`tp_dests`): rows of q/k/v, gate/up (column-parallel), of the embedding and the head
(vocab-parallel); columns of o_proj and down_proj (row-parallel); norms whole. The read moves only
the units of the trainer's shards that overlap those ranges (hub/client/partial.py), copies the runs
into per-rank tensors, and the direct apply (`direct.py`) writes them into the layer buffers and
re-packs each layer: `plan_direct` checks every block against the rank's own parameter shapes
(`output_partition_sizes`, `input_size_per_partition`), so a model partitioned otherwise (padded
vocabulary, replicated KV heads) is refused, not loaded wrong.

Simplifies: the read happens inside the collective call, so the engine does not generate meanwhile
(no prefetch into staging), and the ranks read in turn; the worker's slices are not a hub replica (a
partial read serves nobody). `VllmEngine` does not start TP engines: this is the loader they need.
Methods are called by name (`collective_rpc("rlsync_...")`): no pickled callables cross processes.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

from rlsync.hub import Dest, ShardedLayout, Slice, zero3_layout

EXTENSION = "rlsync.rollout.vllm.tp.TPSliceLoader"
"""`LLM(worker_extension_cls=EXTENSION)`: adds the `rlsync_*` methods to every vLLM worker."""

APPLY_FAILED = "rlsync TP apply failed"
"""In a worker's error once it began writing its layers (reads fail before any rank writes)."""


class TPLoadError(RuntimeError):
    """A TP load failed on some rank (the workers return errors: vLLM's engine core dies on a raising
    worker call). `applied` False: no rank wrote any weight (a failed read); True: some rank's layers
    were being written, so the engine holds no whole version."""

    def __init__(self, msg: str, applied: bool):
        super().__init__(msg)
        self.applied = applied

_ROWS = (".q_proj.", ".k_proj.", ".v_proj.", ".gate_proj.", ".up_proj.")
_COLS = (".o_proj.", ".down_proj.")
_VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


def tp_dests(names: list[str], rank: int, parts: int) -> list[Dest]:
    """What TP rank `rank` of `parts` keeps of each checkpoint tensor in vLLM's Llama/Qwen2 layers."""
    out = []
    for n in names:
        if any(k in n for k in _ROWS) or n in _VOCAB:
            out.append(Dest.of(Slice(n, 0, rank, parts)))
        elif any(k in n for k in _COLS):
            out.append(Dest.of(Slice(n, 1, rank, parts)))
        else:
            out.append(Dest.of(Slice(n)))
    return out


def layout_wire(layout: ShardedLayout) -> tuple[dict, int]:
    """A ZeRO-3 layout as plain values for a collective call (vLLM serializes arguments with msgspec)."""
    if layout.kind != "zero3":
        raise ValueError(f"only ZeRO-3 layouts cross to vLLM workers here (got {layout.kind!r})")
    return {n: [list(s), dt] for n, (s, dt) in layout.specs().items()}, layout.world


def load_slices(llm, model: str, version: int, layout: ShardedLayout | None,
                digests: bool = True) -> list[dict[str, Any]]:
    """Every TP rank reads its slices of (model, `version`: a number, so all ranks read one version;
    `layout` None: a whole-tensor version) and applies them; returns each rank's {rank, version,
    nbytes, bytes_by_source, read_s, apply_s, digests (slice name -> sha256 of its bytes, when asked)}."""
    if not isinstance(version, int):
        raise TypeError("load_slices needs a version number (resolve 'latest' once, for every rank)")
    specs, world = layout_wire(layout) if layout is not None else (None, 1)
    ranks = llm.collective_rpc("rlsync_load_slices", args=(model, version, specs, world, digests))
    bad = [r for r in ranks if "error" in r]
    if bad:
        raise TPLoadError(f"{model} v{version}: " + "; ".join(f"rank {r['rank']}: {r['error']}" for r in bad),
                          applied=any(r["applied"] for r in bad))
    return ranks


def sha256(t) -> str:
    """Digest of a tensor's bytes (any dtype)."""
    import hashlib

    import torch

    return hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


class TPSliceLoader:
    """vLLM worker extension (mixed into the worker class: `self` is the worker)."""

    def rlsync_join(self, address: str, token: str, host: str, name: str) -> str:
        from vllm.distributed import get_tensor_model_parallel_rank

        from rlsync.hub import HubClient, Location

        self._rlsync_hub = HubClient(address, token=token)
        self._rlsync_hub.join(Location(host=host), name=f"{name}-tp{get_tensor_model_parallel_rank()}")
        self._rlsync_plans = {}
        return self._rlsync_hub.worker_id

    def _rlsync_read(self, model: str, version: int, specs: dict | None, world: int, rank: int, parts: int):
        """This rank's slices of one version: from the trainer's ZeRO-3 shards (`specs`: the layout),
        only the units holding them; of a whole-tensor version (`specs` None), the whole tensors (the
        hub's partial reads address shards of a sharded layout only), cut here and released at once."""
        from types import SimpleNamespace

        from rlsync.hub import ReshardReader, Shard

        if specs is not None:
            layout = zero3_layout({n: (tuple(int(x) for x in s), str(dt)) for n, (s, dt) in specs.items()}, int(world))
            readers = self.__dict__.setdefault("_rlsync_readers", {})
            key = (model, int(world), tuple(sorted(layout.specs().items())))
            if key not in readers:
                readers[key] = ReshardReader(self._rlsync_hub, model, layout)
            return readers[key].read(version, tp_dests(list(layout.specs()), rank, parts))
        res = self._rlsync_hub.fetch(model, version)
        try:
            out = {}
            for d in tp_dests([s.name for s in res.manifest.tensors], rank, parts):
                s, t = d.slices[0], res.tensors[d.slices[0].name]
                out[d.name] = t.clone() if s.dim is None else t.chunk(parts, s.dim)[s.part].contiguous()
        finally:
            self._rlsync_hub.release(model, res.version, Shard())  # the whole copy serves nobody after this
        return SimpleNamespace(version=res.version, tensors=out, bytes_by_source=dict(res.bytes_by_source))

    def rlsync_load_slices(self, model: str, version: int, specs: dict | None, world: int,
                           digests: bool = False) -> dict[str, Any]:
        """Read this rank's slices of `version` (every rank in turn), then, only if every rank's read
        succeeded, apply them in place: a failed read on any rank leaves every rank's weights as they were.
        Errors come back as {rank, error, applied} (a raising worker call would stop vLLM's engine)."""
        from vllm.distributed import get_tensor_model_parallel_rank

        try:
            return self._rlsync_load(model, version, specs, world, digests)
        except Exception as e:  # noqa: BLE001 - returned to load_slices, which raises TPLoadError
            return {"rank": get_tensor_model_parallel_rank(), "error": f"{type(e).__name__}: {e}",
                    "applied": APPLY_FAILED in str(e)}

    def _rlsync_load(self, model: str, version: int, specs: dict | None, world: int, digests: bool) -> dict[str, Any]:
        import torch
        import torch.distributed as dist
        from vllm.config import set_current_vllm_config
        from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size, get_tp_group

        from .direct import direct_load, plan_direct
        from .worker_apply import reset_caches

        rank, parts = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
        # One rank reads at a time: the hub advertises a partial reader as a relay while it plans, so
        # ranks reading together were planned on each other and waited 5 s on units the other never
        # fetches (docs/vllm.md); on 2 cores the reads compete for the same cores anyway.
        group, got, err, read_s = get_tp_group(), None, None, 0.0
        for turn in range(parts):
            if turn == rank:
                t0 = time.perf_counter()
                try:
                    got = self._rlsync_read(model, version, specs, world, rank, parts)
                except Exception as e:  # noqa: BLE001 - every rank must reach the vote below
                    err = e
                read_s = time.perf_counter() - t0
            group.barrier()
        runner = self.model_runner
        net = runner.get_model()
        plan = None
        if err is None:
            key = tuple((n, tuple(t.shape)) for n, t in got.tensors.items())
            if key not in self._rlsync_plans:
                self._rlsync_plans[key] = plan_direct(net, list(key))
            plan = self._rlsync_plans[key]
            if plan is None:
                err = ValueError(f"TP rank {rank}: vLLM's layers are not partitioned as tp_dests assumes "
                                 "(padded vocabulary, replicated KV heads, another architecture): not loaded")
        failed = torch.tensor([0 if err is None else 1], dtype=torch.int32)
        dist.all_reduce(failed, group=group.cpu_group)  # every rank applies, or none does
        if err is not None:
            raise err
        if int(failed.item()):
            raise RuntimeError(f"TP rank {rank}: another rank could not read {model} v{version}; weights unchanged")
        t0 = time.perf_counter()
        try:
            with set_current_vllm_config(self.vllm_config):
                seen = direct_load(net, plan, iter(got.tensors.items()))
            reset_caches(runner)
        except Exception as e:
            raise RuntimeError(f"{APPLY_FAILED} on rank {rank}: {e}") from e
        if len(seen) != len(got.tensors):
            raise ValueError(f"{APPLY_FAILED} on rank {rank}: loaded {len(seen)} of {len(got.tensors)} slices")
        return {"rank": rank, "version": got.version, "nbytes": sum(t.nbytes for t in got.tensors.values()),
                "bytes_by_source": dict(got.bytes_by_source), "read_s": read_s,
                "apply_s": time.perf_counter() - t0,
                "digests": {n: sha256(t) for n, t in got.tensors.items()} if digests else {}}

    def rlsync_buffer_digests(self) -> dict[str, str]:
        """sha256 of what each repacked layer was last packed from (vLLM's fused layout and dtype; direct.py)."""
        return {k: sha256(plan.kernel_source(k)) for plan in self._rlsync_plans.values() if plan is not None
                for k in plan.buffers}

    def rlsync_hub_id(self) -> str:
        return self._rlsync_hub.worker_id

    def rlsync_leave(self) -> None:
        hub = getattr(self, "_rlsync_hub", None)
        if hub is not None:
            hub.leave()
            self._rlsync_hub = None


class TensorParallelError(ValueError):
    """The model or the engine's options cannot run at the requested tensor_parallel_size."""


def check_tensor_parallel(model_dir: str, config) -> None:
    """Refuse, before vLLM starts, a model TP=k cannot split as rlsync's slice loader needs (heads,
    KV heads and MLP width divisible by k) and options that cannot work with TP > 1."""
    k = config.tensor_parallel_size
    if k < 1:
        raise TensorParallelError(f"tensor_parallel_size must be >= 1 (got {k})")
    if k == 1:
        return
    if config.apply_mode != "direct":
        raise TensorParallelError(f"apply_mode={config.apply_mode!r} cannot run at tensor_parallel_size={k}: "
                                  "TP ranks load their slices by the direct apply only")
    with open(os.path.join(model_dir, "config.json")) as f:
        hf = json.load(f)
    for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        n = hf.get(key, hf.get("num_attention_heads") if key == "num_key_value_heads" else None)
        if n is None or n % k:
            raise TensorParallelError(f"{model_dir}: {key}={n} is not divisible by tensor_parallel_size={k} "
                                      "(each TP rank must hold whole heads and equal MLP blocks)")
