"""An engine that takes the int8 variant in place starts from that variant's checkpoint (rollout/vllm/model_dir.py),
made once per input by the registered transform, and a stage refuses a variant of another layout than the one
its engine started in (rollout/vllm/staging.py). No vLLM here: the engine-level apply is `bench derived
--probe-int8` (docs/derived.md)."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlsync.core.transforms import get_transform, specs_of
from rlsync.rollout.vllm.model_dir import INT8_QUANT_CONFIG, checkpoint_variant, prepare_variant
from rlsync.rollout.vllm.staging import VariantLayoutError, check_variant_layout


def _model_dir(path, seed: int) -> str:
    g = torch.Generator().manual_seed(seed)
    os.makedirs(path)
    w = {"model.layers.0.self_attn.q_proj.weight": torch.randn((8, 4), generator=g).to(torch.bfloat16),
         "model.layers.0.mlp.down_proj.weight": torch.randn((4, 6), generator=g).to(torch.bfloat16),
         "model.norm.weight": torch.randn((4,), generator=g).to(torch.bfloat16)}
    save_file(w, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "hidden_size": 4}, f)
    with open(os.path.join(path, "tokenizer.json"), "w") as f:
        f.write("{}")
    return str(path)


def test_int8_checkpoint_is_the_transforms_bytes_made_once_per_input(tmp_path):
    src = _model_dir(tmp_path / "m", seed=0)
    out = prepare_variant(src, "int8", cache_root=str(tmp_path / "cache"))
    assert checkpoint_variant(out) == "int8" and checkpoint_variant(src) is None
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["quantization_config"] == INT8_QUANT_CONFIG
    assert os.path.exists(os.path.join(out, "tokenizer.json"))
    fp32 = {n: t.float() for n, t in load_file(os.path.join(src, "model.safetensors")).items()}
    t = get_transform("int8")
    want = t.allocate(t.specs(specs_of(fp32)))
    t.apply(fp32, want)  # what the hub serves as policy@int8 of the version the directory holds
    got = load_file(os.path.join(out, "model.safetensors"))
    assert set(got) == set(want) and all(torch.equal(got[n], want[n]) and got[n].dtype == want[n].dtype for n in want)
    stamp = os.stat(os.path.join(out, "model.safetensors")).st_mtime_ns
    assert prepare_variant(src, "int8", cache_root=str(tmp_path / "cache")) == out  # cached: not made again
    assert os.stat(os.path.join(out, "model.safetensors")).st_mtime_ns == stamp
    other = prepare_variant(_model_dir(tmp_path / "m2", seed=1), "int8", cache_root=str(tmp_path / "cache"))
    assert other != out  # keyed by the input's bytes, not its name alone
    with pytest.raises(ValueError, match="no checkpoint form"):
        prepare_variant(src, "bf16", cache_root=str(tmp_path / "cache"))


def test_a_stage_takes_only_the_layout_its_engine_started_in():
    for variant, started in ((None, None), ("bf16", None), ("int8", "int8")):
        check_variant_layout(variant, started)
    with pytest.raises(VariantLayoutError, match="needs an engine started from its checkpoint"):
        check_variant_layout("int8", None)  # vLLM's reload would take int8 bytes under bf16 names
    for variant in (None, "bf16"):
        with pytest.raises(VariantLayoutError, match="takes only the 'int8' variant"):
            check_variant_layout(variant, "int8")
