"""Files and directories only this user can read: 0600 files, 0700 directories, whatever the umask.

Every file the hub, its clients and the data-path calibration create goes through here (the token,
the journal and its side files, the calibration cache and lock, the gateway's stats, log files).
The mode is given at creation (`os.open(..., 0o600)`, `os.mkdir(..., 0o700)`): a umask can only
take bits away, so under umask 000 the file is 0600 too, and it is never readable by others, not
even for an instant. Files and directories that already exist and are not ours to decide (a user's
~/.cache) are left as they are; only what we create, and our own files left looser, are made private.
"""
from __future__ import annotations

import os

FILE_MODE, DIR_MODE = 0o600, 0o700


def make_private_dirs(path: str | os.PathLike) -> None:
    """`mkdir -p path`, each directory it creates 0700 (`Path.mkdir(parents=True)` makes parents 0777 & ~umask)."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        return
    make_private_dirs(os.path.dirname(path))
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        if not os.path.isdir(path):
            raise


def create_private(path: str | os.PathLike) -> None:
    """Create `path` 0600 if absent (never following a symlink); make an existing one 0600."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
    try:
        if os.fstat(fd).st_mode & 0o777 != FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)


def open_private(path: str | os.PathLike, mode: str = "w"):
    """`open(path, mode)` for writing, the file created 0600 (an existing one is made 0600 first)."""
    create_private(path)
    return open(path, mode)


def write_private_atomic(path: str | os.PathLike, data: str) -> None:
    """Write `data` to `path` (0600) so that readers see the old file or the new one, never half of one."""
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, FILE_MODE)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), FILE_MODE)  # a stale tmp of a dead process of this pid may be looser
        f.write(data)
    os.replace(tmp, path)
