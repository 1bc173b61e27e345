"""`require(pkg)`: skip the calling module when an optional package is not installed, without importing it.

`pytest.importorskip` imports the package, and every pytest-xdist worker collects every file: `import vllm` cost
5.5 s and `import peft` 2 s of each worker's collection, for tests most workers never run."""
import importlib.util

import pytest

VLLM_REASON = "vLLM is installed by scripts/run (RLSYNC_VLLM=none skips it)"


def require(pkg: str, reason: str | None = None) -> None:
    if importlib.util.find_spec(pkg) is None:
        pytest.skip(reason or f"{pkg} is not installed", allow_module_level=True)
