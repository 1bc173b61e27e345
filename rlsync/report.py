"""`python -m rlsync.report RUN_DIR`: plots of a run's stall, reward and sync, on one HTML page.

The CLI only: the report itself is `rlsync.telemetry.report.build_report` (writes RUN_DIR/report/, see
its docstring). The CLI stays up here because its argument type is the hub's (`existing_dir`), and
telemetry imports nothing but core and itself.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from rlsync.hub.cli_args import existing_dir
from rlsync.telemetry.report import build_report


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlsync.report", description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=existing_dir, help="directory holding metrics.jsonl and/or trace.json")
    args = ap.parse_args(argv)
    try:
        index = build_report(args.run_dir)
    except FileNotFoundError as e:
        ap.error(f"argument run_dir: {e}")
    print(index)
    return 0


if __name__ == "__main__":
    sys.exit(main())
