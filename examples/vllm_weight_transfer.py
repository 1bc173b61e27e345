"""vLLM's own RL weight-sync flow with `backend="rlsync"`, end to end on CPU, two engines.

    scripts/run python examples/vllm_weight_transfer.py [--json out.json]

1. An rlsync hub starts in this process; a "trainer" holds SmolLM2-135M-Instruct in fp32 (transformers).
2. Engine A, a Ray actor running `vllm.LLM(..., weight_transfer_config=WeightTransferConfig(backend="rlsync"))`.
3. The trainer uses vLLM's trainer API unchanged: `WeightTransferTrainerFactory.trainer_init(
   RlsyncTrainerInitInfo(...), client=RayVLLMWeightSyncClient(A), source=ModuleSource(model))`, then
   after each "optimizer step" `send_weights()`; A's worker pulls the version through the hub.
4. Engine B starts later (elastic), runs the init handshake and one update of the current version:
   it reads from A's staging replica (the trainer has released that version already).
5. One more step reaches both engines; their greedy continuations must agree with each other and
   their first tokens with the trainer's fp32 model.

Prints one JSON line with what happened (versions, bytes by source, fetch/apply seconds).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import ray
import torch

log = logging.getLogger("vllm_weight_transfer")


@ray.remote(num_cpus=1)
class Engine:
    """A vLLM engine in its own process, exposing the methods RayVLLMWeightSyncClient calls."""

    def __init__(self, model_dir: str):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        from vllm import LLM
        from vllm.config import WeightTransferConfig

        from rlsync.rollout.vllm.transfer_backend import register

        register()  # the worker runs in this process: the factory must know "rlsync" here
        self.llm = LLM(model=model_dir, dtype="bfloat16", enforce_eager=True, max_model_len=256,
                       weight_transfer_config=WeightTransferConfig(backend="rlsync"))

    def init_weight_transfer_engine(self, request):
        self.llm.init_weight_transfer_engine(request)

    def start_weight_update(self):
        self.llm.start_weight_update()

    def update_weights(self, request):
        self.llm.update_weights(request)

    def finish_weight_update(self):
        self.llm.finish_weight_update()

    def update_weight_version(self, version: str):
        self.llm.update_weight_version(version)

    def sync_state(self) -> dict:
        from rlsync.rollout.vllm.transfer_backend import worker_sync_state

        return {**self.llm.collective_rpc(worker_sync_state)[0], "weight_version": self.llm.get_weight_version()}

    def greedy(self, prompts: list[list[int]], n: int) -> list[list[int]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                                 SamplingParams(temperature=0.0, max_tokens=n), use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]


def train_step(model, step: int) -> None:
    """Stands in for an optimizer step: a visible, bf16-exact change of the policy."""
    with torch.no_grad():
        norm = model.model.norm.weight
        norm.copy_((norm * (1.0 + 0.15 * step)).to(torch.bfloat16).float())


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the summary here too")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    import transformers
    from vllm.distributed.weight_transfer import ModuleSource, RayVLLMWeightSyncClient, WeightTransferTrainerFactory

    from rlsync.hub import start_embedded_hub
    from rlsync.rollout.vllm.model_dir import prepare_smollm2
    from rlsync.rollout.vllm.transfer_backend import RlsyncTrainerInitInfo, register

    register()
    model_dir = prepare_smollm2()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    hub = start_embedded_hub()
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    prompts = [list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                            tokenize=True, return_dict=True)["input_ids"])
               for q in ("What is 3 + 4? Reply with just the number.", "Name a color.")]
    out: dict = {}
    try:
        a = Engine.remote(model_dir)
        ray.get(a.sync_state.remote())  # wait for A to start
        info = RlsyncTrainerInitInfo(rank=0, hub_address=hub.address, hub_token=hub.token)
        sender = WeightTransferTrainerFactory.trainer_init(info, client=RayVLLMWeightSyncClient(a),
                                                           source=ModuleSource(model))
        train_step(model, 1)
        v1 = sender.send_weights()
        out["A_after_v1"] = ray.get(a.sync_state.remote())

        b = Engine.remote(model_dir)  # joins mid-run
        joiner = RayVLLMWeightSyncClient(b)
        joiner.init_weight_transfer_engine(sender.engine_init_info())
        joiner.start_weight_update()
        joiner.update_weights({"version": v1})
        joiner.finish_weight_update(weight_version=str(v1))
        out["B_join"] = ray.get(b.sync_state.remote())

        sender.client = RayVLLMWeightSyncClient([a, b])
        train_step(model, 2)
        v2 = sender.send_weights()
        out["A_after_v2"], out["B_after_v2"] = ray.get([a.sync_state.remote(), b.sync_state.remote()])
        ga, gb = ray.get([a.greedy.remote(prompts, 8), b.greedy.remote(prompts, 8)])
        with torch.no_grad():
            trainer_first = [int(model(torch.tensor([p])).logits[0, -1].argmax()) for p in prompts]
        out.update(versions=[v1, v2], engine_A_id=out["A_after_v1"]["worker_id"], greedy_A=ga, greedy_B=gb,
                   trainer_first_tokens=trainer_first, engines_agree=ga == gb,
                   first_tokens_match_trainer=[g[0] for g in ga] == trainer_first,
                   B_served_by_A=set(out["B_join"]["bytes_by_source"]) == {out["A_after_v1"]["worker_id"]})
        sender.shutdown()
    finally:
        ray.shutdown()
        hub.stop()
    line = json.dumps(out, default=str)
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    return out


if __name__ == "__main__":
    res = main()
    sys.exit(0 if res.get("engines_agree") and res.get("B_served_by_A") else 1)
