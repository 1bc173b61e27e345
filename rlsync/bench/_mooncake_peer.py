"""Mooncake TCP transfer-engine peer for `python -m rlsync.bench transfer` (run in Mooncake's own venv).

Standalone on purpose: it runs under the interpreter of the venv Mooncake was installed into and
imports nothing from rlsync. Buffers are anonymous mmaps, pre-faulted so no first-touch is timed.

    target SIZE             -> prints {"port": rpc_port, "ptr": buffer address}; lives until stdin closes
    write SIZE HOST:PORT PTR -> prints {"ready": 1}; then per stdin line "go" prints {"seconds": s}
"""
import ctypes
import json
import mmap
import sys
import time

from mooncake.engine import TransferEngine


def buffer(n: int) -> tuple[mmap.mmap, int]:
    mm = mmap.mmap(-1, n)
    mm.write(bytes(range(256)) * (n // 256) + bytes(n % 256))  # touch every page now
    return mm, ctypes.addressof(ctypes.c_char.from_buffer(mm))


def engine(ptr: int, n: int) -> TransferEngine:
    e = TransferEngine()
    if e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        raise SystemExit("mooncake: initialize failed")
    if e.register_memory(ptr, n) != 0:
        raise SystemExit("mooncake: register_memory failed")
    return e


def say(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


def main() -> None:
    role, n = sys.argv[1], int(sys.argv[2])
    mm, ptr = buffer(n)
    e = engine(ptr, n)
    if role == "target":
        say({"port": e.get_rpc_port(), "ptr": ptr})
        sys.stdin.read()
        return
    peer, peer_ptr = sys.argv[3], int(sys.argv[4])
    say({"ready": 1})
    for line in sys.stdin:
        if line.strip() != "go":
            break
        t0 = time.perf_counter()
        rc = e.transfer_sync_write(peer, ptr, peer_ptr, n)
        say({"seconds": time.perf_counter() - t0, "rc": rc})


if __name__ == "__main__":
    main()
