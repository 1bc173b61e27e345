"""What a run you can read leaves (issue 36 item 5), checked on the CLI run of tests/rl/test_rl_e2e.py: a bounded
sample of completions per step (completions.jsonl), rollout workers' logs that say what they hold, fetch and
generate, and the run's config beside them (what `python -m rlsync.export` reads)."""
import json
import re
from pathlib import Path

from rlsync.rollout import build_task
from rlsync.telemetry.loggers import RUN_CONFIG_FILE, read_jsonl


def check_completions_and_worker_logs(run: Path, steps=(1, 2, 3), per_step: int = 3) -> None:
    """`run` was made by `+recipe=tests/tiny_e2e logging.completions_per_step=<per_step>` (task reverse, 2 workers)."""
    rows = read_jsonl(run / "completions.jsonl")
    by_step = {s: [r for r in rows if r["step"] == s] for s in steps}
    assert all(1 <= len(v) <= per_step for v in by_step.values()), {s: len(v) for s, v in by_step.items()}
    task = build_task("reverse")  # the run's task: the reward of each text is the task's score of it
    checked = 0
    for r in rows:
        assert set(r) >= {"prompt", "response", "reward", "version", "worker", "version_spans"}
        assert r["worker"] in ("main-0", "main-1") and 0 <= r["version"] <= r["step"]
        assert r["version_spans"] is None
        p = task.prompt_at(r["prompt_index"])
        assert r["prompt"] == p.text and re.fullmatch(f"[{task.config.symbols}]*", r["response"])
        ids = task.tokenizer.encode(r["response"])
        ids += [task.tokenizer.eos_token_id] * r["finished"]  # it ended with <eos> (decode drops it)
        if len(ids) == r["response_tokens"]:  # no special token sampled mid-answer (decode drops those)
            checked += 1
            assert r["reward"] == task.score(p, ids)
    assert checked >= len(rows) // 2

    assert json.loads((run / RUN_CONFIG_FILE).read_text())["logging"]["completions_per_step"] == per_step

    for w in ("main-0", "main-1"):
        text = (run / "logs" / f"{w}.log").read_text()
        assert f"{w} ready: engine hf" in text
        assert re.search(r"fetched v\d+ \(full(, join)?\): [\d.]+ MB in [\d.]+ s from \S+", text), text[-2000:]
        assert re.search(r"rollout: \d+ prompts x 4 = \d+ samples, \d+ response tokens, v\d+, [\d.]+ s", text)
        assert "Traceback" not in text
        assert len(text.splitlines()) < 200  # a line per fetch and per call, not per token or unit
