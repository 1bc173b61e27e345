"""rlsync.rollout.vllm: the vLLM rollout engine and rlsync as a vLLM weight-transfer backend (docs/vllm.md).

Importing this package imports no vLLM; each module imports it where it runs.

    engine.py            VllmEngine: sampling + log-probs, in-place apply, in-flight `prepare` (the driver-side handle)
    decode.py            the decode loop step by step: a version switched in between two steps, per-token versions
    double_buffer.py     the next version's kernels built beside the live ones, swapped in by reference
    worker_apply.py      what runs inside vLLM's workers: the direct and layerwise reloads, cache resets
    direct.py            the direct apply (plan_direct, direct_load), called from worker_apply and tp
    tp.py                tensor parallel: each rank reads its own slices from the hub (worker extension)
    staging.py           the host staging's layout and checks (no I/O)
    stage.py             HubWeightStage: hub -> host staging -> engine, with prefetch
    rl_engine.py         the registered `vllm` rollout engine (HubFedVllmEngine) the rollout worker drives
    transfer_backend.py  vLLM's own weight-sync flow with backend="rlsync"
    model_dir.py         prepare_smollm2(): the model directory both sides load; prepare_variant(): its int8 checkpoint
"""
