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
the units of the trainer's shards that overlap those ranges (hub/client_partial.py), copies the runs
into per-rank tensors, and the direct apply (`vllm_direct`) writes them into the layer buffers and
re-packs each layer: `plan_direct` checks every block against the rank's own parameter shapes
(`output_partition_sizes`, `input_size_per_partition`), so a model partitioned otherwise (padded
vocabulary, replicated KV heads) is refused, not loaded wrong.

Simplifies: the read happens inside the collective call, so the engine does not generate meanwhile
(no prefetch into staging), and the ranks read in turn; the worker's slices are not a hub replica (a
partial read serves nobody). `VllmEngine` does not start TP engines: this is the loader they need.
Methods are called by name (`collective_rpc("rlsync_...")`): no pickled callables cross processes.
"""
from __future__ import annotations

import time
from typing import Any

from rlsync.hub.reshard import Dest, ShardedLayout, Slice, zero3_layout

EXTENSION = "rlsync.rollout.vllm_tp.TPSliceLoader"
"""`LLM(worker_extension_cls=EXTENSION)`: adds the `rlsync_*` methods to every vLLM worker."""

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


def load_slices(llm, model: str, version: int, layout: ShardedLayout, digests: bool = True) -> list[dict[str, Any]]:
    """Every TP rank reads its slices of (model, `version`: a number, so all ranks read one version)
    and applies them; returns each rank's {rank, version, nbytes, bytes_by_source, read_s, apply_s,
    digests (slice name -> sha256 of its bytes, when asked)}."""
    if not isinstance(version, int):
        raise TypeError("load_slices needs a version number (resolve 'latest' once, for every rank)")
    specs, world = layout_wire(layout)
    return llm.collective_rpc("rlsync_load_slices", args=(model, version, specs, world, digests))


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

    def rlsync_load_slices(self, model: str, version: int, specs: dict, world: int,
                           digests: bool = False) -> dict[str, Any]:
        from vllm.config import set_current_vllm_config
        from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

        from rlsync.hub.reshard_read import ReshardReader

        from .vllm_direct import direct_load, plan_direct
        from .vllm_engine import _reset_caches

        from vllm.distributed import get_tp_group

        rank, parts = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
        layout = zero3_layout({n: (tuple(int(x) for x in s), str(dt)) for n, (s, dt) in specs.items()}, int(world))
        reader, dests = ReshardReader(self._rlsync_hub, model, layout), tp_dests(list(layout.specs()), rank, parts)
        # One rank reads at a time: the hub advertises a partial reader as a relay while it plans, so
        # ranks reading together were planned on each other and waited 5 s on units the other never
        # fetches (docs/vllm.md); on 2 cores the reads compete for the same cores anyway.
        group, got, read_s = get_tp_group(), None, 0.0
        for turn in range(parts):
            if turn == rank:
                t0 = time.perf_counter()
                got = reader.read(version, dests)
                read_s = time.perf_counter() - t0
            group.barrier()
        runner = self.model_runner
        net = runner.get_model()
        key = tuple((n, tuple(t.shape)) for n, t in got.tensors.items())
        if key not in self._rlsync_plans:
            self._rlsync_plans[key] = plan_direct(net, list(key))
        plan = self._rlsync_plans[key]
        if plan is None:
            raise ValueError(f"TP rank {rank}: vLLM's layers are not partitioned as tp_dests assumes "
                             "(padded vocabulary, replicated KV heads, another architecture): not loaded")
        t0 = time.perf_counter()
        with set_current_vllm_config(self.vllm_config):
            seen = direct_load(net, plan, iter(got.tensors.items()))
        _reset_caches(runner)
        if len(seen) != len(got.tensors):
            raise ValueError(f"TP rank {rank}: loaded {len(seen)} of {len(got.tensors)} slices")
        return {"rank": rank, "version": got.version, "nbytes": sum(t.nbytes for t in got.tensors.values()),
                "bytes_by_source": dict(got.bytes_by_source), "read_s": read_s,
                "apply_s": time.perf_counter() - t0,
                "digests": {n: sha256(t) for n, t in got.tensors.items()} if digests else {}}

    def rlsync_buffer_digests(self) -> dict[str, str]:
        """sha256 of each layer buffer the direct apply last wrote (vLLM's fused layout and dtype)."""
        return {k: sha256(t) for plan in self._rlsync_plans.values() if plan is not None
                for k, t in plan.buffers.items()}

    def rlsync_leave(self) -> None:
        hub = getattr(self, "_rlsync_hub", None)
        if hub is not None:
            hub.leave()
            self._rlsync_hub = None
