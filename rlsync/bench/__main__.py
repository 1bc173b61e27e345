"""`python -m rlsync.bench SCENARIO [ARGS]`: run one registered benchmark scenario."""
from __future__ import annotations

import importlib
import pkgutil
import sys

import rlsync.bench as bench
from rlsync.logs import setup_logging


def main(argv: list[str]) -> int:
    for mod in pkgutil.iter_modules(bench.__path__):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{bench.__name__}.{mod.name}")
    names = sorted(bench.SCENARIOS)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in bench.SCENARIOS:
        print(f"usage: python -m rlsync.bench {{{','.join(names)}}} [--help | ARGS]", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    setup_logging()
    return bench.SCENARIOS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
