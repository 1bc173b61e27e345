"""`python -m rlsync.bench reshard`: a 2-rank ZeRO-3 trainer publishes its shards (no gather), readers
in other layouts fetch them; against gather-then-publish, measured in the same run.

    python -m rlsync.bench reshard --json outputs/bench/reshard.json

Two DeepSpeed ZeRO-3 ranks (CPU, gloo) hold a random-init Llama. Per repetition each rank
(a) publishes its live flat partition as a shard of version v of `policy` (rlsync.sync.hub_sharded),
and (b) runs the baseline: every rank all-gathers the model (`named_parameters_for_sync`) and rank 0
publishes the gathered copy as version v of `policy_gathered`. Both publish the same way, with
`HubClient.publish_async` (the checksum pass and the hub round trip on the client's publish thread).
The trainer's publish time is the slower rank's, from the call to its return (what the trainer
waits for: `publish_ratio_vs_gather`); the time until the version landed (checksummed and
registered; the rank waits for it before the next repetition, so neither kind overlaps the other)
is reported beside it (`landed_ratio_vs_gather`). Then 4 whole-tensor readers and one TP=2 reader group
(fused qkv and gate_up row blocks, o_proj and down_proj column blocks, embeddings and lm_head
vocabulary row blocks, norms whole) read the
sharded version; every tensor is compared bit for bit with the gathered version (fetched as usual),
and the bytes each source served are printed. JSON keys: `exact`, `publish_ratio_vs_gather`.
"""
from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path

from . import register_scenario

log = logging.getLogger(__name__)
VOCAB = 1024


