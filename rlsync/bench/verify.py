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
  for generation runs (`--gen-s` seconds of fp32 matmuls, calibrated once), then the wait for it; the same
  stand-in alone in the same round is the baseline.

Figures (medians over rounds, the load average beside them; both sides measured in the same run):
`verify_overhead_ratio_inplace` / `_converted` = the check inside the pause / sync;
`verify_overhead_ratio` = what the overlapped check adds to the round's wall (stand-in + wait - stand-in alone)
/ sync: the acceptance figure (issue 35: <= 0.02).
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
    from rlsync.sync.verify import check_weights

    ap = argparse.ArgumentParser(prog="python -m rlsync.bench verify")
    ap.add_argument("--mb", type=float, default=540.0, help="model size in fp32 MB (SmolLM2-135M: 538)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gen-s", type=float, default=5.0,
                    help="seconds of the generation stand-in per round (calibrated once; its baseline is beside it)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    load0 = os.getloadavg()
    shapes = _shapes(args.mb)
    g = torch.Generator().manual_seed(0)
    live = {n: torch.randn(s, generator=g) for n, s in shapes.items()}
    into = {n: torch.empty_like(t) for n, t in live.items()}
    engine_bf16 = {n: torch.empty(t.shape, dtype=torch.bfloat16) for n, t in live.items()}
    a = torch.randn(384, 384, generator=g)

    def gen(n: int) -> float:
        t = time.perf_counter()
        for _ in range(n):
            torch.mm(a, a)
        return time.perf_counter() - t

    gen(50)  # warm-up: the first calls allocate and start threads
    one = gen(200) / 200
    iters = max(1, int(args.gen_s / one))
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
                t2 = time.perf_counter()
                bad_in_place = check_weights(got.manifest, into, None)
                check_in_place_s = time.perf_counter() - t2
                t3 = time.perf_counter()
                bad_converted = check_weights(got.manifest, engine_bf16, into)
                check_converted_s = time.perf_counter() - t3
                alone_s = gen(iters)
                box: list = []
                th = threading.Thread(target=lambda: box.append(check_weights(got.manifest, into, None)))
                t4 = time.perf_counter()
                th.start()
                gen(iters)
                th.join()
                overlapped_s = time.perf_counter() - t4
                rows.append(dict(version=v, fetch_s=fetch_s, apply_s=apply_s, check_in_place_s=check_in_place_s,
                                 check_converted_s=check_converted_s, gen_alone_s=alone_s, gen_overlapped_s=overlapped_s,
                                 added_s=overlapped_s - alone_s,
                                 agree=not bad_in_place and not bad_converted and box == [[]]))
        finally:
            reader.leave()
            trainer.leave()
    med = {k: statistics.median(r[k] for r in rows) for k in ("fetch_s", "apply_s", "check_in_place_s",
                                                                "check_converted_s", "gen_alone_s", "added_s")}
    out = {"mb": sum(t.numel() * 4 for t in live.values()) / 1e6, "rounds": args.rounds, **med,
           "verify_overhead_ratio_inplace": med["check_in_place_s"] / med["fetch_s"],
           "verify_overhead_ratio_converted": med["check_converted_s"] / (med["fetch_s"] + med["apply_s"]),
           "verify_overhead_ratio": max(0.0, med["added_s"]) / med["fetch_s"],
           "all_checks_agreed": all(r["agree"] for r in rows), "rows": rows,
           "load_before": list(load0), "load_after": list(os.getloadavg())}
    print(f"verify: {out['mb']:.0f} MB fp32, {args.rounds} rounds (medians), load {load0[0]:.2f} -> "
          f"{out['load_after'][0]:.2f}")
    print(f"  sync in place  : fetch {med['fetch_s']:.3f} s; check {med['check_in_place_s']:.4f} s -> "
          f"ratio {out['verify_overhead_ratio_inplace']:.4f}")
    print(f"  sync converted : fetch + apply {med['fetch_s'] + med['apply_s']:.3f} s; check "
          f"{med['check_converted_s']:.4f} s -> ratio {out['verify_overhead_ratio_converted']:.4f}")
    print(f"  overlapped     : generation stand-in {med['gen_alone_s']:.3f} s alone, +{med['added_s']:.4f} s with "
          f"the check -> ratio {out['verify_overhead_ratio']:.4f} of the sync")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0
