"""Issue 20 item 3: vLLM CPU at tensor_parallel_size=2 (two worker processes, gloo); each TP rank reads only
the units holding its row/column blocks of a ZeRO-3-sharded version and applies them in place
(examples/vllm_tp_slices.py, run as a user would; ~40-60 s, most of it vLLM's start)."""
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
    assert res["exact"] and [r["rank"] for r in res["ranks"]] == [0, 1], res
    for r in res["ranks"]:
        served = {w: n for w, n in r["bytes_by_source"].items() if n > 0}
        assert set(served) == {"trainer-rank0", "trainer-rank1"}, r
        # only the units holding its blocks: more than its slices (column blocks touch every unit of
        # o_proj / down_proj), less than the model
        assert r["slice_bytes"] <= sum(served.values()) < 0.8 * res["model_bytes"], r
    # vLLM's log-probs follow the new weights (bf16 engine vs the trainer's fp32 recomputation)
    assert res["gap_after"] < 0.1 and res["gap_before"] > 10 * res["gap_after"], res
