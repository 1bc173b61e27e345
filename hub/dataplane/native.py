"""Which build of the native engine (`rlsync._engine`, csrc/) this process runs, and whether it is stale.

A checkout builds the engine once (`pip install -e .`); editing csrc/ afterwards does not rebuild it.
A stale build runs silently with what it had: e.g. one built before `read_process` made `shm` copy
with ctypes and hash in Python on one stream, ~3.3 GB/s whatever the stream count, while a fresh
build moves 7.5-8.3 GB/s on this machine (docs/performance.md, issue 20). So the build records a
digest of its sources (setup.py), this module compares it with the checkout's csrc/, the data-path
calibration is cached per build (`identity`), and a stale build is logged once with the command
that rebuilds it.
"""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path

log = logging.getLogger(__name__)

SOURCES = ("csrc/engine.cpp", "csrc/xxh3_dispatch.cpp")
"""Hashed in this order, as setup.py does."""
REBUILD = "scripts/run pip install -e . --no-deps -q"

try:
    from rlsync import _engine
except ImportError:
    _engine = None
_warned = False


def source_digest(root: Path | None = None) -> str | None:
    """Digest of the checkout's engine sources; None where they are absent (an installed package)."""
    root = root or Path(__file__).resolve().parent.parent
    try:
        return hashlib.sha256(b"".join((root / f).read_bytes() for f in SOURCES)).hexdigest()[:16]
    except OSError:
        return None


def built_digest() -> str | None:
    """Digest the loaded engine was built from: None if no engine, "unrecorded" for a build older
    than the digest (itself stale)."""
    if _engine is None:
        return None
    return getattr(_engine, "SOURCES", "unrecorded")


def identity() -> str:
    """Names the engine build in cache keys: 'none', or its source digest ('unrecorded' if older)."""
    return built_digest() or "none"


def stale_reason() -> str:
    """Why the loaded engine does not match the checkout's csrc/ ('' if it does, or cannot be told)."""
    built, src = built_digest(), source_digest()
    if built is None or src is None or built == src:
        return ""
    return (f"rlsync._engine was built from other sources ({built}) than this checkout's csrc/ ({src}): "
            f"it runs the old native code (e.g. shm without read_process: one stream, Python hash); "
            f"rebuild with `{REBUILD}`")


def warn_if_stale() -> str:
    """Log `stale_reason` once per process; return it."""
    global _warned
    why = stale_reason()
    if why and not _warned:
        _warned = True
        log.warning("%s", why)
    return why
