"""Benchmark set-up: installs what a contender needs when it is missing (iperf3 from apt; Mooncake in its own venv).

A contender that cannot be set up raises `Skip` with the reason; the benchmark reports it and goes on.
Installs happen at benchmark run time only, never in tests.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

log = logging.getLogger(__name__)

_MOONCAKE_PKG = "mooncake-transfer-engine-non-cuda"
_MOONCAKE_DEBS = ["libibverbs1", "libnl-3-200", "libnl-route-3-200"]


class Skip(Exception):
    """A contender that cannot run here; the message says why."""


def _apt_install(pkgs: list[str]) -> None:
    if shutil.which("apt-get") is None:
        raise Skip(f"no apt-get to install {' '.join(pkgs)}")
    sudo = []
    if os.geteuid() != 0:
        if not shutil.which("sudo"):
            raise Skip(f"needs `apt-get install {' '.join(pkgs)}` and we are not root (no sudo)")
        sudo = ["sudo", "-n"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = [*sudo, "apt-get", "install", "-y", "-q", *pkgs]
    r = subprocess.run(install, env=env, capture_output=True, text=True)
    if r.returncode != 0:  # stale package lists: refresh once and retry
        subprocess.run([*sudo, "apt-get", "update", "-q"], env=env, capture_output=True)
        r = subprocess.run(install, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise Skip(f"`apt-get install {' '.join(pkgs)}` failed: {r.stderr.strip().splitlines()[-1:]}")


def ensure_iperf3() -> str:
    if shutil.which("iperf3") is None:
        log.info("set-up: installing iperf3 (apt-get install -y iperf3)")
        _apt_install(["iperf3"])
    path = shutil.which("iperf3")
    if path is None:
        raise Skip("iperf3 is not installed and could not be")
    return path


def ensure_mooncake(cache: Path) -> str:
    """The python of a venv with Mooncake's transfer engine, created on first use."""
    venv = cache / "mooncake-venv"
    py = venv / "bin" / "python"
    probe = [str(py), "-c", "from mooncake.engine import TransferEngine"]
    if py.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return str(py)
    log.info("set-up: installing %s into %s (and Debian %s)", _MOONCAKE_PKG, venv, " ".join(_MOONCAKE_DEBS))
    _apt_install(_MOONCAKE_DEBS)
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", _MOONCAKE_PKG], capture_output=True, text=True)
    if r.returncode != 0:
        raise Skip(f"pip install {_MOONCAKE_PKG} failed: {r.stderr.strip().splitlines()[-1:]}")
    r = subprocess.run(probe, capture_output=True, text=True)
    if r.returncode != 0:
        raise Skip(f"Mooncake installed but does not import: {r.stderr.strip().splitlines()[-1:]}")
    return str(py)
