"""The agent process: `ip netns exec <ns> python -m rlsync.bench.agent`, one per emulated host.

It reads one JSON command per line from stdin and answers one per line on stdout (the protocol in
`protocol.py`); every command runs on its own thread. This is the only importer of the `cmd_*`
modules: importing them fills the command registry.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

from rlsync.hub.logs import setup_logging

from . import cmd_delta, cmd_federation, cmd_gloo, cmd_hub, cmd_ray_store  # noqa: F401  (register their commands)
from .protocol import COMMANDS, STATE


def agent_main() -> int:
    setup_logging(os.environ.get("RLSYNC_AGENT_LOG", "WARNING"))
    out_lock = threading.Lock()
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints from libraries must not corrupt the protocol

    def reply(msg: dict) -> None:
        with out_lock:
            out.write(json.dumps(msg) + "\n")
            out.flush()

    def run(msg: dict) -> None:
        args = dict(msg.get("args") or {})
        at = args.pop("at", None)
        try:
            if at is not None:
                time.sleep(max(0.0, at - time.monotonic()))
            result = COMMANDS.get(msg["cmd"])(**args)
            reply({"id": msg["id"], "ok": True, "result": result})
        except BaseException as e:  # noqa: BLE001 - shipped to the parent
            import traceback
            reply({"id": msg["id"], "ok": False, "error": f"{type(e).__name__}: {e}",
                   "trace": traceback.format_exc()})

    reply({"id": 0, "ok": True, "result": {"pid": os.getpid()}})
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "exit":
            reply({"id": msg["id"], "ok": True, "result": True})
            break
        threading.Thread(target=run, args=(msg,), daemon=True).start()
    for c in list(STATE.clients.values()):
        try:
            c.leave()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
    for s in STATE.hubs.values():
        s.stop()
    os._exit(0)  # do not wait on library threads (gloo, ray) at exit


if __name__ == "__main__":
    sys.exit(agent_main())
