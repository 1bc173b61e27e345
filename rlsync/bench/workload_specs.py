"""What the workload scenarios share (`standalone`/`elastic`/`crossdc` and their `--delta` and
`--federated` variants): the crossdc topology, the trainer-only baseline's planner, and the head of
every result record.
"""
from __future__ import annotations

from .cluster import BenchCluster, BenchConfig, command_line, machine_info
from .topo import TopologySpec, parse_rate

P2P_PLANNER = {"fanout_cap": 1 << 20, "max_sources": 1}
"""trainer-only point-to-point (UCX's shape): every reader pulls from the trainer, no fan-out limit."""


def crossdc_spec(rollouts: int, nic_rate: str, dc_ratio: float) -> TopologySpec:
    half = (rollouts + 1) // 2
    remote = {"r0": [f"ro{i}" for i in range(half)], "r1": [f"ro{i}" for i in range(half, rollouts)]}
    return TopologySpec.from_dict({
        "nic_rate": nic_rate, "dc_link_rate": int(parse_rate(nic_rate) * dc_ratio),
        "dcs": {"dc0": {"r0": ["hub", "trainer"]}, "dc1": {k: v for k, v in remote.items() if v}}})


def base_record(name: str, c: BenchCluster, cfg: BenchConfig) -> dict:
    """The head of every workload's JSON: its config, the ideal one-transfer time, machine, command."""
    return {"scenario": name,
            "config": {"model_bytes": c.nbytes, "nic_rate": cfg.nic_rate, "chunk_mib": cfg.chunk_mib,
                       "streams": cfg.streams, "transport": c.transport, "rlsync_planner": cfg.rlsync_planner()},
            "ideal_one_transfer_s": round(c.nbytes * 8 / parse_rate(cfg.nic_rate), 3),
            "machine": machine_info(), "command": command_line()}
