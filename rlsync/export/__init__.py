"""Export a run's trained policy as a Hugging Face model directory (`python -m rlsync.export RUN_DIR OUT`).

    out = export_run("runs/r1", "exported/r1")               # the newest committed checkpoint
    out = export_run("runs/r1", "exported/r1", step=40, dtype="bfloat16")
    AutoModelForCausalLM.from_pretrained(out); vllm.LLM(model=str(out))

What it reads: `RUN_DIR/config.json` (the run's resolved config, written by the run's logger) to rebuild
the model and tokenizer exactly as the run's workers built them (`build_policy`: model kind, tiny shape,
task, plugins), and a committed checkpoint under `RUN_DIR/checkpoints/` (rlsync/driver/checkpoint.py):
`model.pt`'s `model` entry (torch backend) or the `policy` tag of a DeepSpeed checkpoint, gathered to
fp32. What it writes into OUT: `config.json`, `generation_config.json`, `model.safetensors` (tied tensors
once) and the tokenizer's files. A task's own symbol tokenizer (`CharTokenizer`) is written as an
equivalent fast tokenizer (one token per symbol, the same ids), so `AutoTokenizer` loads it too.

A model with no Hugging Face form (a model kind whose loader builds a plain `nn.Module`) is refused with
one line naming it. Simplifies: the policy only (a PPO critic is not exported); one safetensors file.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from rlsync.driver.checkpoint import CheckpointStore, load_driver_state
from rlsync.telemetry.loggers import RUN_CONFIG_FILE

__all__ = ["ExportError", "export_run", "DTYPES"]

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""`--dtype` choices: the weights are cast to it on the way out (the trainer's are fp32)."""


class ExportError(Exception):
    """The run cannot be exported as asked; the message names what to change (one line)."""


def export_run(run_dir: str | os.PathLike, out: str | os.PathLike, *, step: int | None = None,
               dtype: str = "float32") -> Path:
    """Write the policy of `run_dir`'s checkpoint at `step` (None: the newest) as a HF directory `out`."""
    run_dir, out = Path(run_dir), Path(out)
    if dtype not in DTYPES:
        raise ExportError(f"dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    cfg = _run_config(run_dir)
    ckpt, ckpt_step = _checkpoint(run_dir, step)
    weights = _policy_weights(ckpt)

    from rlsync.workers.policy import build_policy

    model, task = build_policy(cfg.model, cfg.task, cfg.seed)
    _check_hf(model, cfg.model.kind)
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as e:
        first = str(e).splitlines()[1].strip() if len(str(e).splitlines()) > 1 else str(e)
        raise ExportError(f"{ckpt}: its weights do not fit model.kind={cfg.model.kind} as {run_dir / RUN_CONFIG_FILE} "
                          f"builds it ({first})") from None
    _save_model(model.to(DTYPES[dtype]), out)
    _save_tokenizer(task.tokenizer, out)
    log.info("exported %s step %d (%s) to %s", run_dir, ckpt_step, dtype, out)
    return out


def _run_config(run_dir: Path) -> Any:
    from omegaconf import OmegaConf

    from rlsync.config.compose import to_config

    path = run_dir / RUN_CONFIG_FILE
    if not path.is_file():
        raise ExportError(f"{path} not found: RUN_DIR must be a run's directory (runs write {RUN_CONFIG_FILE} "
                          "beside metrics.jsonl since issue 36)")
    return to_config(OmegaConf.create(json.loads(path.read_text())))


def _checkpoint(run_dir: Path, step: int | None) -> tuple[Path, int]:
    store = CheckpointStore(run_dir / "checkpoints")
    done = {int(load_driver_state(p)["step"]): p for p in store.committed()}
    if not done:
        raise ExportError(f"{run_dir / 'checkpoints'}: no committed checkpoint (a run writes one at its end and every "
                          "checkpoint.every steps unless checkpoint.enabled=false)")
    if step is None:
        step = max(done)
    if step not in done:
        raise ExportError(f"--step {step}: no committed checkpoint of that step; there are: "
                          f"{', '.join(map(str, sorted(done)))}")
    return done[step], step


def _policy_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    """The policy's fp32 state dict from a torch-backend (`model.pt`) or DeepSpeed (`policy` tag) checkpoint."""
    if (ckpt / "model.pt").is_file():
        return torch.load(ckpt / "model.pt", weights_only=True)["model"]
    if (ckpt / "trainer.pt").is_file():  # one file (weights + optimizer), before the split
        return torch.load(ckpt / "trainer.pt", weights_only=True)["model"]
    if (ckpt / "policy").is_dir():
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        return get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag="policy")
    raise ExportError(f"{ckpt}: neither model.pt (torch backend) nor policy/ (DeepSpeed backend) in it")


def _check_hf(model: torch.nn.Module, kind: str) -> None:
    import transformers

    if not isinstance(model, transformers.PreTrainedModel):
        raise ExportError(f"model.kind={kind} builds a {type(model).__name__}, which has no Hugging Face form: "
                          "only transformers models (PreTrainedModel) can be exported")


def _save_model(model: Any, out: Path) -> None:
    # Not save_pretrained: a model loaded from GGUF (SmolLM2 without a cache dir) carries a quantization note that
    # makes transformers refuse to save it, though its tensors are plain by now; vLLM refuses the note too.
    from safetensors.torch import save_file

    # A tied tensor is stored once, under its first name (the input embedding, before `lm_head`): vLLM skips
    # `lm_head.weight` of a tied model and would leave the embedding unloaded if only the head were stored.
    state: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, t in model.state_dict().items():
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            state[name] = t.detach().contiguous()
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    cfg.dtype = next(model.parameters()).dtype
    cfg.architectures = [type(model).__name__]
    cfg.save_pretrained(out)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})


def _save_tokenizer(tok: Any, out: Path) -> None:
    from rlsync.rollout.tokenizer import CharTokenizer

    if isinstance(tok, CharTokenizer):
        tok = char_tokenizer_as_hf(tok)
    if not hasattr(tok, "save_pretrained"):
        raise ExportError(f"the task's tokenizer ({type(tok).__name__}) cannot be saved as Hugging Face files")
    tok.save_pretrained(out)


def char_tokenizer_as_hf(tok: Any) -> Any:
    """A `PreTrainedTokenizerFast` with `tok`'s ids: specials first, then one token per symbol; decode joins
    symbols without spaces. `encode("<bos>abc<sep>")` gives the ids the task's prompts have."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from rlsync.rollout.tokenizer import SPECIALS

    vocab = {s: i for i, s in enumerate(SPECIALS)}
    vocab.update({ch: len(SPECIALS) + i for i, ch in enumerate(tok.symbols)})
    t = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))  # not in vocab: an unknown symbol is an error
    t.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    t.decoder = decoders.Fuse()
    hf = PreTrainedTokenizerFast(tokenizer_object=t, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                 sep_token="<sep>", additional_special_tokens=[])
    return hf
