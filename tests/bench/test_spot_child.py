"""The spot_start joiner's split of vLLM's engine start (rlsync/bench/_spot_child.py): vLLM's own records reach
it even after vLLM applies its logging configuration, as `LLM()` does. No engine: a process of its own, since
vLLM's logging set-up (and its cache of environment variables) is per process."""
import json
import os
import subprocess
import sys

import pytest

from needs import VLLM_REASON, require  # tests/needs.py

require("vllm", VLLM_REASON)

_PROBE = """
import json
from rlsync.bench._spot_child import _VllmTimings, own_vllm_logging
timings = _VllmTimings()
own_vllm_logging(timings)
import vllm
from vllm.config.logging import LoggingConfig
from vllm.logger import configure_logging_if_needed, init_logger
configure_logging_if_needed(LoggingConfig())  # what LLM() does before the engine starts
init_logger("vllm.v1.engine.core").info("init engine (profile, create kv cache, warmup model) took 0.38 seconds")
print(json.dumps(timings.parts))
"""


@pytest.mark.skipif(not os.environ.get("RLSYNC_SLOW_TESTS"), reason="a process importing vLLM (~13 s) for a bench's "
                    "instrumentation does not fit the suite's 15-minute budget; run it with RLSYNC_SLOW_TESTS=1 "
                    "(`bench spot_start` shows the same at every run: its `engine_parts` come out empty if this breaks)")
def test_vllm_records_reach_the_joiners_timings_after_vllm_configures_its_logging():
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"init_engine_s": 0.38}
