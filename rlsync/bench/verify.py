"""`python -m rlsync.bench verify`: the cost of checking what the engine computes with, against the sync it checks.

    python -m rlsync.bench verify [--mb 540] [--rounds 5] [--json F]

One embedded hub, a trainer client publishing `--mb` of fp32 tensors shaped like SmolLM2-135M's layers (30
blocks of q/k/v/o, gate/up/down, two norms; the embedding), a reader fetching each version into its own
buffers over loopback TCP (the `hf` engine's in-place path). Per round, untimed set-up aside:

- sync: the publish's commit, the reader's fetch (plan, transfer, every unit checked) and, for a converting
  engine (vLLM on CPU: fp32 -> bf16), the apply's converting copy into the engine's buffers;
- weights check, in place (rlsync/sync/verify.py `check_weights`): every unit's checksum recomputed over
  the engine's buffers;
- weights check, converted: the staged fp32 bytes re-checked against the manifest, converted by the receiver,
  digests compared with the engine's bf16 buffers;
- overlapped (`sync.verify.overlap`, the default): the in-place check in a background thread while a stand-in
  for generation runs (as many fp32 matmuls as ran in `--gen-s` seconds alone), then the wait for it; the same
  stand-in alone in the same round is the baseline;
- overlapped, converted (the vLLM engine with `verify_ahead`): in a background thread while the same stand-in
  runs, the expected bf16 digests made from the staging as the version lands (the stage's prefetch thread) and
  the engine's bf16 buffers hashed against them (the check after the apply); nothing stays in the pause;
- bf16 variant (`sync.variant=bf16`, docs/derived.md): the engine reads bf16 bytes made once for every engine (no
  converting copy, half the bytes); the check, overlapped with the same stand-in, is the variant's own unit
  checksums over the engine's buffers: nothing converted by the receiver either.

Figures (medians over rounds, the load average beside them; both sides measured in the same run):
`verify_overhead_ratio_inplace` / `_converted` = the check inside the pause / sync;
`verify_overhead_ratio` = what the overlapped check adds to the round's wall (stand-in + wait - stand-in alone)
/ sync (hf; the wall of a CPU stand-in beside other jobs is noisy: +-0.5 s at load 10; `added_noop_s`, the same calls
beside a thread that does nothing, is the control).
`verify_overhead_ratio_vllm_overlapped` = the wait for the check once the stand-in is done (what stays on the
critical path; nothing is in the pause) / its sync (fetch + converting apply), with `verify_cpu_ratio_vllm_overlapped`
beside it: the CPU seconds of the digests at landing + the check / the sync, what a CPU-bound generator on the same
cores loses (a GPU engine's generation would not; `verify_added_ratio_vllm_overlapped`: the noisy wall figure);
`verify_overhead_ratio_vllm_bf16_variant` and `verify_cpu_ratio_vllm_bf16_variant` the same for the variant.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import threading
import time

from . import register_scenario

log = logging.getLogger(__name__)


def _shapes(mb: float) -> dict[str, tuple[int, ...]]:
    """SmolLM2-135M's tensor shapes (hidden 576, MLP 1536, 30 blocks, vocab 49152), scaled in blocks to `mb`."""
    h, f, kv, vocab = 576, 1536, 192, 49152
    block = {"self_attn.q_proj.weight": (h, h), "self_attn.k_proj.weight": (kv, h), "self_attn.v_proj.weight": (kv, h),
             "self_attn.o_proj.weight": (h, h), "mlp.gate_proj.weight": (f, h), "mlp.up_proj.weight": (f, h),
             "mlp.down_proj.weight": (h, f), "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,)}
    per_block = sum(_n(s) for s in block.values()) * 4
    emb = vocab * h * 4
    blocks = max(1, int((mb * 1e6 - emb) // per_block))
    out = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,)}
    for i in range(blocks):
        out.update({f"model.layers.{i}.{k}": s for k, s in block.items()})
    return out


def _n(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@register_scenario("verify")
def main(argv: list[str]) -> int:
    import torch

    from rlsync.hub import ClientConfig, HubClient, Location, start_embedded_hub
    from rlsync.sync.verify import check_weights, expected_digests

    ap = argparse.ArgumentParser(prog="python -m rlsync.bench verify")
    ap.add_argument("--mb", type=float, default=540.0, help="model size in fp32 MB (SmolLM2-135M: 538)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gen-s", type=float, default=5.0,
                    help="seconds of the generation stand-in alone per round (its calls then run beside each check)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    load0 = os.getloadavg()
    shapes = _shapes(args.mb)
    g = torch.Generator().manual_seed(0)
    live = {n: torch.randn(s, generator=g) for n, s in shapes.items()}
    into = {n: torch.empty_like(t) for n, t in live.items()}
    engine_bf16 = {n: torch.empty(t.shape, dtype=torch.bfloat16) for n, t in live.items()}
    derived = {n: torch.empty_like(t) for n, t in engine_bf16.items()}  # the trainer-side bf16 variant
    variant = {n: torch.empty_like(t) for n, t in engine_bf16.items()}  # an engine reading it: no conversion
    a = torch.randn(384, 384, generator=g)

    def gen(n: int) -> float:
        t = time.perf_counter()
        for _ in range(n):
            torch.mm(a, a)
        return time.perf_counter() - t

    def gen_for(seconds: float) -> tuple[int, float]:
        """The stand-in alone for about `seconds`: (calls made, wall). Its calls then run again beside the check:
        a calibration made once drifted 15x from the rounds (the hub's threads change how torch's run)."""
        n, t = 0, time.perf_counter()
        while time.perf_counter() - t < seconds:
            gen(10)
            n += 10
        return n, time.perf_counter() - t

    def timed(fn) -> tuple:
        """(fn(), wall, CPU seconds of the process: fn's threads, pools and torch's included)."""
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        return out, time.perf_counter() - t, time.process_time() - c

    def beside(fn, iters: int) -> tuple:
        """fn in a thread while the stand-in makes `iters` calls: (fn(), wall of both, the wait for fn once the
        stand-in is done: what it adds to the critical path)."""
        box: list = []
        th = threading.Thread(target=lambda: box.append(fn()))
        t = time.perf_counter()
        th.start()
        gen(iters)
        tw = time.perf_counter()
        th.join()
        return box[0], time.perf_counter() - t, time.perf_counter() - tw

    gen(50)  # warm-up: the first calls allocate and start threads
    rows = []
    with start_embedded_hub() as hub:
        trainer = HubClient(hub.address, hub.token, config=ClientConfig())
        reader = HubClient(hub.address, hub.token, config=ClientConfig())
        trainer.join(Location(host="t"), "trainer")
        reader.join(Location(host="r"), "reader")
        try:
            for v in range(1, args.rounds + 1):
                if v > 1:
                    trainer.release("policy", v - 1)
                    trainer.release("policy_bf16", v - 1)
                    for t in live.values():
                        t.add_(1e-3)  # the optimizer step: untimed
                t0 = time.perf_counter()
                trainer.publish("policy", v, live)
                got = reader.fetch("policy", v, into=into)
                fetch_s = time.perf_counter() - t0
                t1 = time.perf_counter()
                for n, t in into.items():
                    engine_bf16[n].copy_(t)  # the converting engine's apply
                apply_s = time.perf_counter() - t1
                in_place = timed(lambda: check_weights(got.manifest, into, None))
                converted = timed(lambda: check_weights(got.manifest, engine_bf16, into))
                landed = timed(lambda: expected_digests(got.manifest, into, torch.bfloat16))  # the prefetch thread's
                ahead = timed(lambda: check_weights(got.manifest, engine_bf16, landed[0]))  # after the apply
                iters, alone_s = gen_for(args.gen_s)
                noop = beside(lambda: [], iters)  # the control: the same calls beside a thread doing nothing
                hf = beside(lambda: check_weights(got.manifest, into, None), iters)
                vllm = beside(lambda: check_weights(got.manifest, engine_bf16,
                                                    expected_digests(got.manifest, into, torch.bfloat16)), iters)
                # the bf16 variant (docs/derived.md): derived once for every engine (untimed here: the deriver's
                # job), read as is; the check is the variant's unit checksums over the engine's bf16 buffers
                for n_, t_ in live.items():
                    derived[n_].copy_(t_)
                trainer.publish("policy_bf16", v, derived)
                t8 = time.perf_counter()
                got_b = reader.fetch("policy_bf16", v, into=variant)
                variant_fetch_s = time.perf_counter() - t8
                var_cpu = timed(lambda: check_weights(got_b.manifest, variant, None))
                var = beside(lambda: check_weights(got_b.manifest, variant, None), iters)
                rows.append(dict(
                    version=v, fetch_s=fetch_s, apply_s=apply_s, check_in_place_s=in_place[1],
                    check_converted_s=converted[1], gen_alone_s=alone_s, added_noop_s=noop[1] - alone_s,
                    added_s=hf[1] - alone_s, wait_s=hf[2],
                    cpu_s=in_place[2], digest_s=landed[1], check_ahead_s=ahead[1], cpu_vllm_s=landed[2] + ahead[2],
                    added_vllm_s=vllm[1] - alone_s, wait_vllm_s=vllm[2], variant_fetch_s=variant_fetch_s,
                    added_variant_s=var[1] - alone_s, wait_variant_s=var[2], cpu_variant_s=var_cpu[2],
                    agree=all(x == [] for x in (in_place[0], converted[0], ahead[0], hf[0], vllm[0], var[0], var_cpu[0]))))
        finally:
            reader.leave()
            trainer.leave()
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k not in ("version", "agree")}
    sync_vllm = med["fetch_s"] + med["apply_s"]
    out = {"mb": sum(t.numel() * 4 for t in live.values()) / 1e6, "rounds": args.rounds, **med,
           "verify_overhead_ratio_inplace": med["check_in_place_s"] / med["fetch_s"],
           "verify_overhead_ratio_converted": med["check_converted_s"] / (med["fetch_s"] + med["apply_s"]),
           "verify_overhead_ratio": max(0.0, med["added_s"]) / med["fetch_s"],
           "verify_overhead_ratio_vllm_overlapped": med["wait_vllm_s"] / sync_vllm,
           "verify_cpu_ratio_vllm_overlapped": med["cpu_vllm_s"] / sync_vllm,
           "verify_added_ratio_vllm_overlapped": max(0.0, med["added_vllm_s"]) / sync_vllm,
           "verify_overhead_ratio_vllm_bf16_variant": med["wait_variant_s"] / med["variant_fetch_s"],
           "verify_cpu_ratio_vllm_bf16_variant": med["cpu_variant_s"] / med["variant_fetch_s"],
           "verify_cpu_ratio": med["cpu_s"] / med["fetch_s"],
           "all_checks_agreed": all(r["agree"] for r in rows), "rows": rows,
           "load_before": list(load0), "load_after": list(os.getloadavg())}
    print(f"verify: {out['mb']:.0f} MB fp32, {args.rounds} rounds (medians), load {load0[0]:.2f} -> "
          f"{out['load_after'][0]:.2f}")
    print(f"  sync in place  : fetch {med['fetch_s']:.3f} s; check {med['check_in_place_s']:.4f} s -> "
          f"ratio {out['verify_overhead_ratio_inplace']:.4f}")
    print(f"  sync converted : fetch + apply {med['fetch_s'] + med['apply_s']:.3f} s; check "
          f"{med['check_converted_s']:.4f} s -> ratio {out['verify_overhead_ratio_converted']:.4f}")
    print(f"  control        : the stand-in beside a thread doing nothing: +{med['added_noop_s']:.4f} s")
    print(f"  overlapped (hf): generation stand-in {med['gen_alone_s']:.3f} s alone, +{med['added_s']:.4f} s with "
          f"the check (wait after it {med['wait_s']:.4f} s) -> ratio {out['verify_overhead_ratio']:.4f}; CPU "
          f"{med['cpu_s']:.4f} s = {out['verify_cpu_ratio']:.4f} of the sync")
    print(f"  vLLM overlapped: digests at landing {med['digest_s']:.4f} s + check {med['check_ahead_s']:.4f} s off the "
          f"pause; wait after the stand-in {med['wait_vllm_s']:.4f} s -> ratio "
          f"{out['verify_overhead_ratio_vllm_overlapped']:.4f}; CPU {med['cpu_vllm_s']:.4f} s = "
          f"{out['verify_cpu_ratio_vllm_overlapped']:.4f}; wall added +{med['added_vllm_s']:.4f} s")
    print(f"  vLLM bf16 variant: fetch {med['variant_fetch_s']:.3f} s (no converting copy); wait "
          f"{med['wait_variant_s']:.4f} s -> ratio {out['verify_overhead_ratio_vllm_bf16_variant']:.4f}; CPU "
          f"{med['cpu_variant_s']:.4f} s = {out['verify_cpu_ratio_vllm_bf16_variant']:.4f} of its sync")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0
