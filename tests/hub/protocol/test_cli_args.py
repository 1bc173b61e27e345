"""Every `python -m rlsync…` entry point answers a bad argument with one line and exit code 2.

On 0f12831 `hub serve --worker-timeout 0` ran and expired every worker at once, `--port 99999`
listened on 34463, a token or journal in a missing directory, a journal that is a directory,
`--host 256.1.1.1` and `--delta-tier-gbps a,b` gave tracebacks; the gateway looped forever on
`--model a:b`, ran with `--group 0x1` and spun on `--poll-s -1`. Each case here runs the real
command as a subprocess (nothing starts: the refusal comes at parse time) and checks the exit
code, a single `error:` line naming the argument, no traceback, and that the process ended.
The library's own constructors refuse the same values, typed (a Python caller gets a HubError).
"""
import os
import socket
import subprocess
import sys

import pytest

from rlsync.hub import HubClient, HubConfig, HubServer
from rlsync.hub import errors as E
from rlsync.hub.federation.gateway import GatewayConfig
from rlsync.hub.server.journal import Journal
from rlsync.hub.protocol.rpc import read_or_create_token

GW = ["rlsync.hub.federation", "--home", "tcp://127.0.0.1:1", "--home-token-file", "{tok}",
      "--local", "tcp://127.0.0.1:2", "--local-token-file", "{tok}", "--dc", "dc1"]
SERVE = ["rlsync.hub", "serve", "--token-file", "{tmp}/hub.token", "--journal", "{tmp}/hub.db"]

CASES = [  # (id, command after `python -m`, the argument the error must name)
    ("serve-timeout-0", SERVE + ["--worker-timeout", "0"], "--worker-timeout"),
    ("serve-timeout-neg", SERVE + ["--worker-timeout", "-1"], "--worker-timeout"),
    ("serve-timeout-nan", SERVE + ["--worker-timeout", "nan"], "--worker-timeout"),
    ("serve-grace-neg", SERVE + ["--reregister-grace", "-1"], "--reregister-grace"),
    ("serve-port-big", SERVE + ["--port", "99999"], "--port"),
    ("serve-port-neg", SERVE + ["--port", "-1"], "--port"),
    ("serve-port-busy", SERVE + ["--port", "{busy}"], "--port"),
    ("serve-token-nodir", ["rlsync.hub", "serve", "--token-file", "{tmp}/no/hub.token", "--journal", "{tmp}/j"],
     "--token-file"),
    ("serve-token-isdir", ["rlsync.hub", "serve", "--token-file", "{tmp}", "--journal", "{tmp}/j"], "--token-file"),
    ("serve-journal-nodir", ["rlsync.hub", "serve", "--token-file", "{tmp}/t", "--journal", "{tmp}/no/j"],
     "--journal"),
    ("serve-journal-isdir", ["rlsync.hub", "serve", "--token-file", "{tmp}/t", "--journal", "{tmp}"], "--journal"),
    ("serve-host-bad", SERVE + ["--host", "256.1.1.1"], "--host"),
    ("serve-host-foreign", SERVE + ["--host", "192.0.2.1"], "--host"),
    ("serve-tiers-letters", SERVE + ["--delta-tier-gbps", "a,b"], "--delta-tier-gbps"),
    ("serve-tiers-three", SERVE + ["--delta-tier-gbps", "80,25,10"], "--delta-tier-gbps"),
    ("serve-token-empty", ["rlsync.hub", "serve", "--token-file", "{empty}", "--journal", "{tmp}/j"], "token file"),
    ("seed-address-port", ["rlsync.hub", "seed", "--address", "tcp://127.0.0.1:99999", "--token-file", "{tok}"],
     "--address"),
    ("seed-address-junk", ["rlsync.hub", "seed", "--address", "nonsense", "--token-file", "{tok}"], "--address"),
    ("seed-token-missing", ["rlsync.hub", "seed", "--address", "tcp://127.0.0.1:5555", "--token-file", "{tmp}/x"],
     "--token-file"),
    ("seed-bind-bad", ["rlsync.hub", "seed", "--address", "tcp://127.0.0.1:5555", "--token-file", "{tok}",
                       "--bind", "256.1.1.1"], "--bind"),
    ("demo-readers-0", ["rlsync.hub", "demo", "--readers", "0"], "--readers"),
    ("demo-size-neg", ["rlsync.hub", "demo", "--size-mb", "-1"], "--size-mb"),
    ("gw-model-colon", GW + ["--model", "a:b"], "--model"),
    ("gw-model-empty", GW + ["--model", ""], "--model"),
    ("gw-group-zero", GW + ["--model", "m", "--group", "0x1"], "--group"),
    ("gw-group-junk", GW + ["--model", "m", "--group", "abc"], "--group"),
    ("gw-poll-neg", GW + ["--model", "m", "--poll-s", "-1"], "--poll-s"),
    ("gw-chunk-neg", GW + ["--model", "m", "--chunk-mib", "-1"], "--chunk-mib"),
    ("gw-deadline-0", GW + ["--model", "m", "--hub-deadline-s", "0"], "--hub-deadline-s"),
    ("gw-home-port", [GW[0], "--home", "tcp://127.0.0.1:70000", *GW[2:], "--model", "m"], "--home"),
    ("gw-token-missing", [*GW[:4], "{tmp}/x", *GW[5:], "--model", "m"], "--home-token-file"),
    ("pools-size-0", ["rlsync.pools", "join", "--pool", "p", "--size", "0"], "--size"),
    ("pools-timeout-neg", ["rlsync.pools", "list", "--timeout", "-5"], "--timeout"),
    ("pools-job-missing", ["rlsync.pools", "list", "--job", "{tmp}/no"], "--job"),
    ("bench-unknown", ["rlsync.bench", "nope"], "scenario"),
    ("bench-model-neg", ["rlsync.bench", "fanout", "--model-mib", "-1"], "--model-mib"),
    ("bench-streams-0", ["rlsync.bench", "standalone", "--streams", "0"], "--streams"),
    ("sim-set-unknown", ["rlsync.sim", "paper", "--set", "x=1"], "--set"),
    ("sim-set-neg", ["rlsync.sim", "paper", "--set", "engines=-5"], "--set"),
    ("sim-set-letters", ["rlsync.sim", "paper", "--set", "engines=abc"], "--set"),
    ("sim-poll-neg", ["rlsync.sim", "federation", "--poll-ms", "-1"], "--poll-ms"),
    ("sim-rpc-neg", ["rlsync.sim", "validate", "--rpc-ms", "-1"], "--rpc-ms"),
    ("sim-measured-missing", ["rlsync.sim", "validate", "--measured", "{tmp}/none.json"], "--measured"),
    ("report-missing", ["rlsync.report", "{tmp}/no_run"], "run_dir"),
    ("report-empty", ["rlsync.report", "{tmp}"], "run_dir"),
    ("local-steps-0", ["rlsync.local", "--steps", "0"], "--steps"),
]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    (tmp / "tok").write_text("t0k\n")
    (tmp / "empty").write_text("")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    yield {"tmp": str(tmp), "tok": str(tmp / "tok"), "empty": str(tmp / "empty"), "busy": busy.getsockname()[1]}
    busy.close()


