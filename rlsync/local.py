"""A single-process, synchronous RL loop: the smallest whole pipeline, for tests, docs and smoke runs.

    scripts/run python -m rlsync.local --task reverse --steps 150     # prints a learning curve

Each step: sample `prompts_per_step` prompts × `group_size` responses with the rollout engine,
score them with the task's verifier, train one step, then copy the trainer's weights into the
engine through the same interfaces the hub uses (`named_parameters_for_sync` → `load_state`).

Simplifies: no Ray, no hub, no asynchrony (staleness 0). The real driver is `rlsync.driver`. It lives
here, beside the driver, because it uses both the trainer and rollout rooms (which never import each other).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import time
from dataclasses import dataclass, field

import torch

from rlsync.hub.logs import setup_logging
from rlsync.rollout import RolloutEngine, TinyModelConfig, build_task, build_tiny_model
from rlsync.trainer import OptimizerConfig, TorchBackend

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class LocalLoopConfig:
    task: str = "reverse"
    """Registered task (reverse, successor)."""
    seed: int = 0
    """Seeds the model init, the prompt stream and sampling."""
    steps: int = 150
    """Trainer steps."""
    prompts_per_step: int = 32
    """Distinct prompts per step."""
    group_size: int = 8
    """Responses per prompt (the GRPO group)."""
    arch: str = "llama"
    """Tiny model architecture (llama, qwen2)."""
    torch_threads: int | None = 1
    """Intra-op threads while the loop runs (restored after); a tiny model runs fastest on one."""
    trainer: TorchBackend.Config = field(default_factory=lambda: TorchBackend.Config(
        optimizer=OptimizerConfig(lr=2e-3), adv_est="grpo", policy_loss="grpo"))
    """Trainer backend configuration."""


def run_local_loop(cfg: LocalLoopConfig) -> list[dict[str, float]]:
    """Run the loop; returns one metrics dict per step (reward_mean, entropy, loss, ...)."""
    threads = torch.get_num_threads()
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    try:
        return _run(cfg)
    finally:
        torch.set_num_threads(threads)


def _run(cfg: LocalLoopConfig) -> list[dict[str, float]]:
    torch.manual_seed(cfg.seed)
    task = build_task(cfg.task, seed=cfg.seed)
    tok = task.tokenizer
    model = build_tiny_model(TinyModelConfig(arch=cfg.arch, seed=cfg.seed), tok.vocab_size)
    engine = RolloutEngine(RolloutEngine.Config(temperature=cfg.trainer.temperature, max_new_tokens=task.response_len),
                           copy.deepcopy(model), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    backend = TorchBackend(cfg.trainer, model)
    history = []
    start = time.perf_counter()
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        prompts = task.next_prompts(cfg.prompts_per_step)
        out = engine.generate([p.prompt_ids for p in prompts for _ in range(cfg.group_size)])
        rewards = torch.tensor([task.score(prompts[i // cfg.group_size], r) for i, r in enumerate(out.response_ids)])
        group_ids = torch.tensor([p.index for p in prompts]).repeat_interleave(cfg.group_size)
        t_gen = time.perf_counter() - t0
        metrics = backend.train_step(out.to_batch(rewards, group_ids))
        engine.load_state(backend.named_parameters_for_sync(), version=backend.version)
        metrics.update(step=step, rollout_time_s=t_gen, elapsed_s=time.perf_counter() - start)
        history.append(metrics)
        log.info("step %d reward %.3f entropy %.3f kl_to_behaviour %.2e", step, metrics["reward_mean"],
                 metrics["entropy"], metrics["approx_kl"])
    return history


def main() -> None:
    from rlsync.hub import cli_args as V
    from rlsync.rollout.tasks import TASKS

    p = argparse.ArgumentParser(prog="python -m rlsync.local", description=__doc__.split("\n")[0])
    p.add_argument("--task", default="reverse", choices=TASKS.names())
    p.add_argument("--steps", type=V.positive_int, default=150)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=V.positive_float, default=2e-3)
    p.add_argument("--arch", default="llama", choices=("llama", "qwen2"))
    p.add_argument("--every", type=V.positive_int, default=10, help="print one line per this many steps")
    p.add_argument("--jsonl", type=V.file_to_create, default=None, help="also write every step's metrics here")
    a = p.parse_args()
    setup_logging("WARNING")
    cfg = LocalLoopConfig(task=a.task, steps=a.steps, seed=a.seed, arch=a.arch)
    cfg.trainer.optimizer.lr = a.lr
    hist = run_local_loop(cfg)
    for h in hist:
        if h["step"] % a.every == 0 or h["step"] == len(hist) - 1:
            print(f"step {h['step']:4d}  reward {h['reward_mean']:.3f}  entropy {h['entropy']:.3f}  "
                  f"zero-spread groups {h['zero_spread_group_frac']:.2f}  t {h['elapsed_s']:.1f}s")
    if a.jsonl:
        with open(a.jsonl, "w") as f:
            f.writelines(json.dumps(h) + "\n" for h in hist)


if __name__ == "__main__":
    main()
