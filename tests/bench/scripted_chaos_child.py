"""A stand-in for `rlsync.bench._chaos_vllm_child` that speaks its line protocol without vLLM (milliseconds).

    python tests/bench/scripted_chaos_child.py FIRST_VERSION [--spare]

Each process starts, then loops fetch -> apply -> applied -> generate -> sample on versions FIRST_VERSION, +1, ...;
its first sample comes *before* its "applied" line (a sample of unverified weights, which the bench must drop).
"""
import json
import sys
import time


def say(**kw):
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()


if "--spare" in sys.argv:
    say(ready=True)
    sys.stdin.readline()
say(started=True, parts={"join": 0.01})
v = int(sys.argv[1])
say(sample=v, n=2)  # unverified: no "applied" for it yet
while True:
    say(phase="fetch", version=v)
    time.sleep(0.02)
    say(phase="apply", version=v)
    say(applied=v)
    say(phase="generate", version=v)
    say(sample=v, n=2)
    time.sleep(0.05)
    v += 1
