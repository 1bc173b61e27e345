"""Attaching pools to a running job: the job file (`RUN_DIR/job.json`) and the job's `PoolRegistry` actor.

`RUN_DIR/job.json` (mode 0600: it holds the hub token) tells `python -m rlsync.pools` where the Ray
cluster, the namespace and the hub are. The registry is a named actor in the job's Ray namespace:
the driver reports its pools to it and takes the CLI's attach / leave requests (about once a second).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


JOB_FILE = "job.json"
REGISTRY = "registry"
FIND_DEPTH = 3
"""How deep under the current directory a job file is looked for without `--job`: `runs/<date>/<time>/job.json`
(Hydra's default run dir, relative to where the job started) is 3 levels down."""


RAY_TOKEN_FILE = "ray_auth_token"


def _write_private(path: Path, text: str) -> None:
    """Atomically write `text` to `path` with mode 0600 (the umask would loosen O_CREAT's mode: chmod too)."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def ray_client_auth(run_dir: Path) -> dict[str, Any]:
    """What a process in a fresh shell must present to this process's Ray cluster; writes the token file.

    Ray 2.60 (``ray/_private/worker.py``, ``authentication_token_setup.py``): a ``ray.init()`` that starts
    a local cluster turns token auth on *in its own environment only* (``RAY_AUTH_MODE=token``) and
    creates ``~/.ray/auth_token`` if missing. A client that connects with an explicit address never
    turns auth on by itself, so it sends no token and the cluster answers ``InvalidAuthToken``. The
    client needs ``RAY_AUTH_MODE=token`` and the token (``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH``)
    in its environment before Ray reads its config. The token is copied to ``RUN_DIR/ray_auth_token``
    (0600), since the one Ray used may sit in another user's home or in an environment variable.
    """
    from ray._raylet import AuthenticationMode, AuthenticationTokenLoader, get_authentication_mode

    if get_authentication_mode() != AuthenticationMode.TOKEN:
        return {"ray_auth_mode": "disabled"}
    token = AuthenticationTokenLoader.instance().get_raw_token()
    if not token:  # cannot happen once ray.init() succeeded under token auth; say so if it does
        raise RuntimeError("Ray token auth is on but this process has no token to hand to clients")
    path = Path(run_dir) / RAY_TOKEN_FILE
    _write_private(path, token)
    return {"ray_auth_mode": "token", "ray_auth_token_file": str(path.resolve())}


def ray_connect_hint(address: str, error: BaseException) -> str:
    """Why a job could not join the Ray cluster at `address` (`ray.address=...`), and the usual fix."""
    mode = os.environ.get("RAY_AUTH_MODE", "disabled (unset)")
    return (f"{error}; RAY_AUTH_MODE here is {mode}. A cluster started with token auth "
            f"(`RAY_AUTH_MODE=token ray start ...`) needs RAY_AUTH_MODE=token in the job's environment too, with "
            f"the cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN (Ray's clients never turn auth on by "
            f"themselves); one started without it needs neither (docs/rl.md, 'A multi-node cluster').")


def use_ray_client_auth(job: dict[str, Any]) -> None:
    """Set this (client) process up to talk to the job's Ray cluster: its auth mode and token.

    Overrides the shell's RAY_AUTH_* (the job file states what the cluster wants). If Ray's config was
    already loaded in this process, reload it, as Ray itself does when it turns auth on.
    """
    mode = job.get("ray_auth_mode") or "disabled"
    os.environ["RAY_AUTH_MODE"] = mode
    if mode == "token":
        os.environ["RAY_AUTH_TOKEN"] = Path(job["ray_auth_token_file"]).read_text().strip()
    else:
        os.environ.pop("RAY_AUTH_TOKEN", None)
    import sys

    if "ray._raylet" in sys.modules:
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


def write_job_file(run_dir: Path, info: dict[str, Any]) -> Path:
    """Atomically write RUN_DIR/job.json readable only by this user (it carries the hub token)."""
    path = Path(run_dir) / JOB_FILE
    _write_private(path, json.dumps(info, default=str))
    return path


def remove_job_files(run_dir: Path) -> None:
    """The job ended: remove its job file and the Ray token copy."""
    for name in (JOB_FILE, RAY_TOKEN_FILE):
        (Path(run_dir) / name).unlink(missing_ok=True)


def find_job_here(cwd: str | os.PathLike | None = None) -> Path:
    """The job file of the one running job started from `cwd` (default: the current directory), or that `cwd` is
    the run dir of. Never a machine- or HOME-wide default: on a shared machine that was another user's job.

    Looks at `cwd/job.json` and at job files up to FIND_DEPTH levels below `cwd` whose job recorded `cwd` as
    the directory it started from (`started_from`); refuses when there is none or more than one.
    """
    cwd = Path(cwd or os.getcwd()).resolve()
    if (cwd / JOB_FILE).is_file():
        return cwd / JOB_FILE
    found = []
    for depth in range(1, FIND_DEPTH + 1):
        for path in sorted(cwd.glob("/".join(["*"] * depth) + "/" + JOB_FILE)):
            try:
                started = json.loads(path.read_text()).get("started_from")
            except (OSError, ValueError):  # another user's 0600 file, or one being replaced
                continue
            if started and Path(started).resolve() == cwd:
                found.append(path.parent)
    if not found:
        raise FileNotFoundError(f"no --job given and no running job started from {cwd}: pass --job RUN_DIR "
                                "(or set RLSYNC_JOB)")
    if len(found) > 1:
        raise FileNotFoundError(f"no --job given and {len(found)} running jobs started from {cwd} "
                                f"({', '.join(str(p.relative_to(cwd)) for p in found)}): pass --job RUN_DIR")
    return found[0] / JOB_FILE


def read_job_file(job: str | os.PathLike | None) -> dict[str, Any]:
    """The job file of RUN_DIR `job` (None: $RLSYNC_JOB, else the one job started from this directory)."""
    path = Path(job or os.environ.get("RLSYNC_JOB") or find_job_here())
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

