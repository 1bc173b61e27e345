"""`python -m rlsync.bench SCENARIO [ARGS]`: run one registered benchmark scenario."""
from __future__ import annotations

import argparse
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
    p = argparse.ArgumentParser(prog="python -m rlsync.bench", description=bench.__doc__.splitlines()[0],
                                usage="python -m rlsync.bench SCENARIO [--help | ARGS]",
                                epilog="ARGS are the scenario's own: `python -m rlsync.bench SCENARIO --help` lists them.")
    p.add_argument("scenario", choices=bench.SCENARIOS.names(), help="the benchmark to run")
    a = p.parse_args(argv[:1])  # the scenario's own parser reads the rest (its --help included)
    return bench.SCENARIOS.get(a.scenario)(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
