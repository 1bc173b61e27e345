"""Logging set-up, done once per process by the entry points (CLI mains, worker actors).

Library modules only call `logging.getLogger(__name__)`; nothing else configures handlers.
Level from $RLSYNC_LOG (default INFO).
"""
from __future__ import annotations

import logging
import os

_done = False


def setup_logging(level: str | int | None = None) -> None:
    global _done
    if _done:
        return
    _done = True
    level = level or os.environ.get("RLSYNC_LOG", "INFO")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s",
                        datefmt="%H:%M:%S")
