"""`python -m rlsync.export RUN_DIR OUT [--step N] [--dtype bfloat16]`: a run's policy as a Hugging Face directory.

    python -m rlsync.export runs/r1 exported/r1                # the newest committed checkpoint
    python -m rlsync.export runs/r1 exported/r1 --step 40      # that step's checkpoint

OUT then loads with `transformers.AutoModelForCausalLM.from_pretrained(OUT)` and `vllm.LLM(model=OUT)`
(docs/export.md). A mistake (no such run, step or model form) exits 2 with one line naming it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from rlsync.core.errors import ConfigError
from rlsync.core.registry import UnknownNameError
from rlsync.export import DTYPES, ExportError, export_run


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlsync.export", description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", help="the run's directory (config.json and checkpoints/ in it)")
    ap.add_argument("out", help="directory to write the model to (created; files in it are replaced)")
    ap.add_argument("--step", type=int, default=None, help="the checkpoint's step (default: the newest)")
    ap.add_argument("--dtype", choices=list(DTYPES), default="float32", help="weights' dtype (default float32)")
    args = ap.parse_args(argv)
    try:
        out = export_run(args.run_dir, args.out, step=args.step, dtype=args.dtype)
    except (ExportError, ConfigError, UnknownNameError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
