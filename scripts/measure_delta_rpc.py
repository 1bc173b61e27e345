"""What a delta reader's control traffic to the hub is, per message type (docs/deltas.md §6).

An embedded hub, a trainer client in dc0 and R reader clients in dc1, in this process, on loopback;
the bench's model (`model_bf16`, 8 MiB bf16, 0.5 MiB chunks) and real-like steps (`mutate_real`).
Counts, per reader per version over `--rounds` versions after a warm-up, the hub's replies to the
readers (what crosses into a reader's DC) and the readers' requests, by operation, in msgpack bytes
(without ZeroMQ framing and TCP/IP headers: about 70 bytes more per message).

    scripts/run python scripts/measure_delta_rpc.py --readers 4 --rounds 3
"""
from __future__ import annotations

import argparse
import collections
import threading

from rlsync.bench.agent import cmd_delta
from rlsync.bench.agent.protocol import STATE
from rlsync.hub import ClientConfig, HubClient, Location, ManifestConfig
from rlsync.hub.delta.plan import DeltaConfig
from rlsync.hub.protocol.rpc import unpack
from rlsync.hub.server.loop import HubServer, start_embedded_hub
from rlsync.hub.state import HubConfig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--readers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    calls, nbytes, cur = collections.Counter(), collections.Counter(), {"on": False}
    readers_wids: set[str] = set()
    handle, reply = HubServer._handle, HubServer._reply

    def counting_handle(self, frames):  # the op of the request being answered (the hub is one thread)
        m = unpack(frames[-1])
        cur.update(op=m.get("op"), wid=(m.get("args") or {}).get("wid"), req=len(frames[-1]))
        return handle(self, frames)

    def counting_reply(self, ident, rid, ok, payload):
        before = self.bytes_out
        reply(self, ident, rid, ok, payload)
        if cur["on"] and cur["wid"] in readers_wids:
            calls[cur["op"]] += 1
            nbytes[cur["op"]] += self.bytes_out - before
            nbytes["req:" + cur["op"]] += cur["req"]

    HubServer._handle, HubServer._reply = counting_handle, counting_reply
    hub = start_embedded_hub(config=HubConfig(delta=DeltaConfig(tier_gbps=(0.25, 0.25, 0.25, 0.025))))
    cfg = ClientConfig(manifest=ManifestConfig(chunk_bytes=1 << 19), transport="tcp-py")

    def client(dc: str, host: str) -> HubClient:
        c = HubClient(hub.address, hub.token, config=cfg)
        c.join(Location(dc=dc, rack=dc + "r", host=host), host)
        return c

    tr = client("dc0", "trainer")
    readers = [client("dc1", f"r{i}") for i in range(a.readers)]
    readers_wids.update(c.worker_id for c in readers)
    cmd_delta._model_bf16("T", 8, seed=0)
    for i in range(a.readers):
        cmd_delta._model_bf16(f"R{i}", 8, seed=0, zero=True)

    def version(v: int) -> set[str]:
        if v > 1:
            tr.release("policy", v - 1)
        cmd_delta._mutate_real("T", v, 0.05)
        tr.publish("policy", v, STATE.models["T"].tensors)
        tr.publish_delta("policy", v, STATE.models["T"].tensors)
        modes: list[str] = []
        ts = [threading.Thread(target=lambda i=i: modes.append(readers[i].fetch_delta(
            "policy", into=STATE.models[f"R{i}"].tensors).mode)) for i in range(a.readers)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return set(modes)

    version(1)
    cur["on"] = True
    modes = set().union(*(version(v) for v in range(2, 2 + a.rounds)))
    cur["on"] = False
    n = a.readers * a.rounds
    print(f"per reader per version ({a.readers} readers, {a.rounds} versions, modes {sorted(modes)}):")
    for op in sorted(calls):
        print(f"  {op:13s} replies {calls[op] / n:5.2f}  reply bytes {nbytes[op] / n:7.1f}  "
              f"request bytes {nbytes['req:' + op] / n:7.1f}")
    print(f"  total         replies {sum(calls.values()) / n:5.2f}  reply bytes {sum(nbytes[o] for o in calls) / n:7.1f}")
    for c in readers + [tr]:
        c.leave()
    hub.stop()


if __name__ == "__main__":
    main()
