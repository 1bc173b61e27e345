"""Shared pieces of the vLLM tests: one hub, one trainer-side HF model, one vLLM engine per module.

vLLM takes ~12 s to start on an idle 2-core machine (much more under load), so every test of a
module shares one engine; tests leave it holding a complete version.
"""
import pytest

pytest.importorskip("vllm", reason="vLLM is installed by scripts/run (RLSYNC_VLLM=none skips it)")


def bf16_exact(t):
    """`t` rounded to bf16 and back: weights the trainer (fp32) and vLLM (bf16) hold identically."""
    import torch

    return t.to(torch.bfloat16).to(t.dtype)


def new_version(params, base, seed: int, scale: float = 0.002):
    """Write a version into `params` (bf16-exact): every tensor base * (1 + scale * noise), and the
    final norm scaled by a factor that depends on the seed, so consecutive versions predict clearly
    different distributions while the model stays sane (its bf16 rounding error stays small)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in params.items():
            w = base[name] * (1 + scale * torch.randn(p.shape, generator=g))
            if name == "model.norm.weight":
                w = w * (0.6 + 0.1 * (seed % 8))
            p.copy_(bf16_exact(w))


def logprob_gap(model, rollout):
    """Mean |trainer log-prob - vLLM log-prob| over response tokens (the trainer recomputes in fp32)."""
    import torch

    from rlsync.core.logprobs import token_logprobs

    with torch.no_grad():
        lp, _ = token_logprobs(model, rollout.input_ids, rollout.attention_mask)
    m = rollout.response_mask.bool()
    return (lp - rollout.logprobs)[m].abs().mean().item()


@pytest.fixture(scope="module")
def rig():
    """hub, trainer client + HF fp32 model (params published as 'policy'), vLLM engine + its stage."""
    import torch
    import transformers

    from rlsync.hub import HubClient, Location, start_embedded_hub
    from rlsync.rollout.model_dir import prepare_smollm2
    from rlsync.rollout.vllm_engine import VllmEngine
    from rlsync.rollout.vllm_sync import HubWeightStage

    path = prepare_smollm2()
    hub = start_embedded_hub()
    trainer = HubClient(hub.address, token=hub.token)
    trainer.join(Location(host="h0"), name="trainer")
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    params = {n: p.data for n, p in model.named_parameters()}
    base = {n: t.clone() for n, t in params.items()}
    engine = VllmEngine(VllmEngine.Config(max_new_tokens=12, max_model_len=256))
    client = HubClient(hub.address, token=hub.token)
    client.join(Location(host="h0"), name="vllm0")
    stage = HubWeightStage(client, engine)
    qs = ["What is 3 + 4? Reply with just the number.", "Name a color.", "Write a haiku about rain."]
    prompts = [list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"]) for q in qs]

    class Rig:
        pass

    r = Rig()
    r.hub, r.trainer, r.model, r.params, r.base, r.engine, r.client, r.stage, r.prompts = (
        hub, trainer, model, params, base, engine, client, stage, prompts)
    r.version = 0

    def publish(seed: int) -> int:
        """Trainer steps: release its last version, write a new one, publish it."""
        if r.version:
            trainer.release("policy", r.version)
        r.version += 1
        new_version(params, base, seed)
        trainer.publish("policy", r.version, params)
        return r.version

    r.publish = publish
    yield r
    engine.shutdown()
    client.leave()
    trainer.leave()
    hub.stop()