def model_config(hidden: int, layers: int) -> dict:
    return {"hidden_size": hidden, "num_layers": layers, "num_heads": max(1, hidden // 64),
            "intermediate_size": hidden * 4, "max_position_embeddings": 64}


def rank_main(rank: int, world: int, port: int, address: str, token: str, model_kw: dict, conn) -> None:
    """One ZeRO-3 trainer rank: join the hub, then publish on the parent's commands."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(1)
    from rlsync.hub import HubClient, Location, Shard
    from rlsync.hub.reshard.read import zero_shard
    from rlsync.rollout import TinyModelConfig, build_tiny_model
    from rlsync.trainer import DeepSpeedBackend, DistConfig
    from rlsync.sync.hub_sharded import publish_zero3

    ds = DeepSpeedBackend(DeepSpeedBackend.Config(zero_stage=3, dist=DistConfig(
        world_size=world, rank=rank, master_addr="127.0.0.1", master_port=port)),
        build_tiny_model(TinyModelConfig(**model_kw), VOCAB))
    hub = HubClient(address, token)
    hub.join(Location(host="h0"), f"trainer{rank}")
    conn.send(("ready", hub.worker_id))
    held: dict[str, int] = {}
    while True:
        cmd, v = conn.recv()
        if cmd == "stop":
            break
        model = "policy" if cmd == "sharded" else "policy_gathered"
        if model in held:  # the mutability contract: give the last version back before reusing its memory
            hub.release(model, held.pop(model), shard=zero_shard(rank, world) if cmd == "sharded" else Shard())
        t0, fut = time.perf_counter(), None
        if cmd == "sharded":
            _, fut = publish_zero3(hub, model, v, ds, wait=False)
            held[model] = v
        else:
            full = ds.named_parameters_for_sync()  # the all-gather: every rank takes part
            if rank == 0:
                fut = hub.publish_async(model, v, full)
                held[model] = v
        blocked = time.perf_counter() - t0  # the trainer goes on from here
        if fut is not None:
            fut.result()  # landed: checksummed and registered (nothing else runs meanwhile, for both kinds)
        conn.send(("done", (blocked, time.perf_counter() - t0)))
    hub.leave()
    conn.send(("left", None))


class Ranks:
    """`world` ZeRO-3 rank processes joined to the hub at `address`."""

    def __init__(self, address: str, token: str, model_kw: dict, world: int = 2) -> None:
        from rlsync.trainer import free_port

        ctx = mp.get_context("spawn")
        port, self.conns, self.procs = free_port(), [], []
        for r in range(world):
            a, b = ctx.Pipe()
            p = ctx.Process(target=rank_main, args=(r, world, port, address, token, model_kw, b), daemon=True)
            p.start()
            self.conns.append(a)
            self.procs.append(p)
        self.worker_ids = [self._recv(c, 900)[1] for c in self.conns]

    def _recv(self, c, timeout: float):
        if not c.poll(timeout):
            raise TimeoutError(f"a trainer rank did not answer within {timeout:.0f} s")
        return c.recv()

    def run(self, cmd: str, version: int) -> tuple[float, float]:
        """Every rank runs `cmd` for `version` at once; the slowest rank's (seconds blocked, seconds until
        its publish landed)."""
        for c in self.conns:
            c.send((cmd, version))
        got = [self._recv(c, 600)[1] for c in self.conns]
        return max(b for b, _ in got), max(d for _, d in got)

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(("stop", 0))
                self._recv(c, 60)
            except (OSError, EOFError, TimeoutError):
                pass
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


def tp_dests(names: list[str], k: int, parts: int = 2):
    """A vLLM-like TP rank's destinations: fused qkv and gate_up row blocks, o/down column blocks,
    embed_tokens and lm_head row blocks (vocabulary-parallel), everything else (norms) whole."""
    from rlsync.hub.reshard.layout import Dest, Slice

    out, used = [], set()
    for n in names:
        if ".q_proj." in n:
            trio = [n, n.replace(".q_proj.", ".k_proj."), n.replace(".q_proj.", ".v_proj.")]
            out.append(Dest(n.replace(".q_proj.", ".qkv_proj."), tuple(Slice(x, 0, k, parts) for x in trio)))
            used.update(trio)
        elif ".gate_proj." in n:
            pair = [n, n.replace(".gate_proj.", ".up_proj.")]
            out.append(Dest(n.replace(".gate_proj.", ".gate_up_proj."), tuple(Slice(x, 0, k, parts) for x in pair)))
            used.update(pair)
    for n in names:
        if n in used:
            continue
        col = ".o_proj." in n or ".down_proj." in n
        vocab = "embed_tokens." in n or "lm_head." in n  # vLLM's VocabParallelEmbedding / ParallelLMHead
        out.append(Dest.of(Slice(n, 1, k, parts) if col else Slice(n, 0, k, parts) if vocab else Slice(n)))
    return out


def expected_tp(full: dict, dests) -> dict:
    """What each TP destination must hold, cut from the full tensors with torch."""
    import torch

    def cut(s):
        t = full[s.name]
        return t if s.dim is None else t.chunk(s.parts, s.dim)[s.part]

    return {d.name: torch.cat([cut(s) for s in d.slices]).contiguous() if len(d.slices) > 1 else cut(d.slices[0]).contiguous()
            for d in dests}


def same_bytes(a, b) -> bool:
    import torch
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                       b.reshape(-1).view(torch.uint8))


def run(hidden: int, layers: int, reps: int, readers: int, command: str = "") -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rlsync.hub import HubClient, Location, start_embedded_hub
    from rlsync.hub.model.manifest import dtype_name
    from rlsync.hub.reshard.layout import zero3_layout
    from rlsync.hub.reshard.read import ReshardReader
    from rlsync.rollout import TinyModelConfig, build_tiny_model

    model_kw = model_config(hidden, layers)
    shapes = {n: (tuple(p.shape), dtype_name(p.dtype))
              for n, p in build_tiny_model(TinyModelConfig(**model_kw), VOCAB).named_parameters()}
    layout = zero3_layout(shapes, 2)
    nbytes = sum(p.length * 4 for r in layout.ranks for p in r)
    hub = start_embedded_hub()
    load0 = os.getloadavg()
    ranks = Ranks(hub.address, hub.token, model_kw)
    clients, names = [], {}

    def client(name: str):
        c = HubClient(hub.address, hub.token)
        c.join(Location(host="h0"), name)
        clients.append(c)
        names[c.worker_id] = f"reader {name}"
        return c

    try:
        sharded, gathered, sharded_landed, gathered_landed = [], [], [], []
        for v in range(1, reps + 1):  # alternate, so load that comes and goes falls on both alike
            for kind, blocked, landed in (("sharded", sharded, sharded_landed), ("gathered", gathered, gathered_landed)):
                b, d = ranks.run(kind, v)
                blocked.append(b)
                landed.append(d)
        ref = client("reference").fetch("policy_gathered", reps).tensors
        exact, per_reader = True, []
        for i in range(readers):
            t0 = time.perf_counter()
            got = ReshardReader(client(f"whole{i}"), "policy", layout).read_whole(reps)
            exact &= got.version == reps and all(same_bytes(got.tensors[n], ref[n]) for n in ref)
            per_reader.append({"reader": f"whole{i}", "seconds": round(time.perf_counter() - t0, 4),
                               "bytes_by_source": got.bytes_by_source})
        for k in range(2):
            dests = tp_dests(list(shapes), k)
            t0 = time.perf_counter()
            got = ReshardReader(client(f"tp{k}"), "policy", layout).read(reps, dests)
            want = expected_tp(ref, dests)
            exact &= all(same_bytes(got.tensors[n], want[n]) for n in want)
            per_reader.append({"reader": f"tp{k} of 2", "seconds": round(time.perf_counter() - t0, 4),
                               "bytes_by_source": got.bytes_by_source, "shards": got.shards_fetched,
                               "fraction_of_model": round(sum(got.bytes_by_source.values()) / nbytes, 3)})
    finally:
        for c in clients:
            c.leave()
        ranks.close()
        hub.stop()
    names.update({w: f"trainer rank {r}" for r, w in enumerate(ranks.worker_ids)})
    for row in per_reader:
        row["bytes_by_source"] = {names.get(w, w): n for w, n in row["bytes_by_source"].items()}
    ms, mg = statistics.median(sharded), statistics.median(gathered)
    return {"scenario": "reshard", "model": {**model_kw, "vocab": VOCAB, "bytes": nbytes, "tensors": len(shapes)},
            "reps": reps, "exact": bool(exact),
            "publish_sharded_s": [round(x, 5) for x in sharded], "publish_gathered_s": [round(x, 5) for x in gathered],
            "publish_ratio_vs_gather": round(ms / mg, 4),
            "paired_publish_ratio_vs_gather": round(statistics.median(a / b for a, b in zip(sharded, gathered)), 4),
            "landed_sharded_s": [round(x, 5) for x in sharded_landed],
            "landed_gathered_s": [round(x, 5) for x in gathered_landed],
            "landed_ratio_vs_gather": round(statistics.median(sharded_landed) / statistics.median(gathered_landed), 4),
            "readers": per_reader,
            "machine": {"cpus": os.cpu_count(), "loadavg_before": load0, "loadavg_after": os.getloadavg()},
            "command": command}


@register_scenario("reshard")
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsync.bench reshard", description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=512, help="model width (heads of 64)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--reps", type=int, default=5, help="publishes of each kind (median reported)")
    p.add_argument("--readers", type=int, default=4, help="whole-tensor readers")
    p.add_argument("--json", type=Path, help="write the figures here")
    a = p.parse_args(argv)
    res = run(a.hidden, a.layers, a.reps, a.readers, " ".join(["python -m rlsync.bench reshard", *argv]))
    print(f"model: {res['model']['bytes'] / 1e6:.1f} MB in {res['model']['tensors']} tensors, 2 ZeRO-3 ranks; "
          f"load {res['machine']['loadavg_before'][0]:.1f} -> {res['machine']['loadavg_after'][0]:.1f}")
    print(f"trainer publish: sharded {statistics.median(res['publish_sharded_s']) * 1e3:.1f} ms, "
          f"gather-then-publish {statistics.median(res['publish_gathered_s']) * 1e3:.1f} ms (median of {res['reps']}); "
          f"ratio {res['publish_ratio_vs_gather']} (paired {res['paired_publish_ratio_vs_gather']})")
    print(f"until the version landed (checksummed, registered): sharded "
          f"{statistics.median(res['landed_sharded_s']) * 1e3:.1f} ms, gathered "
          f"{statistics.median(res['landed_gathered_s']) * 1e3:.1f} ms; ratio {res['landed_ratio_vs_gather']}")
    for r in res["readers"]:
        src = ", ".join(f"{w}: {n / 1e6:.2f} MB" for w, n in r["bytes_by_source"].items())
        frac = f" ({r['fraction_of_model']:.2f} of the model)" if "fraction_of_model" in r else ""
        print(f"  {r['reader']:10s} {r['seconds']:.3f} s  bytes per source: {src}{frac}")
    print(f"exact: {res['exact']}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(res, indent=2))
    return 0 if res["exact"] else 1
