"""`python -m rlsync.bench derived`: N engines on one version stream, variants (made once, read from peers) vs today's fp32 path.

    python -m rlsync.bench derived [--engines 3] [--rounds 5] [--vllm-rounds 6] [--int8-rounds 6] [--json F]

One embedded hub; a trainer client publishing SmolLM2-135M's live fp32 tensors (538 MB) as each version; N pool
engines on N hosts, each a hub client holding bf16 parameters as a bf16 engine does (HF-engine stand-ins: three
vLLM engines do not fit beside five other engineers on 2 cores; the apply-time figure is a real vLLM engine's).
Per version, in one run:

- fp32 path (today): every engine fetches the fp32 version and converts it into its bf16 parameters (a
  converting copy per engine: N conversions per version, their CPU seconds summed);
- bf16 variant: the engines ask for `policy@bf16` v at once. Odd versions (`sync.variant_by=engine`): the hub
  gives one of them the lease, it fetches the fp32 version, derives (rlsync/core/transforms.py) and publishes;
  the others are planned from it. Even versions (`sync.variant_by=trainer`): the trainer derived and published
  it right after v, so every engine reads only the variant. Then a same-dtype copy into the parameters;
- int8 variant (W8A8, compressed-tensors layout): derived once the same way; `sync_ratio_quantized_vs_bf16_pool_fetch`
  is the fetch time of a non-deriving pool engine for int8 over bf16, from the same holder;
- vLLM (after the pool has left; `--vllm-rounds 0`: none; rlsync/bench/derived_vllm.py): one SmolLM2 vLLM engine
  with two stages, alternating versions: the fp32 stage (direct apply with the fp32 -> bf16 converting copy) and
  the bf16-variant stage (the trainer derives each variant; from its second fetch the staging is fused and the
  linear layers are packed straight from it); `apply_ratio_bf16_vs_fp32` = median apply seconds (checksum
  re-check + copies + repack) bf16 / fp32, each apply also in parts (`vllm_apply_parts_s`);
- int8 in place (`--int8-rounds`, after that engine has gone): an engine started from the int8 checkpoint of the
  model directory, its stage reading `policy@int8` (trainer-derived) and applying it in place;
  `sync_ratio_quantized_vs_bf16` = median fetch + apply of that engine over the bf16-variant stage's;
- hashes: every engine's variant digest, and one derived independently by another process from version 1.

The load average is written beside the figures: on 2 shared cores they move with it.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import threading
import time

from . import register_scenario
from .derived_vllm import Int8Engine, VllmPair, fp32_weights, probe_int8, probe_repack

log = logging.getLogger(__name__)

_CHILD = r"""
import os, sys, torch
from safetensors.torch import load_file
from rlsync.core.digest import weights_digest
from rlsync.core.transforms import get_transform, specs_of
d = sys.argv[1]
src = {}
for f in sorted(os.listdir(d)):
    if f.endswith(".safetensors"):
        src.update({n: t.float() for n, t in load_file(os.path.join(d, f)).items()})
t = get_transform(sys.argv[2]); out = t.allocate(t.specs(specs_of(src))); t.apply(src, out)
print(weights_digest(out))
"""


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class _PoolEngine:
    """A bf16 engine's parameters behind a hub client: the fp32 path (fetch, convert) and a variant path."""

    def __init__(self, hub, i: int, specs: dict):
        import torch

        from rlsync.core.transforms import VariantReader
        from rlsync.hub import HubClient, Location

        # two workers per engine, so neither path finds the other's bytes already held
        self.client32, self.client = (HubClient(hub.address, token=hub.token) for _ in range(2))
        self.client32.join(Location(host=f"h{i + 1}"), name=f"engine{i}-fp32")
        self.client.join(Location(host=f"h{i + 1}"), name=f"engine{i}")
        self.params = {n: torch.empty(s, dtype=torch.bfloat16) for n, (s, _) in specs.items()}
        self.staging32 = None
        self.variants = {k: VariantReader(self.client, "policy", k, keep_scratch=False) for k in ("bf16", "int8")}
        self.into = {k: None for k in self.variants}

    def fp32_update(self, v: int) -> dict:
        import torch

        res = self.client32.fetch("policy", v, into=self.staging32)
        self.staging32 = res.tensors
        t0 = time.thread_time()
        with torch.no_grad():
            for n, p in self.params.items():
                p.copy_(res.tensors[n])  # the converting copy every engine does today
        return {"bytes": res.nbytes, "convert_cpu_s": time.thread_time() - t0, "fetch_s": res.seconds}

    def variant_update(self, kind: str, v: int) -> dict:
        r = self.variants[kind]
        before, base0 = r.conversion_s, r.base_bytes
        res = r.fetch(v, into=self.into[kind])
        self.into[kind] = res.tensors
        if kind == "bf16":
            for n, p in self.params.items():
                p.copy_(res.tensors[n])  # same dtype: a plain copy, no conversion
        return {"bytes": res.nbytes + r.base_bytes - base0, "convert_cpu_s": r.conversion_s - before,
                "fetch_s": res.seconds, "mode": res.mode, "derived": res.mode == "derived"}


