"""vLLM loads what `python -m rlsync.export` writes and greedy-decodes the same tokens as transformers.

The run dir is built in the documented layout (config.json + a committed checkpoint with model.pt, as the torch
backend writes it) so this file needs no Ray run; tests/rl/test_export.py exports a real run's checkpoint.
"""
import json
import os

import pytest
import torch

from rlsync.config.schema import TrainConfig, as_dict
from rlsync.driver.checkpoint import CheckpointStore
from rlsync.export.__main__ import main as export_main
from rlsync.telemetry.loggers import RUN_CONFIG_FILE
from rlsync.workers.policy import build_policy


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny tied Llama with weights moved off the init (a "trained" checkpoint at step 5), exported in fp32."""
    root = tmp_path_factory.mktemp("vllm_export")
    cfg = TrainConfig(run_dir=str(root / "run"))
    cfg.model.tiny.num_heads = 1  # head_dim 64: vLLM's CPU attention refuses the default shape's 16
    cfg.model.tiny.tie_word_embeddings = True  # as SmolLM2: vLLM reads the head from the embedding
    model, task = build_policy(cfg.model, cfg.task, cfg.seed)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    run = root / "run"
    run.mkdir()
    (run / RUN_CONFIG_FILE).write_text(json.dumps(as_dict(cfg), default=str))
    store = CheckpointStore(run / "checkpoints")
    store.path_for(5).mkdir(parents=True)
    torch.save({"model": model.state_dict(), "version": 5}, store.path_for(5) / "model.pt")
    store.commit(5, {"step": 5, "version": 5})
    assert export_main([str(run), str(root / "hf")]) == 0
    return root / "hf", task


def test_vllm_greedy_tokens_equal_transformers(exported):
    import transformers
    from vllm import LLM, SamplingParams

    out, task = exported
    prompts = [task.prompt_at(i).prompt_ids for i in range(6)]
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        want = hf.generate(torch.tensor(prompts), max_new_tokens=4, do_sample=False)[:, len(prompts[0]):].tolist()

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    llm = LLM(model=str(out), dtype="float32", enforce_eager=True, max_model_len=64, seed=0)
    try:
        got = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=4))
        # vLLM stops at <eos> (it keeps the token), transformers pads after it: compare up to the first <eos>
        eos = task.tokenizer.eos_token_id
        cut = [w[:w.index(eos) + 1] if eos in w else w for w in want]
        assert [list(o.outputs[0].token_ids) for o in got] == cut
        assert llm.get_tokenizer().decode(got[0].outputs[0].token_ids, skip_special_tokens=True) == \
            task.tokenizer.decode(list(got[0].outputs[0].token_ids))
    finally:
        llm.llm_engine.engine_core.shutdown()
