"""A hub's port taken over, while the hub is down, by another ZeroMQ service (a different socket type).

libzmq 4.3.5 (pyzmq 27) stops reconnecting a socket for good after a handshake with an incompatible
peer (checked standalone: a DEALER whose address was bound by a PUB for 2 s never reached the ROUTER
bound there afterwards, within 5 s; with a plain TCP listener that accepts and drops instead, it does).
A client whose sockets met such a squatter would wait forever for a hub that is back. The control
channel drops its socket after a try that timed out and makes a new one, so the worker re-joins and
serves its replica again; this test keeps that true."""
import time

import torch
import zmq

from rlsync.hub import ClientConfig, HubClient, Location
from rlsync.hub.server.loop import start_embedded_hub

from ports import free_port  # tests/ports.py


def test_a_client_whose_hub_port_was_squatted_by_another_zmq_socket_rejoins_when_the_hub_returns(tmp_path, wait_until):
    kw = dict(port=free_port(), journal=str(tmp_path / "journal.db"), token="t" * 48)
    hub = start_embedded_hub(**kw)
    cfg = ClientConfig(hub_deadline_s=30.0, heartbeat_s=0.5, rpc_timeout_s=1.0)
    holder = HubClient(hub.address, hub.token, config=cfg)
    reader = None
    try:
        holder.join(Location(host="h"))
        holder.publish("policy", 1, {"w": torch.arange(64, dtype=torch.float32)})
        joins = holder.session.joins
        hub.stop()
        squatter = zmq.Context.instance().socket(zmq.PUB)  # another service on the freed port
        squatter.setsockopt(zmq.LINGER, 0)
        wait_until(lambda: _bound(squatter, hub.address), timeout_s=10,  # the hub's socket closes asynchronously
                   what="the stopped hub's port to be free")
        time.sleep(1.5)  # the fault's duration: the holder's sockets retry against it meanwhile
        squatter.close(0)
        hub = start_embedded_hub(**kw)                   # the hub is back at the same address
        wait_until(lambda: holder.session.joins > joins, timeout_s=20, what="the holder's re-join")
        reader = HubClient(hub.address, hub.token, config=ClientConfig(hub_deadline_s=30.0))
        reader.join(Location(host="r"))
        got = reader.fetch("policy", 1)                  # served by the holder's re-registered copy
        assert got.version == 1 and got.bytes_by_source.get(holder.worker_id, 0) > 0, got.bytes_by_source
    finally:
        if reader is not None:
            reader.leave()
        holder.leave()
        hub.stop()


def _bound(sock, address: str) -> bool:
    try:
        sock.bind(address)
        return True
    except zmq.ZMQError as e:
        if e.errno != zmq.EADDRINUSE:
            raise
        return False
