"""Measure SmolLM2-135M-Instruct's starting reward on candidate arithmetic prompts with vLLM (CPU).

    python scripts/measure_task_start.py [MODEL_DIR] [--n 64] [--samples 4]

Prints, per candidate prompt form, the share of sampled (temperature 1) and greedy responses that are
correct (first integer == answer), number-first, exactly the number, and the mean of the candidate rewards.
Used to pick the grpo_real task (docs/real_model.md).
"""
import json
import os
import random
import re
import sys
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

model_dir = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else os.path.expanduser(
    "~/.cache/rlsync/models/smollm2-135m-instruct-bf16-0.1.2")
n = 64
samples = 4
if "--n" in sys.argv:
    n = int(sys.argv[sys.argv.index("--n") + 1])
if "--samples" in sys.argv:
    samples = int(sys.argv[sys.argv.index("--samples") + 1])

from transformers import AutoTokenizer  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402

tok = AutoTokenizer.from_pretrained(model_dir)
FORMS = {
    "reply_number": "What is {a} + {b}? Reply with just the number.",
    "answer_number": "What is {a} + {b}? Answer with just the number.",
    "sum_digits": "Add {a} and {b}. Reply with only the result, as digits.",
    "equation": "Compute {a} + {b}. Write only the answer.",
}
_INT = re.compile(r"-?\d+")


def grade(text, ans):
    t = text.strip()
    m = _INT.search(t)
    first_num = m is not None and m.start() == 0
    correct_first = m is not None and int(m.group()) == ans
    exact = re.fullmatch(r"-?\d+\.?", t) is not None
    contains = str(ans) in _INT.findall(t)
    return dict(correct_first=correct_first, number_first=first_num, exact=exact, contains=contains,
                exact_correct=exact and correct_first)


llm = LLM(model=model_dir, dtype="bfloat16", enforce_eager=True, max_model_len=512, seed=0)
rng = random.Random(1234)
pairs = [(rng.randint(0, 9), rng.randint(0, 9)) for _ in range(n)]
out = {}
for name, form in FORMS.items():
    prompts = [tok.apply_chat_template([{"role": "user", "content": form.format(a=a, b=b)}], tokenize=False,
                                       add_generation_prompt=True) for a, b in pairs]
    res = {}
    for mode, sp in (("sampled", SamplingParams(temperature=1.0, max_tokens=12, n=samples)),
                     ("greedy", SamplingParams(temperature=0.0, max_tokens=12))):
        t0 = time.time()
        gens = llm.generate(prompts, sp, use_tqdm=False)
        grades = [grade(o.text, a + b) for g, (a, b) in zip(gens, pairs) for o in g.outputs]
        res[mode] = {k: round(sum(g[k] for g in grades) / len(grades), 3) for k in grades[0]}
        res[mode]["seconds"] = round(time.time() - t0, 1)
        res[mode]["examples"] = [o.text for g in gens[:4] for o in g.outputs[:1]]
    out[name] = res
    print(json.dumps({name: res}), flush=True)
print("LOAD", os.getloadavg())
