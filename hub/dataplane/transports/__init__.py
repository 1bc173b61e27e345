"""Data-plane transports, by name: `tcp` (native engine), `tcp-py` (portable), `shm` (same host),
`rdma` (pyverbs one-sided READ), `cuda_ipc` (same-host GPUs). See base.py and docs/transports.md."""
from rlsync.hub.dataplane.transports.base import Transport, get_transport, register_transport, transport_by_kind, transport_names
from rlsync.hub.dataplane.transports import shm, tcp_native, tcp_py  # noqa: F401  (registration)
from rlsync.hub.dataplane.transports import cuda, rdma  # noqa: F401  (registration; each reports itself unavailable without its hardware)

__all__ = ["Transport", "get_transport", "register_transport", "transport_by_kind", "transport_names",
           "choose_transport", "available_transports", "transport_report"]


def available_transports() -> list[str]:
    from rlsync.hub.dataplane.transports.base import _REGISTRY
    return [n for n, c in sorted(_REGISTRY.items()) if c.is_available()]


def transport_report() -> list[tuple[str, bool, str]]:
    """(name, available, why not) for every registered transport, e.g. for `python -m rlsync.hub doctor`."""
    from rlsync.hub.dataplane.transports.base import _REGISTRY
    from rlsync.hub.errors import TransportUnavailableError
    out = []
    for name, cls in sorted(_REGISTRY.items()):
        try:
            cls.check_available()
            out.append((name, True, ""))
        except TransportUnavailableError as e:
            out.append((name, False, str(e)))
    return out


def choose_transport(mine: dict, peer: dict, forced: str | None = None) -> Transport:
    """The transport a reader uses towards `peer`: the forced one, else the best usable one."""
    if forced:
        t = get_transport(forced)
        if not t.usable_between(mine, peer):
            from rlsync.hub.errors import TransportUnavailableError
            raise TransportUnavailableError(f"transport {forced!r} cannot reach peer {peer.get('tcp')}")
        return t
    from rlsync.hub.dataplane.transports.base import _REGISTRY
    best = None
    for name in available_transports():
        t = _REGISTRY[name]()
        if t.usable_between(mine, peer) and (best is None or t.priority > best.priority):
            best = t
    if best is None:
        from rlsync.hub.errors import TransportUnavailableError
        raise TransportUnavailableError(f"no transport reaches peer {peer.get('tcp')}")
    return best
