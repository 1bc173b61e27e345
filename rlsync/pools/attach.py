"""Attaching pools to a running job: the job file (`RUN_DIR/job.json`) and the job's `PoolRegistry` actor.

`RUN_DIR/job.json` (mode 0600: it holds the hub token) tells `python -m rlsync.pools` where the Ray
cluster, the namespace and the hub are. The registry is a named actor in the job's Ray namespace:
the driver reports its pools to it and takes the CLI's attach / leave requests (about once a second).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

JOB_FILE = "job.json"
LAST_JOB = Path(os.path.expanduser("~/.cache/rlsync/last_job"))
REGISTRY = "registry"


def write_job_file(run_dir: Path, info: dict[str, Any]) -> Path:
    """Atomically write RUN_DIR/job.json readable only by this user (it carries the hub token)."""
    path = Path(run_dir) / JOB_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f, default=str)
    os.chmod(tmp, 0o600)  # O_CREAT's mode is filtered by the umask; be explicit
    os.replace(tmp, path)
    try:
        LAST_JOB.parent.mkdir(parents=True, exist_ok=True)
        LAST_JOB.write_text(str(path.resolve()))
    except OSError as e:
        log.debug("could not record the last job: %s", e)
    return path


def ray_auth_token() -> str | None:
    """The Ray token this process uses (Ray 2.60's token auth): a CLI started elsewhere presents the same."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"]
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    return path.read_text().strip() if path.exists() else None


def read_job_file(job: str | os.PathLike | None) -> dict[str, Any]:
    """The job file of RUN_DIR `job` (or of $RLSYNC_JOB, or of the job started last on this machine)."""
    if job is None:
        job = os.environ.get("RLSYNC_JOB") or (LAST_JOB.read_text().strip() if LAST_JOB.exists() else None)
    if job is None:
        raise FileNotFoundError("no job given: pass --job RUN_DIR (or set RLSYNC_JOB)")
    path = Path(job)
    if path.is_dir():
        path = path / JOB_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path}: no job file; is the job running? (a job writes it at start-up "
                                "and removes it when it ends)")
    if path.stat().st_mode & 0o077:
        raise PermissionError(f"{path} is readable by others (mode {oct(path.stat().st_mode & 0o777)}): "
                              "it holds the hub token; refusing to use it")
    return json.loads(path.read_text())


# ---------------------------------------------------------------------------------- actors

class PoolRegistry:
    """The job's pool board: the driver reports its pools; the CLI asks to attach or detach pools."""

    def __init__(self) -> None:
        self.view: dict[str, Any] = {}
        self.reported = 0.0
        self.attach_requests: dict[str, dict] = {}
        self.leave_requests: set[str] = set()

    def sync(self, view: dict[str, Any]) -> dict[str, Any]:
        """Driver: publish the pools' states; take the pending attach / leave requests."""
        self.view, self.reported = view, time.time()
        out = {"attach": self.attach_requests, "leave": sorted(self.leave_requests)}
        self.attach_requests, self.leave_requests = {}, set()
        return out

    def attach(self, pool: str, workers: list[dict], location: dict) -> None:
        req = self.attach_requests.setdefault(pool, {"workers": [], "location": location})
        req["workers"].extend(workers)

    def request_leave(self, pool: str) -> None:
        self.leave_requests.add(pool)

    def snapshot(self) -> dict[str, Any]:
        return {"pools": self.view, "reported_s_ago": time.time() - self.reported if self.reported else None,
                "pending_attach": sorted(self.attach_requests), "pending_leave": sorted(self.leave_requests)}

