"""argparse `type=` validators for every `python -m rlsync…` entry point.

A bad value ends the process at parse time with argparse's one line, exit code 2:

    python -m rlsync.hub serve: error: argument --worker-timeout: must be a finite number > 0, got '0'

never with a traceback, and never by running on a value it cannot use (a zero timeout expiring
every worker, a port ZeroMQ takes modulo 65536). Checks that need the filesystem or the network
stack (the parent directory exists, the path is not a directory, the address is this host's) run
here too, so they fail the same way. The RL side's entry points import these from
`rlsync.hub.cli_args` (the hub imports nothing of the RL side). Light on purpose: stdlib only at
import, so `--help` and a refused value cost no torch or ZeroMQ import.
"""
from __future__ import annotations

import argparse
import math
import os
import socket
from typing import Callable

Bad = argparse.ArgumentTypeError


def number(text: str, kind: type) -> float | int:
    """`text` as `kind` (int or float), finite; the validators below add the range."""
    try:
        v = kind(text)
    except ValueError:
        raise Bad(f"must be {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    if isinstance(v, float) and not math.isfinite(v):
        raise Bad(f"must be a finite number, got {text!r}")
    return v


def positive_float(text: str) -> float:
    """A finite float > 0 (a timeout, a period, a size)."""
    v = number(text, float)
    if v <= 0:
        raise Bad(f"must be a finite number > 0, got {text!r}")
    return v


def mib(text: str) -> int:
    """A size in MiB (a float > 0), as bytes (at least one)."""
    v = int(positive_float(text) * (1 << 20))
    if v < 1:
        raise Bad(f"must be at least one byte (1/1048576 MiB), got {text!r}")
    return v


def nonneg_float(text: str) -> float:
    """A finite float >= 0 (a grace period, a cost that may be nothing)."""
    v = number(text, float)
    if v < 0:
        raise Bad(f"must be a finite number >= 0, got {text!r}")
    return v


def positive_int(text: str) -> int:
    """An int >= 1 (a count of workers, steps, readers)."""
    v = number(text, int)
    if v < 1:
        raise Bad(f"must be an integer >= 1, got {text!r}")
    return v


def bind_port(text: str) -> int:
    """A port to listen on: 0..65535 (0: pick a free one)."""
    v = number(text, int)
    if not 0 <= v <= 65535:
        raise Bad(f"must be a port in 0..65535 (0: pick a free one), got {text!r}")
    return v


def bind_host(text: str) -> str:
    """An address of this host to listen on (an IP literal or a name resolving to one)."""
    check_listen(text, 0)
    return text


def check_listen(host: str, port: int) -> None:
    """Bind (host, port) once and let go, as the server will (SO_REUSEADDR, as ZeroMQ sets it): an
    address of another host, or a port another process listens on, fails here, not as a traceback later."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise Bad(f"{host!r} is not an IP address or a resolvable host name ({e})") from None
    family, _, _, _, addr = infos[0]
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(addr)
            s.listen()
    except OSError as e:
        what = f"{host!r}" if not port else f"{host}:{port}"
        raise Bad(f"cannot listen on {what}: {e.strerror}"
                  + (" (use an address of this host, e.g. 127.0.0.1 or 0.0.0.0)" if not port else "")) from None


def hub_address(text: str) -> str:
    """A hub address, tcp://host:port with a port in 1..65535 (the client's own check)."""
    from rlsync.hub.errors import InvalidArgumentError
    from rlsync.hub.protocol.rpc import check_address
    try:
        return check_address(text)
    except InvalidArgumentError as e:
        raise Bad(str(e)) from None


def file_to_create(text: str) -> str:
    """A file path the process may create or reuse: its directory exists, and it is not a directory."""
    if not text:
        raise Bad("must be a file path, got ''")
    if os.path.isdir(text):
        raise Bad(f"{text} is a directory; pass a file path")
    parent = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(parent):
        raise Bad(f"directory {parent} does not exist; create it or pass a path in an existing directory")
    return text


def existing_file(text: str) -> str:
    """A regular file that exists (a token file written by the hub, a stored bundle)."""
    if not os.path.isfile(text):
        why = "is a directory" if os.path.isdir(text) else "does not exist"
        raise Bad(f"{text} {why}; pass the path of an existing file")
    return text


def existing_dir(text: str) -> str:
    """A directory that exists (a run dir)."""
    if not os.path.isdir(text):
        raise Bad(f"{text} is not a directory")
    return text


def model_name(text: str) -> str:
    """A model name the hub accepts (non-empty, no ':')."""
    from rlsync.hub.errors import InvalidArgumentError
    from rlsync.hub.protocol.args import check_value
    try:
        return check_value("latest", "model", text)
    except InvalidArgumentError as e:
        raise Bad(str(e).removeprefix("latest: ")) from None


def group(text: str) -> tuple[int, int]:
    """'TPxPP', e.g. 2x1: a model-parallel group of positive sizes."""
    tp, sep, pp = text.partition("x")
    if sep and tp.isdigit() and pp.isdigit() and int(tp) >= 1 and int(pp) >= 1:
        return int(tp), int(pp)
    raise Bad(f"must be TPxPP with sizes >= 1 (e.g. 2x1), got {text!r}")


def float_list(n: int) -> Callable[[str], tuple[float, ...]]:
    """`n` comma-separated finite floats > 0, e.g. float_list(4)('80,25,10,1')."""
    def parse(text: str) -> tuple[float, ...]:
        parts = text.split(",")
        try:
            vals = tuple(positive_float(x) for x in parts)
        except Bad:
            vals = ()
        if len(vals) != n:
            raise Bad(f"must be {n} comma-separated numbers > 0, got {text!r}")
        return vals
    parse.__name__ = f"list of {n} numbers"
    return parse
