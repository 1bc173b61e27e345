"""`python -m rlsync.bench inflight`: a vLLM engine generating while versions are published, in flight vs drained.

    python -m rlsync.bench inflight [--rounds 5] [--batch 16] [--tokens 64] [--kv keep] [--soak 50] [--json F]

One SmolLM2-135M vLLM engine (bf16, offline model directory), one embedded hub, a trainer client in the same
process publishing the HF model's live fp32 tensors (no copy; its next version is written before the round,
untimed: only the publish, the fetch, the build and the swap fall inside a round). Rounds interleave three ways of generating
one batch (`--batch` prompts x `--tokens` tokens), so load drifts hit all three alike:

- none: no update;
- inflight: a version is published ~20% into the round; the engine's stage fetches it into host staging and
  builds it beside the live kernels in a background thread (rollout/vllm/double_buffer.py, what the
  receiver's follower does in a run), and the engine swaps it in at the next decode-step boundary;
- drain (today's path, the baseline): the same publish and background fetch, then after the round the
  engine stops and applies the staged version (the direct apply), and resumes.

Figures: decode pause per update (in flight: the swap; drained: the apply) p50/p95; tokens/s of each way
(response tokens over the wall of the rounds, pauses included); `tokens_per_s_ratio_updates_vs_none`
(inflight / none) and `tokens_per_s_ratio_vs_drain` (inflight / drain). Checks inside the run, reported
(a benchmark asserts nothing): every in-flight sample's versions are non-decreasing, within the round's two
versions, and every switch split the samples in flight at one decode step; after the last switch the
greedy tokens equal those after a drained apply of the same version (the engine loaded anew from staging);
`--soak N` more updates with short generations, each swapped in flight: no NaN log-prob, no token outside
the vocabulary. The load average is written beside the figures: on 2 shared cores every figure moves with it.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import threading
import time

from rlsync.sync import SyncConfig

from . import register_scenario

log = logging.getLogger(__name__)

QUESTIONS = ["What is 3 + 4? Reply with just the number.", "Name a color.", "Write a haiku about rain.",
             "Tell me a short story about a cat.", "List three fruits.", "Why is the sky blue?",
             "What is the capital of France?", "Count from one to ten in words."]


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


class _Trainer:
    """The trainer's side: SmolLM2 fp32, live tensors published as each version (bf16-exact, so engine and
    trainer hold identical weights); the final norm moves with the version, so versions sample differently."""

    def __init__(self, model_dir: str, hub):
        import torch
        import transformers

        from rlsync.hub import HubClient, Location

        m = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.params = {n: p.data for n, p in m.named_parameters()}
        self.base = {n: t.clone() for n, t in self.params.items()}
        self.client = HubClient(hub.address, token=hub.token)
        self.client.join(Location(host="h0"), name="trainer")
        self.version = 0

    def step(self) -> None:
        """The next version's weights (an optimizer step's stand-in), written after releasing the last
        version (the mutability contract). Untimed: the trainer's work, not the engine's update."""
        import torch

        if self.version:
            self.client.release("policy", self.version)
        self.version += 1
        g = torch.Generator().manual_seed(self.version)
        with torch.no_grad():
            for n, p in self.params.items():
                w = self.base[n] * (1 + 0.002 * torch.randn(p.shape, generator=g))
                if n == "model.norm.weight":
                    w = w * (0.6 + 0.1 * (self.version % 8))
                p.copy_(w.to(torch.bfloat16).to(torch.float32))

    def publish(self) -> int:
        """Register the live tensors as the version (no copy): what happens inside a round."""
        self.client.publish("policy", self.version, self.params)
        return self.version

    def next(self) -> int:
        self.step()
        return self.publish()


def _spans_ok(out, old: int, new: int) -> bool:
    """Versions non-decreasing along each sample, within {old, new}."""
    if out.token_versions is None:
        return True
    tv = out.token_versions
    m = out.response_mask.bool()
    vals = set(tv[m].tolist())
    mono = bool((tv[:, 1:] >= tv[:, :-1]).all())
    return mono and vals <= {old, new}


def _one_split(out, old: int, new: int) -> bool:
    """Every sample that spans the switch turns to `new` at the same token (all were prefilled in one step,
    so that is one decode step), and nothing else changes version."""
    if out.token_versions is None:
        return True
    firsts = set()
    for row, m in zip(out.token_versions, out.response_mask.bool()):
        r = row[m]
        if (r == old).any() and (r == new).any():
            firsts.add(int((row == new).nonzero()[0]))
    return len(firsts) <= 1


def _sane(out, vocab: int) -> bool:
    import torch

    m = out.response_mask.bool()
    lp = out.logprobs[m]
    ids = out.input_ids[m]
    return bool(torch.isfinite(lp).all() and (lp <= 1e-3).all() and (ids >= 0).all() and (ids < vocab).all())


def run(rounds: int, batch: int, tokens: int, kv: str, soak: int, stage_nice: int = 20,
        escalate_s: float = 10.0) -> dict:
    from rlsync.hub import HubClient, Location, start_embedded_hub
    from rlsync.rollout.vllm.engine import VllmEngine
    from rlsync.rollout.vllm.model_dir import prepare_smollm2
    from rlsync.rollout.vllm.rl_engine import HubFedVllmEngine
    from rlsync.sync.stage_priority import StagePriority

    model_dir = prepare_smollm2()
    load_before = _load()
    hub = start_embedded_hub()
    engine = VllmEngine(VllmEngine.Config(max_model_len=512, max_new_tokens=tokens, temperature=1.0))
    rl = HubFedVllmEngine(engine)
    client = HubClient(hub.address, token=hub.token)
    client.join(Location(host="h0"), name="vllm0")
    trainer = _Trainer(model_dir, hub)
    prio = StagePriority(stage_nice, escalate_s)  # the receiver's follower's (sync.stage_nice, stage_escalate_s)
    prio.start()
    try:
        rl.attach_hub(client, "policy")
        rl.start_inflight(kv)
        build = rl.stage.on_landed
        tok = engine.llm.get_tokenizer()
        vocab = engine.llm.llm_engine.model_config.get_vocab_size()
        qs = [list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                           tokenize=True, return_dict=True)["input_ids"]) for q in QUESTIONS]
        prompts = [qs[i % len(qs)] for i in range(batch)]
        rl.stage_version(trainer.next())
        rl.apply_staged()  # v1, switched in between calls (warms the build path)
        engine.generate(prompts)  # warm-up
        res = {"none": [0, 0.0], "inflight": [0, 0.0], "drain": [0, 0.0]}
        pauses: dict[str, list[float]] = {"inflight": [], "drain": []}
        lags: dict[str, list[float]] = {"inflight": [], "drain": []}  # publish returned -> the version switched in
        published = [0.0]
        checks = {"spans_ok": True, "switch_split_one_step": True, "sane": True, "switches_in_flight": 0}
        round_s = None

        def publish_later(delay: float, building: bool) -> threading.Thread:
            def go():
                time.sleep(delay)  # a point inside the round (the benchmark's schedule, not a synchronisation)
                rl.stage.on_landed = build if building else None
                v = trainer.publish()  # the trainer's side, at its own priority (another process in a run)
                published[0] = time.monotonic()
                prio.lower()  # the engine's staging, as the receiver's follower
                with prio.staging():
                    rl.stage_version(v)
            t = threading.Thread(target=go, daemon=True)
            t.start()
            return t

        for r in range(rounds):
            for way in ("none", "inflight", "drain"):
                old = engine.version
                if way != "none":
                    trainer.step()  # untimed: the round publishes it
                t = publish_later(0.2 * round_s, way == "inflight") if way != "none" and round_s else None
                if way != "none" and t is None:
                    t = publish_later(0.0, way == "inflight")
                t0 = time.monotonic()
                out = engine.generate(prompts)
                gen_s = time.monotonic() - t0
                if t is not None:
                    t.join()
                pause = 0.0
                if way == "drain":
                    got = rl.stage.apply_staged()  # stop, apply, resume: today's path
                    pause = got.pause_s if got is not None else 0.0
                    pauses["drain"].append(pause)
                    lags["drain"].append(time.monotonic() - published[0])
                elif way == "inflight":
                    sws = rl.take_switches()
                    if not sws:  # published after the last decode step: switched in between calls
                        got = rl.switch_prepared()
                        sws = [got] if got is not None else []
                        lags["inflight"] += [time.monotonic() - published[0]] * len(sws)
                    else:
                        checks["switches_in_flight"] += 1
                        at = {w.version: w.at for w in engine.switches}  # the engine's own record of each swap
                        lags["inflight"] += [at.get(s.version, time.monotonic()) - published[0] for s in sws]
                    pauses["inflight"] += [s.pause_s for s in sws]
                    checks["spans_ok"] &= _spans_ok(out, old, engine.version)
                    checks["switch_split_one_step"] &= _one_split(out, old, engine.version)
                checks["sane"] &= _sane(out, vocab)
                if way == "none":
                    round_s = gen_s
                res[way][0] += int(out.response_mask.sum())
                res[way][1] += gen_s + pause
            log.info("round %d/%d (load %s)", r + 1, rounds, _load())
        # greedy after an in-flight switch == after a drained apply of the same version (loaded anew from staging)
        trainer.step()
        t = publish_later(0.0, True)
        engine.generate(prompts)
        t.join()
        rl.switch_prepared()  # when the build finished after the call's last step
        rl.take_switches()
        engine.config.do_sample = False
        greedy_inflight = engine.generate(prompts[:8])
        v = engine.version
        names, specs, stream = rl.stage._staged_stream()
        engine.apply(stream, v, expect=names, specs=specs)
        greedy_drained = engine.generate(prompts[:8])
        checks["greedy_after_switch_equals_drained_load"] = greedy_inflight.response_ids == greedy_drained.response_ids
        # soak: many updates, each swapped in flight during a short generation
        engine.config.do_sample, engine.config.max_new_tokens = True, 8
        soak_t0 = time.monotonic()
        for _ in range(soak):
            trainer.step()
            t = publish_later(0.0, True)
            out = engine.generate(prompts)
            t.join()
            checks["sane"] &= _sane(out, vocab)
            rl.take_switches()
        checks["soak_updates"], checks["soak_s"] = soak, time.monotonic() - soak_t0
    finally:
        prio.close()
        rl.close()
        client.leave()
        trainer.client.leave()
        engine.shutdown()
        hub.stop()
    tps = {k: n / s if s else float("nan") for k, (n, s) in res.items()}
    return {"model": "SmolLM2-135M-Instruct (trainer fp32 538 MB, engine bf16)", "rounds": rounds, "batch": batch,
            "tokens": tokens, "kv_policy": kv, "stage_nice": stage_nice,
            "stage_escalate_s": escalate_s, "stage_escalations": prio.escalations, "stage_escalation_refused": prio.refused, "tokens_per_s": tps,
            "decode_pause_ms": {k: {"p50": 1e3 * _pct(v, 0.5), "p95": 1e3 * _pct(v, 0.95), "n": len(v)}
                                for k, v in pauses.items()},
            "switch_lag_s": {k: {"p50": _pct(v, 0.5), "p95": _pct(v, 0.95), "n": len(v)} for k, v in lags.items()},
            "decode_pause_p95_ms": 1e3 * _pct(pauses["inflight"], 0.95),
            "decode_pause_p50_ms": 1e3 * _pct(pauses["inflight"], 0.5),
            "tokens_per_s_ratio_updates_vs_none": tps["inflight"] / tps["none"],
            "tokens_per_s_ratio_vs_drain": tps["inflight"] / tps["drain"],
            "drain_tokens_per_s_ratio_vs_none": tps["drain"] / tps["none"],
            "checks": checks, "load_before": load_before, "load_after": _load(), "cpus": os.cpu_count()}


@register_scenario("inflight")
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsync.bench inflight", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5, help="rounds; each generates one batch per way")
    p.add_argument("--batch", type=int, default=16, help="prompts per batch")
    p.add_argument("--tokens", type=int, default=64, help="response tokens per prompt")
    p.add_argument("--kv", choices=("keep", "recompute"), default="keep", help="KV policy at an in-flight switch")
    p.add_argument("--soak", type=int, default=50, help="extra updates swapped in flight, checked for NaN/garbage")
    p.add_argument("--stage-nice", type=int, default=SyncConfig().stage_nice,
                   help="nice of the thread staging each version (sync.stage_nice; 20: SCHED_IDLE; 0: generation's)")
    p.add_argument("--stage-escalate-s", type=float, default=SyncConfig().stage_escalate_s,
                   help="an idle staging raised to nice 10 after this long (sync.stage_escalate_s; 0: never)")
    p.add_argument("--json", help="write every figure here")
    a = p.parse_args(argv)
    res = run(a.rounds, a.batch, a.tokens, a.kv, a.soak, a.stage_nice, a.stage_escalate_s)
    t, d = res["tokens_per_s"], res["decode_pause_ms"]
    print(f"inflight: SmolLM2-135M vLLM engine, {a.rounds} rounds x {a.batch} prompts x {a.tokens} tokens, "
          f"kv={a.kv}, stage nice {a.stage_nice} (escalated {res['stage_escalations']} times) (load {res['load_before']} -> {res['load_after']}, {res['cpus']} cpus)")
    for k in ("none", "inflight", "drain"):
        lag = res["switch_lag_s"].get(k)
        extra = (f"   pause p50 {d[k]['p50']:.1f} ms p95 {d[k]['p95']:.1f} ms (n={d[k]['n']}); publish -> switched in "
                 f"p50 {lag['p50']:.2f} s p95 {lag['p95']:.2f} s") if k in d else ""
        print(f"  {k:<9} {t[k]:8.1f} tok/s{extra}")
    print(f"  decode_pause_p95_ms {res['decode_pause_p95_ms']:.1f} (target <= 50); tokens_per_s_ratio_updates_vs_none "
          f"{res['tokens_per_s_ratio_updates_vs_none']:.3f} (>= 0.9); tokens_per_s_ratio_vs_drain "
          f"{res['tokens_per_s_ratio_vs_drain']:.3f} (> 1)")
    print(f"  checks: {res['checks']}")
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0