@pytest.mark.parametrize("cmd,arg", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_argument_is_one_line_and_exit_2(paths, cmd, arg):
    argv = [sys.executable, "-m", *(a.format(**paths) for a in cmd)]
    env = {**os.environ, "RLSYNC_JOB": "", "HOME": paths["tmp"]}  # pools: no job of this shell
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, cwd=paths["tmp"])
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert len(errors) == 1 and arg in errors[0], r.stderr
    assert r.stderr.rstrip().splitlines()[-1] == errors[0], r.stderr  # the last word, not buried in a log


def test_hub_config_refuses_timeouts_that_expire_everyone_or_no_one():
    for kw in ({"worker_timeout_s": 0}, {"worker_timeout_s": -1.0}, {"worker_timeout_s": float("nan")},
               {"worker_timeout_s": float("inf")}, {"ticket_ttl_s": 0}, {"reregister_grace_s": -1},
               {"suspect_s": -0.5}, {"worker_timeout_s": "15"}):
        with pytest.raises(E.InvalidArgumentError, match=next(iter(kw))):
            HubConfig(**kw)
    assert HubConfig(reregister_grace_s=0, suspect_s=0).worker_timeout_s == 15.0


def test_hub_server_refuses_a_port_out_of_range_before_touching_anything(tmp_path):
    for port in (99999, -1, 65536):
        with pytest.raises(E.InvalidArgumentError, match="port"):
            HubServer(port=port, token="t", journal=str(tmp_path / "j.db"))
    assert os.listdir(tmp_path) == []  # refused before the journal was created


def test_the_client_refuses_a_hub_address_out_of_range():
    for address in ("tcp://127.0.0.1:99999", "tcp://127.0.0.1:0", "tcp://127.0.0.1:-1", "tcp://:5555"):
        with pytest.raises(E.InvalidArgumentError, match="bad hub address"):
            HubClient(address, token="t")


def test_gateway_config_refuses_what_would_loop_or_spin():
    for kw in ({"models": ("a:b",)}, {"models": ("",)}, {"models": ()}, {"group": (0, 1)}, {"group": (1,)},
               {"poll_s": -1.0}, {"poll_s": 0}, {"retry_s": float("nan")}):
        with pytest.raises(E.InvalidArgumentError, match="GatewayConfig"):
            GatewayConfig(**kw)


def test_journal_and_token_paths_that_cannot_be_created_are_typed(tmp_path):
    for bad in (str(tmp_path), str(tmp_path / "no" / "j.db")):
        with pytest.raises(E.InvalidArgumentError, match="journal"):
            Journal(bad)
    with pytest.raises(E.InvalidArgumentError, match="token file"):
        read_or_create_token(str(tmp_path / "no" / "hub.token"))
