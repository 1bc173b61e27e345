"""Shared pieces of the vLLM tests: one hub, one trainer-side HF model, one vLLM engine per module.

vLLM takes ~12 s to start on an idle 2-core machine (much more under load), so every test of a
module shares one engine; tests leave it holding a complete version.
"""
import pytest

from needs import VLLM_REASON, require  # tests/needs.py

require("vllm", VLLM_REASON)


@pytest.fixture(scope="module")
def rig():
    """hub, trainer client + HF fp32 model (params published as 'policy'), vLLM engine + its stage."""
    import torch
    import transformers

    from rlsync.hub import HubClient, Location, start_embedded_hub
    from rlsync.rollout.vllm.model_dir import prepare_smollm2
    from rlsync.rollout.vllm.engine import VllmEngine
    from rlsync.rollout.vllm.stage import HubWeightStage
    from vllm_helpers import new_version

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
