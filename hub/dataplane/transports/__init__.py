"""Data-plane transports, by name: `tcp` (native engine), `tcp-py` (portable), `shm` (same host),
`rdma` (pyverbs one-sided READ), `cuda_ipc` (same-host GPUs). See base.py and docs/transports.md."""
from rlsync.hub.dataplane.transports.base import (Transport, boot_id, get_transport, register_transport, registered,
                                                  transport_by_kind, transport_names)
from rlsync.hub.dataplane.transports import shm, tcp_native, tcp_py  # noqa: F401  (registration)
from rlsync.hub.dataplane.transports import cuda, rdma  # noqa: F401  (registration; each reports itself unavailable without its hardware)
from rlsync.hub.errors import TransportUnavailableError
from rlsync.hub.protocol.messages import Endpoint

__all__ = ["Transport", "boot_id", "get_transport", "register_transport", "registered", "transport_by_kind",
           "transport_names", "choose_transport", "available_transports", "endpoint_info", "local_endpoint",
           "transport_report"]


def available_transports() -> list[str]:
    return [n for n, c in registered().items() if c.is_available()]


def endpoint_info() -> dict:
    """What a worker advertises about its data plane when it joins: the transports it serves, its
    machine's boot (same-host transports compare it), and what each available transport adds
    (under its own key: `Endpoint.extra`)."""
    names = available_transports()
    info: dict = {"transports": names, "boot_id": boot_id()}
    for name in names:
        info.update(registered()[name].endpoint_info())
    return info


def local_endpoint(tcp: str, pid: int, host: str, reader_key: bytes | None = None) -> Endpoint:
    """This worker's endpoint: its data-plane server's address plus what this host's transports advertise."""
    return Endpoint.from_wire({"tcp": tcp, "pid": pid, "host": host, **endpoint_info(),
                               **({"reader_key": reader_key} if reader_key is not None else {})})


def transport_report() -> list[tuple[str, bool, str]]:
    """(name, available, why not) for every registered transport, e.g. for `python -m rlsync.hub doctor`."""
    out = []
    for name, cls in registered().items():
        try:
            cls.check_available()
            out.append((name, True, ""))
        except TransportUnavailableError as e:
            out.append((name, False, str(e)))
    return out


def choose_transport(mine: Endpoint, peer: Endpoint, forced: str | None = None) -> Transport:
    """The transport a reader uses towards `peer`: the forced one, else the best usable one."""
    if forced:
        t = get_transport(forced)
        if not t.usable_between(mine, peer):
            raise TransportUnavailableError(f"transport {forced!r} cannot reach peer {peer.tcp}")
        return t
    classes = registered()
    best = None
    for name in available_transports():
        t = classes[name]()
        if t.usable_between(mine, peer) and (best is None or t.priority > best.priority):
            best = t
    if best is None:
        raise TransportUnavailableError(f"no transport reaches peer {peer.tcp}")
    return best
