"""The simulated network: nodes with a NIC each, racks, DCs, a WAN; the links a transfer crosses.

    net = Network(nic_bps=31.25e6, dc_link_bps=3.125e6)       # bytes/s, each direction
    net.add("trainer", dc="dc0", rack="r0")
    net.add("ro0", dc="dc1", rack="r0")
    net.path("trainer", "ro0")   # ('trainer:up', 'dc:dc0:up', 'dc:dc1:down', 'ro0:down')

Every link is one direction of a full-duplex link, as in the emulator (rlsync/bench/topo.py shapes
egress on both ends of every veth): a node's upload (`N:up`) and download (`N:down`); a rack's
uplink to its DC and the downlink back (`rack:D/R:up|down`, only when `rack_link_bps` is set — the
DC fabric is non-blocking otherwise); a DC's link to the WAN (`dc:D:up|down`, when `dc_link_bps` is
set). Nodes on one host (same `host` label) move bytes over the host's interconnect instead
(`N:nvup`, `N:nvdown`, NVLink/PCIe class, `host_bps`). `efficiency` scales every capacity to what
one transport flow achieves on it (TCP goodput / line rate; the bench measures it in each run).
A node's Location is what the hub sees, so the planner's tiers match the links.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rlsync.hub.model.location import Location


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    location: Location
    nic_bps: float
    """This node's NIC rate, bytes/s each direction (line rate, before `efficiency`)."""


@dataclass(slots=True)
class Network:
    nic_bps: float
    """Default NIC rate of a node, bytes/s each direction."""
    dc_link_bps: float | None = None
    """Each DC's link to the WAN, bytes/s each direction; None = not a bottleneck."""
    rack_link_bps: float | None = None
    """Each rack's uplink to its DC fabric, bytes/s each direction; None = non-blocking fabric."""
    host_bps: float = 400e9
    """Inside one host (NVLink class), per node each direction."""
    efficiency: float = 1.0
    """Goodput of one flow / line rate, applied to every network link (not to the host interconnect)."""
    nodes: dict[str, Node] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"efficiency must be in (0, 1], got {self.efficiency}")
        for name in ("nic_bps", "dc_link_bps", "rack_link_bps", "host_bps"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ValueError(f"{name} must be > 0, got {v}")

    def add(self, name: str, *, dc: str = "dc0", rack: str = "r0", host: str = "", nic_bps: float | None = None) -> Node:
        if name in self.nodes:
            raise ValueError(f"node {name!r} already exists")
        if name in ("dc", "rack") or ":" in name:
            raise ValueError(f"node name {name!r}: 'dc', 'rack' and names with ':' are reserved for links")
        n = Node(name, Location(dc=dc, rack=rack, host=host or name), nic_bps or self.nic_bps)
        self.nodes[name] = n
        return n

    def path(self, src: str, dst: str) -> tuple[str, ...]:
        """The links a transfer from node `src` to node `dst` crosses, in order."""
        a, b = self.nodes[src].location, self.nodes[dst].location
        if src == dst:
            raise ValueError(f"a transfer from {src!r} to itself crosses nothing")
        if a.host == b.host:
            return (f"{src}:nvup", f"{dst}:nvdown")
        p = [f"{src}:up"]
        if a.dc != b.dc or a.rack != b.rack:
            if self.rack_link_bps is not None:
                p.append(f"rack:{a.dc}/{a.rack}:up")
        if a.dc != b.dc and self.dc_link_bps is not None:
            p += [f"dc:{a.dc}:up", f"dc:{b.dc}:down"]
        if (a.dc != b.dc or a.rack != b.rack) and self.rack_link_bps is not None:
            p.append(f"rack:{b.dc}/{b.rack}:down")
        p.append(f"{dst}:down")
        return tuple(p)

    def capacity(self, link: str) -> float:
        """Bytes/s one link carries (goodput)."""
        kind, _, rest = link.partition(":")
        if kind == "dc":
            return self.dc_link_bps * self.efficiency
        if kind == "rack":
            return self.rack_link_bps * self.efficiency
        node, _, end = link.rpartition(":")
        if end in ("nvup", "nvdown"):
            return self.host_bps
        return self.nodes[node].nic_bps * self.efficiency
