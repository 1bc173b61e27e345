"""`VllmEngine` at tensor_parallel_size=2: each TP rank reads only its slices of each version.

    scripts/run python examples/vllm_tp_slices.py [--json out.json]

1. A tiny random Llama (4 heads, 2 KV heads: TP=2 divides them; SmolLM2-135M has 9 heads and cannot
   run at TP=2) is written once to a directory; a "trainer" holds a new version of it in fp32.
2. Two hub workers publish that version as ZeRO-3 partitions (what a 2-rank DeepSpeed trainer publishes);
   version 2 is published whole (one worker, whole tensors).
3. `VllmEngine(tensor_parallel_size=2)` starts vLLM (two worker processes, gloo) with rlsync's worker
   extension (`rollout/vllm/tp.py`) on each; `join_hub` joins each rank to the hub and `load_version`
   makes each rank read its row/column blocks (v1: `ReshardReader.read`, only the units holding them;
   v2: the whole tensors, cut on the rank) and the direct apply writes them into its layers in place.
   Then a read of a version the hub never had fails (`TPLoadError`) and the engine keeps v2.
4. Checked: every rank's slices equal the trainer's tensors cut the same way (bit for bit, by digest),
   vLLM's own fused qkv / gate_up buffers equal the trainer's blocks in bf16, and vLLM's log-probs
   follow the new weights (mean |Δ log p| against the trainer's fp32 recomputation, before vs after).

On 2 cores vLLM binds one core per TP worker (`VLLM_CPU_OMP_THREADS_BIND=0|1`: its automatic binding
asks for one NUMA node per worker and this machine has one). Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def tiny_llama(path: str) -> str:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if not os.path.exists(os.path.join(path, "config.json")):
        torch.manual_seed(0)
        cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=512, max_position_embeddings=256,
                          tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
        LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    return path


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "rlsync-tiny-llama-tp"))
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    import torch
    from transformers import LlamaForCausalLM

    from rlsync.hub import HubClient, Location, start_embedded_hub
    from rlsync.hub.model.manifest import dtype_name
    from rlsync.hub.reshard.layout import zero3_layout
    from rlsync.hub.reshard.read import publish_shard
    from rlsync.rollout.vllm.engine import VllmEngine
    from rlsync.rollout.vllm.rl_engine import HubFedVllmEngine
    from rlsync.rollout.vllm.tp import sha256 as digest, tp_dests

    d = tiny_llama(args.dir)
    hf = LlamaForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(1)

    def new_version():  # bf16-exact weights, with a peaked head so log-probs tell versions apart
        with torch.no_grad():
            for n, p in hf.named_parameters():
                w = p * (1 + 0.5 * torch.randn(p.shape, generator=g)) * (40 if n == "lm_head.weight" else 1)
                p.copy_((w / w.abs().max() * 4 if n == "lm_head.weight" else w).to(torch.bfloat16).float())
        return {n: p.data.clone() for n, p in hf.named_parameters()}

    v1 = new_version()
    layout = zero3_layout({n: (tuple(t.shape), dtype_name(t.dtype)) for n, t in v1.items()}, 2)
    hub = start_embedded_hub()
    trainer = []
    for r in range(2):  # ZeRO-3 partitions as p.ds_tensor holds them: the real elements, then padding
        c = HubClient(hub.address, token=hub.token)
        c.join(Location(host="h0"), name=f"trainer-rank{r}")
        live = {}
        for p in layout.ranks[r]:
            live[p.name] = torch.zeros(p.length + p.padding)
            live[p.name][:p.length] = v1[p.name].reshape(-1)[p.start:p.start + p.length]
        publish_shard(c, "policy", 1, layout, r, live)
        trainer.append(c)
    t0 = time.monotonic()
    engine = VllmEngine(VllmEngine.Config(model_dir=d, max_model_len=128, max_new_tokens=8, seed=3,
                                          tensor_parallel_size=2), eos_token_id=2, pad_token_id=0)
    start_s = time.monotonic() - t0
    prompt = [1, 5, 6, 7, 8, 9]

    def gap(weights) -> float:
        """Mean |vLLM's log-prob - the trainer's fp32 log-prob of `weights`| over sampled tokens."""
        with torch.no_grad():
            for n, p in hf.named_parameters():
                p.copy_(weights[n])
        out = engine.generate([prompt])
        ids, k = out.response_ids[0], out.input_ids.shape[1] - max(len(x) for x in out.response_ids)
        with torch.no_grad():
            lp = torch.log_softmax(hf(torch.tensor([prompt + ids])).logits[0], -1)
        ref = [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(ids)]
        return sum(abs(a - out.logprobs[0, k + i].item()) for i, a in enumerate(ref)) / len(ref)

    before = gap(v1)
    # v1 as an RL rollout worker takes it: the `rollout.engine=vllm` wrapper joins every TP rank to the hub
    # and `update_latest` has each read its slices of the hub's latest (the trainer's ZeRO-3 layout)
    ctl = HubClient(hub.address, token=hub.token)
    ctl.join(Location(host="h0"), name="engine0")
    fed = HubFedVllmEngine(engine)
    fed.attach_hub(ctl, "policy", layout=layout)
    ids = engine.llm.collective_rpc("rlsync_hub_id")
    names = {c.worker_id: f"trainer-rank{i}" for i, c in enumerate(trainer)}
    out = {"start_s": round(start_s, 1), "model_bytes": sum(t.nbytes for t in v1.values()),
           "gap_before": round(before, 4), "versions": []}
    exact = True
    for version, full, lay in ((1, v1, layout), (2, None, None)):
        t0 = time.monotonic()
        if version == 1:
            stats = fed.update_latest()
            out["rl_sync"] = {"version": stats.version, "nbytes": stats.nbytes, "pause_s": round(stats.pause_s, 3)}
            ranks = engine.load_version("policy", 1, layout, digests=True)  # held already: digests only
        else:  # the next version, published whole (a trainer without ZeRO-3), loaded directly
            v2 = full = new_version()
            trainer[0].publish("policy", 2, v2)
            ranks = engine.load_version("policy", version, lay, digests=True)
        row = {"version": version, "published": "zero3" if lay else "whole", "engine_version": engine.version,
               "load_s_both_ranks": round(time.monotonic() - t0, 3), "gap_after": round(gap(full), 4), "ranks": []}
        bufs = engine.llm.collective_rpc("rlsync_buffer_digests")
        for r, res in enumerate(ranks):
            k = res["rank"]
            want = {}
            for dd in tp_dests(list(full), k, 2):
                s = dd.slices[0]
                want[dd.name] = full[s.name] if s.dim is None else full[s.name].chunk(2, s.dim)[s.part]
            ok = res["digests"] == {n: digest(t) for n, t in want.items()} and res["version"] == version
            for layer in range(2):  # vLLM's own fused buffers, in its layout and dtype
                a, m = f"model.layers.{layer}.self_attn", f"model.layers.{layer}.mlp"
                ok &= bufs[r][f"{a}.qkv_proj"] == digest(torch.cat([want[f"{a}.{x}_proj.weight"] for x in "qkv"]).to(torch.bfloat16))
                ok &= bufs[r][f"{m}.gate_up_proj"] == digest(torch.cat([want[f"{m}.gate_proj.weight"],
                                                                        want[f"{m}.up_proj.weight"]]).to(torch.bfloat16))
            exact &= ok
            row["ranks"].append({"rank": k, "hub_id": ids[r], "exact": ok, "slice_bytes": res["nbytes"],
                                 "bytes_by_source": {names.get(w, w): n for w, n in res["bytes_by_source"].items()},
                                 "read_s": round(res["read_s"], 4), "apply_s": round(res["apply_s"], 4)})
        out["versions"].append(row)
    try:  # a version the hub never had: the read fails on every rank, nothing is applied
        engine.load_version("policy", 9, layout)
        out["failed_read"] = "loaded?!"
    except Exception as e:  # noqa: BLE001 - reported
        out["failed_read"] = type(e).__name__
    out["version_after_failed_read"] = engine.version
    out["gap_after_failed_read"] = round(gap(v2), 4)
    out["exact"] = exact
    fed.close()
    engine.shutdown()
    ctl.leave()
    for c in trainer:
        c.leave()
    hub.stop()
    print(json.dumps(out), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)
    return out


if __name__ == "__main__":  # vLLM's TP workers are spawned: the module must not run this on import
    sys.exit(0 if main()["exact"] else 1)
