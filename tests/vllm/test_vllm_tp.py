"""Issue 20 item 3: `VllmEngine(tensor_parallel_size=2)` (two vLLM worker processes, gloo); each TP rank
reads only the units holding its row/column blocks of a ZeRO-3-sharded version, then its slices of a
whole-tensor version, and applies them in place; a failed read leaves the engine on its version
(examples/vllm_tp_slices.py, run as a user would; ~35-60 s, most of it vLLM's start)."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(900)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tp2_ranks_read_their_slices_bit_exact_and_vllm_follows(tmp_path):
    out = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "vllm_tp_slices.py"), "--json", str(out),
                           "--dir", str(tmp_path / "tiny-llama")], cwd=ROOT, capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(out.read_text())
    # every rank's slices and vLLM's fused qkv / gate_up buffers equal the trainer's blocks, bit for bit
    assert res["exact"], res
    sharded, whole = res["versions"]
    assert [r["rank"] for r in sharded["ranks"]] == [0, 1] and sharded["engine_version"] == 1, res
    for r in sharded["ranks"]:
        served = {w: n for w, n in r["bytes_by_source"].items() if n > 0}
        assert set(served) == {"trainer-rank0", "trainer-rank1"}, r
        # only the units holding its blocks: more than its slices (column blocks touch every unit of
        # o_proj / down_proj), less than the model
        assert r["slice_bytes"] <= sum(served.values()) < 0.8 * res["model_bytes"], r
    # a whole-tensor version: each rank reads the whole tensors (partial reads address sharded layouts
    # only) and keeps half of them (norms whole)
    assert whole["engine_version"] == 2, res
    for r in whole["ranks"]:
        assert res["model_bytes"] // 2 <= r["slice_bytes"] < 0.6 * res["model_bytes"] and sum(r["bytes_by_source"].values()) == res["model_bytes"], r
    # vLLM's log-probs follow each new version (bf16 engine vs the trainer's fp32 recomputation)
    for v in (sharded, whole):
        assert v["gap_after"] < 0.1 and res["gap_before"] > 10 * v["gap_after"], res
    # a read that fails (a version the hub never had) moves nothing: the engine keeps v2 and generates with it
    assert res["failed_read"] == "TPLoadError" and res["version_after_failed_read"] == 2, res
    assert res["gap_after_failed_read"] < 0.1, res


def test_tp_engine_refuses_what_it_cannot_split_before_vllm_starts(tmp_path):
    from rlsync.rollout.vllm.model_dir import prepare_smollm2
    from rlsync.rollout.vllm.engine import TensorParallelError, VllmEngine

    smollm2 = prepare_smollm2()  # 9 heads, 3 KV heads
    with pytest.raises(TensorParallelError, match="num_attention_heads=9 is not divisible by tensor_parallel_size=2"):
        VllmEngine(VllmEngine.Config(model_dir=smollm2, tensor_parallel_size=2))
    with pytest.raises(TensorParallelError, match="apply_mode='layerwise'"):
        VllmEngine(VllmEngine.Config(model_dir=smollm2, tensor_parallel_size=3, apply_mode="layerwise"))
    with pytest.raises(TensorParallelError, match=">= 1"):
        VllmEngine(VllmEngine.Config(model_dir=smollm2, tensor_parallel_size=0))
