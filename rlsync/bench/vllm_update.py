"""`python -m rlsync.bench vllm_update [--rounds N] [--json F]`: one SmolLM2 version into a vLLM engine.

In one run, the same engine, interleaved rounds (after one untimed warm-up of each path):

- lower bound: vLLM's layerwise reload from tensors already in the engine's process (with the tied
  lm_head re-packed: vLLM's own reload leaves it stale on CPU, docs/vllm.md);
- direct floor: the engine's direct apply (rollout/vllm/direct.py, what the hub path applies with)
  from tensors already in the engine's process: what the hub adds on top is the fetch alone;
- hub: the trainer (a Ray actor, its own process) publishes its live fp32 tensors (no copy), the
  engine's `HubWeightStage.update` fetches them into its host staging replica and applies them;
- hub pipelined: the same with `pipelined=True` (each tensor applied as soon as its units landed);
- verl-style: the trainer `ray.put`s its state dict (trainer -> Ray object store), the engine
  `ray.get`s it and applies it (the usual Ray-based path).

Each path is timed from "the trainer holds the new weights" to "the engine applied them". The
figure is the median over rounds; `ratio_vs_lower_bound` = hub / lower bound (target <= 1.3),
`ratio_vs_direct_floor` = hub / direct floor (the stricter floor: the same apply, no transfer).
The machine's load average is printed beside it: on 2 shared cores every figure moves with load.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time

from . import register_scenario

log = logging.getLogger(__name__)


def _trainer_actor():
    import ray

    @ray.remote(num_cpus=1)
    class Trainer:
        """The trainer's side: SmolLM2 in fp32, a hub client; each round a new (bf16-exact) version."""

        def __init__(self, model_dir: str, hub_address: str, hub_token: str):
            import torch
            import transformers

            from rlsync.hub import HubClient, Location

            torch.set_num_threads(1)
            self.model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            self.params = {n: p.data for n, p in self.model.named_parameters()}
            self.hub = HubClient(hub_address, token=hub_token)
            self.hub.join(Location(host="h0"), name="trainer")
            self.version = 0

        def step(self) -> int:
            """Stands in for an optimizer step (release the last version first: the contract)."""
            import torch

            if self.version:
                self.hub.release("policy", self.version)
            self.version += 1
            with torch.no_grad():
                self.params["model.norm.weight"].mul_(1.01)
            return self.version

        def publish(self) -> int:
            self.hub.publish("policy", self.version, self.params)  # live tensors, no copy
            return self.version

        def put(self):
            import ray

            return [ray.put(self.params)]  # verl-style: the state dict into the object store

        def leave(self) -> None:
            self.hub.leave()

    return Trainer


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run(rounds: int) -> dict:
    import ray

    from rlsync.hub import HubClient, Location, start_embedded_hub
    from rlsync.rollout.vllm.model_dir import prepare_smollm2
    from rlsync.rollout.vllm.engine import VllmEngine
    from rlsync.rollout.vllm.stage import HubWeightStage
    from rlsync.rollout.vllm.staging import specs_of

    model_dir = prepare_smollm2()
    load_before = _load()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    hub = start_embedded_hub()
    try:
        trainer = _trainer_actor().remote(model_dir, hub.address, hub.token)
        engine = VllmEngine(VllmEngine.Config(max_model_len=256))
        client = HubClient(hub.address, token=hub.token)
        client.join(Location(host="h0"), name="vllm0")
        stage = HubWeightStage(client, engine)
        ray.get(trainer.step.remote())
        ray.get(trainer.publish.remote())
        stage.update("latest")                       # allocates the staging buffers
        local = {n: t.clone() for n, t in stage._staging.items()}   # the lower bound's in-process tensors
        specs = specs_of(stage._manifest)
        times: dict[str, list[float]] = {"lower_bound": [], "direct_floor": [], "hub": [], "hub_pipelined": [],
                                         "verl_ray": []}
        fetch_s, apply_s = [], []

        def lower_bound():
            engine.apply(iter(local.items()), engine.version, mode="layerwise")  # same version: hub rounds stay newer

        def direct_floor():
            engine.apply(iter(local.items()), engine.version, specs=specs, mode="direct")

        def hub_path(pipelined: bool):
            def go():
                v = ray.get(trainer.publish.remote())
                s = stage.update(v, pipelined=pipelined)
                if not pipelined:
                    fetch_s.append(s.fetch_s)
                    apply_s.append(s.apply_s)
            return go

        def verl_path():
            ref = ray.get(trainer.put.remote())[0]
            state = ray.get(ref)
            engine.apply(iter(state.items()), engine.version, mode="layerwise")  # vLLM's loader, as verl does

        paths = {"lower_bound": lower_bound, "direct_floor": direct_floor, "hub": hub_path(False), "hub_pipelined": hub_path(True),
                 "verl_ray": verl_path}
        for r in range(rounds + 1):
            for name, fn in paths.items():
                if name.startswith("hub"):
                    ray.get(trainer.step.remote())   # a new version for each hub round (untimed)
                t0 = time.monotonic()
                fn()
                if r > 0:                            # round 0 warms every path up
                    times[name].append(time.monotonic() - t0)
            log.info("round %d/%d done (load %s)", r, rounds, _load())
        ray.get(trainer.leave.remote())
        client.leave()
        engine.shutdown()
    finally:
        ray.shutdown()
        hub.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"rounds": rounds, "model": "SmolLM2-135M-Instruct (trainer fp32, 538 MB; engine bf16)",
            "median_s": med, "all_s": times,
            "hub_fetch_s_median": statistics.median(fetch_s), "hub_apply_s_median": statistics.median(apply_s),
            "ratio_vs_lower_bound": med["hub"] / med["lower_bound"],
            "ratio_vs_direct_floor": med["hub"] / med["direct_floor"],
            "ratio_pipelined_vs_lower_bound": med["hub_pipelined"] / med["lower_bound"],
            "ratio_verl_vs_lower_bound": med["verl_ray"] / med["lower_bound"],
            "hub_vs_verl": med["hub"] / med["verl_ray"],
            "load_before": load_before, "load_after": _load(), "cpus": os.cpu_count()}


@register_scenario("vllm_update")
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsync.bench vllm_update", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per path (after one warm-up)")
    p.add_argument("--json", help="write every figure and the ratios here")
    a = p.parse_args(argv)
    res = run(a.rounds)
    m = res["median_s"]
    print(f"vllm_update: SmolLM2-135M version into a vLLM engine, median of {a.rounds} rounds "
          f"(load {res['load_before']} -> {res['load_after']}, {res['cpus']} cpus)")
    for k in ("lower_bound", "direct_floor", "hub", "hub_pipelined", "verl_ray"):
        print(f"  {k:<14} {m[k]:7.3f} s   x{m[k] / m['lower_bound']:.2f}")
    print(f"  hub fetch {res['hub_fetch_s_median']:.3f} s + apply {res['hub_apply_s_median']:.3f} s; "
          f"ratio_vs_lower_bound {res['ratio_vs_lower_bound']:.2f} (target <= 1.3); "
          f"vs direct floor {res['ratio_vs_direct_floor']:.2f}; hub/verl {res['hub_vs_verl']:.2f}")
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0