def _parallel(fns) -> list:
    out, errs = [None] * len(fns), []

    def run(i, f):
        try:
            out[i] = f()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errs.append(e)

    ts = [threading.Thread(target=run, args=(i, f)) for i, f in enumerate(fns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errs:
        raise errs[0]
    return out


def run(engines: int, rounds: int, vllm_rounds: int, int8_rounds: int = 0) -> dict:
    import torch

    from rlsync.core.digest import weights_digest
    from rlsync.core.transforms import VariantReader
    from rlsync.hub import HubClient, Location, start_embedded_hub
    from rlsync.rollout.vllm.model_dir import prepare_smollm2

    torch.set_num_threads(1)  # conversion CPU seconds are the calling thread's (torch's pool would hide them)
    load_before = _load()
    model_dir = prepare_smollm2()
    hub = start_embedded_hub()
    trainer = HubClient(hub.address, token=hub.token)
    trainer.join(Location(host="h0"), name="trainer")
    params = fp32_weights(model_dir)
    state = {"version": 0}

    def publish() -> int:  # the trainer's next version: a small in-place step (no second copy of the model)
        v = state["version"]
        if v:
            trainer.release("policy", v)
            g = torch.Generator().manual_seed(v)
            for p in params.values():
                p.mul_(1 + 0.002 * torch.randn(p.shape, generator=g)).copy_(p.to(torch.bfloat16))
        state["version"] = v + 1
        trainer.publish("policy", v + 1, params)
        return v + 1

    vrows, rows, pool = [], [], []
    try:
        # phase 1: the pool (version 1 is the model directory's bytes: another process derives it independently)
        pool = [_PoolEngine(hub, i, {n: (tuple(t.shape), t.dtype) for n, t in params.items()}) for i in range(engines)]
        by_trainer = VariantReader(trainer, "policy", "bf16")  # sync.variant_by=trainer, on alternate rounds
        tbuf = None
        for r in range(rounds):
            version = publish()
            fp32 = [e.fp32_update(version) for e in pool]
            t_cpu, by = by_trainer.conversion_s, "trainer" if r % 2 else "engine"
            if by == "trainer":  # right after its publish, from its live tensors: no engine takes fp32
                tbuf = by_trainer.publish_from(version, params, into=tbuf).tensors
            bf16 = _parallel([lambda e=e: e.variant_update("bf16", version) for e in pool])
            bf16_trainer = {"derived": by == "trainer", "convert_cpu_s": by_trainer.conversion_s - t_cpu}
            int8 = _parallel([lambda e=e: e.variant_update("int8", version) for e in pool])
            digests = {k: sorted({weights_digest(e.into[k]) for e in pool}) for k in ("bf16", "int8")}
            rows.append({"version": version, "by": by, "fp32": fp32, "bf16": bf16, "bf16_trainer": bf16_trainer,
                         "int8": int8, "digests": digests, "load": _load()})
            log.info("derived bench v%d: %s", version, {k: [x["mode"] for x in rows[-1][k]] for k in ("bf16", "int8")})
        child = subprocess.run([sys.executable, "-c", _CHILD, model_dir, "bf16"], capture_output=True, text=True,
                               check=True, timeout=600).stdout.strip().splitlines()[-1]
        for e in pool:  # their memory goes before the vLLM engine comes
            e.client.leave()
            e.client32.leave()
        pool = []
        if vllm_rounds:  # phase 2: one vLLM engine, the two paths on alternate versions
            qbuf, by_trainer8 = None, VariantReader(trainer, "policy", "int8")

            def variant(kind: str) -> int:  # sync.variant_by=trainer: the engines read the variant, never fp32
                nonlocal tbuf, qbuf
                v = publish()
                if kind == "bf16":
                    tbuf = by_trainer.publish_from(v, params, into=tbuf).tensors
                elif kind == "int8":
                    qbuf = by_trainer8.publish_from(v, params, into=qbuf).tensors
                return v

            vllm = VllmPair(hub)
            try:
                for r in range(2 * vllm_rounds):
                    path = "bf16" if r % 2 else "fp32"
                    vrows.append(vllm.update(variant(path), path) | {"load": _load()})
            finally:
                vllm.close()
            if int8_rounds:  # phase 3: an engine started from the int8 checkpoint, fed the int8 variant in place
                q8 = Int8Engine(hub, model_dir, os.path.join(os.path.dirname(model_dir), "rlsync-bench-int8"))
                try:
                    for _ in range(int8_rounds):
                        vrows.append(q8.update(variant("int8")) | {"load": _load()})
                finally:
                    q8.close()
    finally:
        for e in pool:
            e.client.leave()
            e.client32.leave()
        trainer.leave()
        hub.stop()
    return _figures(rows, vrows, engines, child, rows[0]["digests"]["bf16"], load_before)


def _figures(rows: list, vl: list, n: int, child: str, v1: list, load_before) -> dict:
    med = statistics.median

    def per_engine(kind: str, by: str | None = None) -> float:
        return med(sum(x["bytes"] for x in row[kind]) / n for row in rows if by in (None, row["by"]))

    fetch_peer = {k: med(x["fetch_s"] for row in rows for x in row[k] if not x["derived"]) for k in ("bf16", "int8")}
    derivations = [sum(1 for x in row["bf16"] if x["derived"]) + row["bf16_trainer"]["derived"] for row in rows]
    fp32 = per_engine("fp32")
    out = {
        "engines": n, "rounds": len(rows),
        "bytes_per_engine_update": {"fp32": fp32, "bf16_trainer_derives": per_engine("bf16", "trainer"),
                                    "bf16_engine_derives": per_engine("bf16", "engine"), "int8": per_engine("int8")},
        "bytes_per_engine_update_nonderiving": {k: med(x["bytes"] for row in rows for x in row[k] if not x["derived"])
                                                for k in ("bf16", "int8")},
        "conversions_per_version": med(derivations), "conversions_per_version_max": max(derivations),
        "conversions_per_version_fp32_path": n,
        "conversion_cpu_s_per_version": {
            "fp32_path": med(sum(x["convert_cpu_s"] for x in row["fp32"]) for row in rows),
            "bf16": med(sum(x["convert_cpu_s"] for x in row["bf16"]) + row["bf16_trainer"]["convert_cpu_s"]
                        for row in rows),
            "int8": med(sum(x["convert_cpu_s"] for x in row["int8"]) for row in rows)},
        "variant_hashes_equal": all(len(row["digests"][k]) == 1 for row in rows for k in ("bf16", "int8"))
        and v1 == [child],
        "independent_process_digest_equal": v1 == [child],
        "sync_s_nonderiving": fetch_peer,
        "sync_ratio_quantized_vs_bf16": fetch_peer["int8"] / fetch_peer["bf16"],
        "load_before": load_before, "load_after": _load(), "rows": rows,
    }
    b = out["bytes_per_engine_update"]
    out["bytes_ratio_bf16_vs_fp32"] = b["bf16_trainer_derives"] / fp32  # sync.variant_by=trainer
    out["bytes_ratio_bf16_vs_fp32_engine_derives"] = b["bf16_engine_derives"] / fp32
    if vl:
        out["vllm_rows"] = vl
        paths = ("fp32", "bf16", "int8")
        warm = {k: [x for x in vl if x["path"] == k][1:] for k in paths}  # the first of each: warm-up (and unfused)
        out["vllm_bytes_per_update"] = {k: med(x["bytes"] for x in vl if x["path"] == k) for k in paths if warm[k]}
        out["vllm_apply_s"] = {k: med(x["apply_s"] for x in w) for k, w in warm.items() if w}
        out["vllm_sync_s"] = {k: med(x["fetch_s"] + x["apply_s"] for x in w) for k, w in warm.items() if w}
        out["vllm_apply_parts_s"] = {k: {p: med(x["parts"].get(p, 0.0) for x in w) for p in w[0]["parts"]}
                                     for k, w in warm.items() if w}
        if warm["fp32"] and warm["bf16"]:
            out["apply_ratio_bf16_vs_fp32"] = out["vllm_apply_s"]["bf16"] / out["vllm_apply_s"]["fp32"]
        if warm["bf16"] and warm["int8"]:  # fetch + apply of an engine that reads the variant (the trainer derived it)
            out["sync_ratio_quantized_vs_bf16_pool_fetch"] = out["sync_ratio_quantized_vs_bf16"]
            out["sync_ratio_quantized_vs_bf16"] = out["vllm_sync_s"]["int8"] / out["vllm_sync_s"]["bf16"]
    return out


@register_scenario("derived")
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsync.bench derived", description=__doc__.splitlines()[0])
    p.add_argument("--engines", type=int, default=3, help="pool engines (HF-engine stand-ins), >= 3 for the claim")
    p.add_argument("--rounds", type=int, default=5, help="versions published")
    p.add_argument("--vllm-rounds", type=int, default=6, help="vLLM updates per path (0: no vLLM engine)")
    p.add_argument("--int8-rounds", type=int, default=6, help="updates of the int8 vLLM engine (0: none)")
    p.add_argument("--probe-int8", metavar="DIR", help="only probe whether vLLM serves the int8 variant (written to DIR)")
    p.add_argument("--probe-repack", action="store_true", help="only probe the kernels' packed weights and repack time")
    p.add_argument("--json", help="write every figure here")
    a = p.parse_args(argv)
    if a.probe_int8 or a.probe_repack:
        from rlsync.rollout.vllm.model_dir import prepare_smollm2

        res = probe_repack() if a.probe_repack else probe_int8(prepare_smollm2(), a.probe_int8)
        print(json.dumps(res, indent=1))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
        return 0
    res = run(a.engines, a.rounds, a.vllm_rounds, a.int8_rounds)
    keys = ("engines", "bytes_ratio_bf16_vs_fp32", "bytes_ratio_bf16_vs_fp32_engine_derives", "conversions_per_version",
            "apply_ratio_bf16_vs_fp32", "variant_hashes_equal", "sync_ratio_quantized_vs_bf16",
            "conversion_cpu_s_per_version", "load_before", "load_after")
    for k in keys:
        print(f"{k:40s} {res.get(k)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return 0
