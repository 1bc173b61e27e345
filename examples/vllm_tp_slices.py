"""vLLM CPU with tensor_parallel_size=2: each TP rank reads only its slices of a ZeRO-3-sharded version.

    scripts/run python examples/vllm_tp_slices.py [--json out.json]

1. A tiny random Llama (4 heads, 2 KV heads: TP=2 divides them; SmolLM2-135M has 9 heads and cannot
   run at TP=2) is written once to a directory; a "trainer" holds a new version of it in fp32.
2. Two hub workers publish that version as ZeRO-3 partitions (what a 2-rank DeepSpeed trainer publishes).
3. vLLM starts with `tensor_parallel_size=2` (two worker processes, gloo), rlsync's worker extension
   (`rollout/vllm_tp.py`) on each; each rank joins the hub, reads its row/column blocks
   (`ReshardReader.read`), and the direct apply writes them into its layers in place.
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
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from rlsync.hub import HubClient, Location, start_embedded_hub
    from rlsync.hub.manifest import dtype_name
    from rlsync.hub.reshard import zero3_layout
    from rlsync.hub.reshard_read import publish_shard
    from rlsync.rollout.vllm_tp import EXTENSION, load_slices, sha256 as digest, tp_dests

    d = tiny_llama(args.dir)
    hf = LlamaForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # the new version (bf16-exact), with a peaked head so log-probs tell versions apart
        for n, p in hf.named_parameters():
            w = p * (1 + 0.5 * torch.randn(p.shape, generator=g)) * (40 if n == "lm_head.weight" else 1)
            p.copy_(w.to(torch.bfloat16).float())
    full = {n: p.data for n, p in hf.named_parameters()}
    layout = zero3_layout({n: (tuple(t.shape), dtype_name(t.dtype)) for n, t in full.items()}, 2)
    hub = start_embedded_hub()
    trainer = []
    for r in range(2):  # ZeRO-3 partitions as p.ds_tensor holds them: the real elements, then padding
        c = HubClient(hub.address, token=hub.token)
        c.join(Location(host="h0"), name=f"trainer-rank{r}")
        live = {}
        for p in layout.ranks[r]:
            live[p.name] = torch.zeros(p.length + p.padding)
            live[p.name][:p.length] = full[p.name].reshape(-1)[p.start:p.start + p.length]
        publish_shard(c, "policy", 1, layout, r, live)
        trainer.append(c)
    t0 = time.monotonic()
    llm = LLM(model=d, dtype="bfloat16", enforce_eager=True, max_model_len=128, skip_tokenizer_init=True,
              tensor_parallel_size=2, distributed_executor_backend="mp", enable_prefix_caching=False,
              worker_extension_cls=EXTENSION)
    start_s = time.monotonic() - t0
    prompt = [1, 5, 6, 7, 8, 9]
    sp = SamplingParams(max_tokens=8, temperature=1.0, logprobs=0, seed=3, detokenize=False)

    def gap() -> float:
        o = llm.generate([TokensPrompt(prompt_token_ids=prompt)], sp, use_tqdm=False)[0].outputs[0]
        with torch.no_grad():
            lp = torch.log_softmax(hf(torch.tensor([prompt + list(o.token_ids)])).logits[0], -1)
        ref = [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(o.token_ids)]
        return sum(abs(a - x[t].logprob) for a, t, x in zip(ref, o.token_ids, o.logprobs)) / len(ref)

    before = gap()
    ids = llm.collective_rpc("rlsync_join", args=(hub.address, hub.token, "h0", "engine0"))
    t0 = time.monotonic()
    ranks = load_slices(llm, "policy", 1, layout)
    load_s = time.monotonic() - t0
    after = gap()
    bufs = llm.collective_rpc("rlsync_buffer_digests")
    names = {c.worker_id: f"trainer-rank{i}" for i, c in enumerate(trainer)}
    model_bytes = sum(t.nbytes for t in full.values())
    out = {"start_s": round(start_s, 1), "load_s_both_ranks": round(load_s, 3), "model_bytes": model_bytes,
           "gap_before": round(before, 4), "gap_after": round(after, 4), "ranks": []}
    exact = True
    for r, res in enumerate(ranks):
        k = res["rank"]
        want = {}
        for dd in tp_dests(list(full), k, 2):
            s = dd.slices[0]
            want[dd.name] = full[s.name] if s.dim is None else full[s.name].chunk(2, s.dim)[s.part]
        ok = res["digests"] == {n: digest(t) for n, t in want.items()}
        for layer in range(2):  # vLLM's own fused buffers, in its layout and dtype
            a, m = f"model.layers.{layer}.self_attn", f"model.layers.{layer}.mlp"
            ok &= bufs[r][f"{a}.qkv_proj"] == digest(torch.cat([want[f"{a}.{x}_proj.weight"] for x in "qkv"]).to(torch.bfloat16))
            ok &= bufs[r][f"{m}.gate_up_proj"] == digest(torch.cat([want[f"{m}.gate_proj.weight"],
                                                                    want[f"{m}.up_proj.weight"]]).to(torch.bfloat16))
        exact &= ok
        out["ranks"].append({"rank": k, "hub_id": ids[r], "exact": ok, "slice_bytes": res["nbytes"],
                             "bytes_by_source": {names.get(w, w): n for w, n in res["bytes_by_source"].items()},
                             "read_s": round(res["read_s"], 4), "apply_s": round(res["apply_s"], 4)})
    out["exact"] = exact
    llm.collective_rpc("rlsync_leave")
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
