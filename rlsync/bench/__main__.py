"""`python -m rlsync.bench SCENARIO [ARGS]`: run one registered benchmark scenario."""
from __future__ import annotations

import importlib
import logging
import pkgutil
import sys

import rlsync.bench as bench
from rlsync.hub.logs import setup_logging


def main(argv: list[str]) -> int:
    setup_logging()
    for mod in pkgutil.iter_modules(bench.__path__):
        if not mod.name.startswith("_"):
            try:
                importlib.import_module(f"{bench.__name__}.{mod.name}")
            except Exception as e:  # noqa: BLE001 - one broken scenario must not hide the others
                logging.getLogger(__name__).warning("bench scenario module %r did not import: %s", mod.name, e)
    names = bench.SCENARIOS.names()
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in bench.SCENARIOS:
        print(f"usage: python -m rlsync.bench {{{','.join(names)}}} [--help | ARGS]", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return bench.SCENARIOS.get(argv[0])(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
