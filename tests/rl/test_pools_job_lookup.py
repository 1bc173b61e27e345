"""Which job `python -m rlsync.pools` talks to without `--job` (rlsync/pool/attach.py `find_job_here`).

Never a HOME-wide "last job": on a shared machine that file pointed at another process's job (issue 36 item 6).
Only the job started from the current directory, or the run dir the CLI stands in; else one line naming --job.
Pure files and one CLI process that stops before Ray: seconds.
"""
import json
import os
import subprocess
import sys

import pytest

from rlsync.pool.attach import JOB_FILE, find_job_here, read_job_file


def _job(run_dir, started_from, **extra):
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / JOB_FILE
    path.write_text(json.dumps({"run_dir": str(run_dir), "started_from": str(started_from), **extra}))
    path.chmod(0o600)
    return path


def test_the_cli_without_job_never_follows_a_home_wide_last_job(tmp_path):
    home, here, other = tmp_path / "home", tmp_path / "here", tmp_path / "someone_else" / "run"
    here.mkdir()
    _job(other, other.parent)  # another process's job, recorded as the machine's "last job" by older versions
    (home / ".cache" / "rlsync").mkdir(parents=True)
    (home / ".cache" / "rlsync" / "last_job").write_text(str(other / JOB_FILE))
    env = {**{k: v for k, v in os.environ.items() if k != "RLSYNC_JOB"}, "HOME": str(home)}
    p = subprocess.run([sys.executable, "-m", "rlsync.pools", "list"], cwd=here, env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--job" in lines[0] and str(here) in lines[0], p.stderr
    assert "someone_else" not in p.stderr


def test_the_job_started_from_this_directory_is_found_and_no_other(tmp_path, monkeypatch):
    here = tmp_path / "exp"
    mine = _job(here / "runs" / "2026-12-01" / "10-00-00", here)        # Hydra's default run dir
    _job(here / "runs" / "copied", tmp_path / "elsewhere")              # under here, but started elsewhere
    _job(tmp_path / "sibling" / "run", here)                            # started here, but not under here
    assert find_job_here(here) == mine
    assert find_job_here(mine.parent) == mine                           # standing in the run dir itself
    monkeypatch.delenv("RLSYNC_JOB", raising=False)
    monkeypatch.chdir(here)
    assert read_job_file(None)["run_dir"] == str(mine.parent)


def test_none_or_several_jobs_from_here_is_one_line_naming_job(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no running job started from .*pass --job"):
        find_job_here(tmp_path)
    _job(tmp_path / "runs" / "a", tmp_path)
    _job(tmp_path / "runs" / "b", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"2 running jobs started from .*runs/a, runs/b.*pass --job"):
        find_job_here(tmp_path)
