"""`ep(**fields)`: a typed data-plane endpoint for transport tests (any address unless one is given)."""
from rlsync.hub.protocol.messages import Endpoint


def ep(tcp: str = "127.0.0.1:1", **fields) -> Endpoint:
    return Endpoint.from_wire({"tcp": tcp, **fields})
