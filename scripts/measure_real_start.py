"""The grpo_real task's start as the run samples it: its own prompts, reward and vLLM engine settings.

    scripts/run python scripts/measure_real_start.py [--prompts 64] [--samples 8] [--max-new-tokens 8]

Builds task `arithmetic` (max_operand 9, "+", reward number_format) exactly as recipe grpo_real does,
samples `--samples` responses per prompt at temperature 1 (and one greedy) with `VllmEngine` and prints
the mean reward and the shares behind it (starts with a number, just a number, right). A run's step-1
reward averages 32 samples of 4 prompts: this is the same quantity with far less noise.
"""
import argparse
import json
import os
import re

from rlsync.rollout import build_task
from rlsync.rollout.vllm.model_dir import prepare_smollm2
from rlsync.rollout.vllm.engine import VllmEngine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--seed", type=int, default=0, help="task seed (the run's training stream uses task.seed=0)")
    a = p.parse_args()
    from transformers import AutoTokenizer

    path = prepare_smollm2()
    task = build_task("arithmetic", AutoTokenizer.from_pretrained(path), seed=a.seed, max_operand=9, ops="+",
                      reward="number_format")
    prompts = [task.prompt_at(i) for i in range(a.prompts)]
    engine = VllmEngine(VllmEngine.Config(max_new_tokens=a.max_new_tokens, max_model_len=256))
    out = {"load_before": os.getloadavg()[0]}
    for mode in ("sampled", "greedy"):
        engine.config.do_sample = mode == "sampled"
        k = a.samples if mode == "sampled" else 1
        r = engine.generate([q.prompt_ids for q in prompts for _ in range(k)])
        texts = [task.tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in r.response_ids]
        scores = [task.score(prompts[i // k], ids) for i, ids in enumerate(r.response_ids)]
        n = len(scores)
        out[mode] = {"reward_mean": round(sum(scores) / n, 4), "samples": n,
                     "starts_with_number": round(sum(re.match(r"-?\d", t) is not None for t in texts) / n, 3),
                     "just_a_number": round(sum(s in (0.5, 1.0) for s in scores) / n, 3),
                     "right": round(sum(s >= 0.7 for s in scores) / n, 3), "examples": texts[:6]}
    out["load_after"] = os.getloadavg()[0]
    engine.shutdown()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
