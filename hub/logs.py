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


def quiet_console(prefixes: tuple[str, ...], log_file: str | os.PathLike | None = None) -> None:
    """Keep INFO lines of the loggers under `prefixes` off the console (warnings still show); with
    `log_file`, every line of this process also goes there. For a person watching a long run: the
    per-version chatter belongs in the run's log, not between the progress lines."""

    def keep(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not record.name.startswith(prefixes)

    root = logging.getLogger()
    for h in root.handlers:
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
            h.addFilter(keep)
    if log_file is not None:
        from rlsync.hub.private_files import create_private, make_private_dirs
        make_private_dirs(os.path.dirname(os.path.abspath(log_file)))  # 0700 / 0600 whatever the umask:
        create_private(log_file)  # a run's log names its hub and workers; it is this user's to read
        fh = logging.FileHandler(log_file)
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s"))
        root.addHandler(fh)
