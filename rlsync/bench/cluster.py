"""A benchmark cluster on an emulated topology: hosts, an agent per host, hubs, models, and output.

    with BenchCluster(spec, BenchConfig(model_mib=64)) as c:
        rl = c.start_hub("rlsync", planner=c.cfg.rlsync_planner())     # in the `hub` host
        c.join_all("rlsync", rl, c.readers + ["trainer"])
        r = c.rlsync_round("rlsync", c.readers[:4])                     # publish, N fetch at once

Conventions every scenario shares:
- host `hub` runs the hub servers (the control plane) and nothing else; host `trainer` is the
  source; every other host is a reader. Location labels are the topology's (dc, rack, host).
- the model lives in every process before timing (allocated and touched); the trainer's weights
  change (a stand-in optimizer step) before each version, and every reader's bytes are checked
  against the trainer's digest after every round (`exact`).
- times are CLOCK_MONOTONIC read inside the agents; a round starts at one shared instant `go`.
"""
from __future__ import annotations

import json
import logging
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .agent.protocol import GO_DELAY_S, Agent, close_agents, start_agents
from .topo import Topology, TopologySpec, check_support, measure_rate

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class BenchConfig:
    model_mib: float = 64.0
    """Model size. 64 MiB at 250 Mbit/s takes as long as the issue's 256 MiB at 1 Gbit/s (2.15 s)."""
    nic_rate: str = "250mbit"
    """Every host's NIC rate, each direction."""
    chunk_mib: float = 0.5
    """rlsync transfer unit; a relay forwards a unit once it has it, so this is the pipeline grain:
    each relay hop adds one unit's link time (17 ms at 250 Mbit/s), so 8 hops add ~6% to a 64 MiB
    transfer (at the issue's 256 MiB / 1 Gbit/s scale this is a 2 MiB unit)."""
    bucket_mib: float = 16.0
    """Flat-bucket size of the model (gloo broadcasts bucket by bucket)."""
    streams: int = 1
    """rlsync data-plane streams per source (DataPlaneConfig.streams). One: a single TCP flow fills
    a shaped NIC (243 of 250 Mbit/s), and k streams carry every k-th unit each, so a unit takes k
    unit-times to land and every relay hop adds k unit-times of pipeline fill (fanout, 8 readers:
    2.79 s with 2 streams, 2.56 s with 1). Several streams pay off only where one flow is
    CPU-bound (loopback, fast NICs: docs/performance.md)."""
    transport: str = "auto"
    """'tcp' (native), 'tcp-py', or 'auto': tcp if built, else tcp-py. Never shm: it bypasses the links."""
    fanout_cap: int = 1
    """rlsync's planner fan-out cap: 1 turns a crowd of readers into a pipelined relay chain."""
    io_timeout_s: float = 120.0
    """Data-plane idle timeout. Many flows on one slow shaped link can starve one for > 30 s (the
    default), which would fail the per-worker-pull baseline rather than measure it."""
    seed: int = 0

    def rlsync_planner(self) -> dict:
        return {"fanout_cap": self.fanout_cap, "max_sources": 1}


@dataclass(slots=True)
class Round:
    system: str
    readers: int
    seconds: float
    """Wall time: from the shared start instant to the last reader done."""
    per_reader_s: dict[str, float]
    """Each reader's own time from the start instant to done (its stall)."""
    exact: bool
    sources: dict[str, dict] = field(default_factory=dict)


class BenchCluster:
    def __init__(self, spec: TopologySpec, cfg: BenchConfig) -> None:
        self.spec, self.cfg = spec, cfg
        self.topo = Topology(spec)
        self.agents: dict[str, Agent] = {}
        self.hubs: dict[str, dict] = {}
        self.version = 0
        self.trainer_digest = ""
        self.transport = cfg.transport
        self.link_check: dict = {}

    @property
    def readers(self) -> list[str]:
        return [h.name for h in self.spec.hosts if h.name not in ("hub", "trainer")]

    def __enter__(self) -> "BenchCluster":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        self.topo.build()
        t0 = time.monotonic()
        hosts = [h.name for h in self.spec.hosts]
        self.agents = start_agents(self.topo, hosts, env={"GLOO_SOCKET_IFNAME": "eth0"})
        log.info("%d agents up in %.1fs", len(self.agents), time.monotonic() - t0)
        if self.transport == "auto":
            have = self.agents["trainer"].call("transports")
            self.transport = "tcp" if "tcp" in have else "tcp-py"
            if self.transport != "tcp":
                log.warning("native tcp transport not available (%s): using tcp-py", have)
        futs = [self.agents[h].submit("model", buf="w", mib=self.cfg.model_mib, seed=self.cfg.seed,
                                      zero=h != "trainer", bucket_mib=self.cfg.bucket_mib)
                for h in hosts if h != "hub"]
        info = [f.result(300) for f in futs]
        self.nbytes = info[0]["nbytes"]
        self.trainer_digest = info[0]["digest"]

    def close(self) -> None:
        workers = [a for h, a in self.agents.items() if h != "hub"]
        close_agents(workers)
        close_agents([a for h, a in self.agents.items() if h == "hub"])
        self.topo.teardown()

    # ---------------------------------------------------------------- links
    def check_links(self, pairs: list[tuple[str, str]], nbytes: int) -> dict:
        """Measure one TCP stream per pair, to record that the shaping holds (goodput, Mbit/s)."""
        for a, b in pairs:
            self.link_check[f"{a}->{b}"] = round(measure_rate(self.topo, a, b, nbytes) / 1e6, 1)
        return self.link_check

    def tx_bytes(self) -> int:
        """Bytes sent so far by every host's NIC (from the kernel's counters)."""
        total = 0
        for h in self.agents:
            r = self.topo.run(h, ["ip", "-j", "-s", "link", "show", "eth0"])
            total += json.loads(r.stdout)[0]["stats64"]["tx"]["bytes"]
        return total

    def wait_quiet(self, window_s: float = 0.5, max_s: float = 60.0, slack: int = 256 << 10) -> float:
        """Wait until the links carry (almost) nothing, so a round never shares them with the tail of
        the previous one (Ray's object manager, for one, keeps pushing after `get` returns)."""
        t0 = time.monotonic()
        last = self.tx_bytes()
        while time.monotonic() - t0 < max_s:
            time.sleep(window_s)
            now = self.tx_bytes()
            if now - last < slack:
                break
            last = now
        return time.monotonic() - t0

    # ---------------------------------------------------------------- rlsync and trainer-only p2p
    def start_hub(self, name: str, planner: dict, only_hosts: list[str] | None = None,
                  delta: dict | None = None) -> dict:
        h = self.agents["hub"].call("hub_start", name=name, ip=self.topo.ip("hub"), planner=planner,
                                    only_hosts=only_hosts, delta=delta)
        self.hubs[name] = h
        return h

    def join_args(self, client: str, host: str) -> dict:
        hub, hs = self.hubs[client], self.topo.host(host)
        return {"client": client, "address": hub["address"], "token": hub["token"], "ip": self.topo.ip(host),
                "location": {"dc": hs.dc, "rack": hs.rack, "host": host}, "transport": self.transport,
                "streams": self.cfg.streams, "chunk_mib": self.cfg.chunk_mib,
                "io_timeout_s": self.cfg.io_timeout_s, "name": host}

    def join_all(self, client: str, hosts: list[str]) -> None:
        futs = [self.agents[h].submit("join", **self.join_args(client, h)) for h in hosts]
        for f in futs:
            f.result(60)

    def new_version(self) -> int:
        """The trainer's optimizer step: its weights change; returns the next version number."""
        self.version += 1
        self.trainer_digest = self.agents["trainer"].call("mutate", buf="w", step=self.version)["digest"]
        return self.version

    def publish(self, client: str, version: int) -> float:
        r = self.agents["trainer"].call("publish", client=client, model="policy", version=version, buf="w")
        return r["t1"]

    def release(self, client: str, version: int, host: str = "trainer") -> dict:
        return self.agents[host].call("release", client=client, model="policy", version=version)

    def fetch_all(self, client: str, readers: list[str], go: float | None = None,
                  joining: bool = False) -> tuple[float, dict[str, dict]]:
        go = go if go is not None else time.monotonic() + GO_DELAY_S
        futs = {}
        for h in readers:
            fetch = {"client": client, "model": "policy", "buf": "w"}
            if joining:
                futs[h] = self.agents[h].submit("join_and_fetch", join=self.join_args(client, h), fetch=fetch, at=go)
            else:
                futs[h] = self.agents[h].submit("fetch", **fetch, at=go)
        return go, {h: f.result(600) for h, f in futs.items()}

    def round_from(self, system: str, go: float, res: dict[str, dict]) -> Round:
        per = {h: r["t1"] - go for h, r in res.items()}
        exact = all(r.get("digest") == self.trainer_digest for r in res.values())
        if not exact:
            log.error("%s: a reader's bytes differ from the trainer's", system)
        return Round(system, len(res), max(per.values()), per, exact,
                     {h: r.get("bytes_by_source", {}) for h, r in res.items()})

    def hub_round(self, client: str, system: str, readers: list[str]) -> Round:
        """Publish a fresh version through hub `client`; `readers` fetch it at once; trainer releases."""
        v = self.new_version()
        self.publish(client, v)
        go, res = self.fetch_all(client, readers)
        self.release(client, v)
        return self.round_from(system, go, res)

    # ---------------------------------------------------------------- gloo broadcast
    def gloo_init(self, groups: dict[str, list[str]], port: int = 29500) -> dict[str, list[str]]:
        """One static group: trainer is rank 0, then `self.readers`; sub-groups named by `groups`."""
        members = ["trainer"] + self.readers
        rank = {h: i for i, h in enumerate(members)}
        ranks = {k: sorted(rank[h] for h in ["trainer"] + v) for k, v in groups.items()}
        futs = [self.agents[h].submit("gloo_init", master=self.topo.ip("trainer"), port=port, rank=rank[h],
                                      world=len(members), groups=ranks) for h in members]
        for f in futs:
            f.result(300)
        self.gloo_groups = groups
        return groups

    def gloo_round(self, group: str, go: float | None = None, new_version: bool = True) -> tuple[Round, dict]:
        if new_version:
            self.new_version()
        members = ["trainer"] + self.gloo_groups[group]
        go = go if go is not None else time.monotonic() + GO_DELAY_S
        futs = {h: self.agents[h].submit("gloo_bcast", buf="w", group=group, at=go) for h in members}
        res = {h: f.result(600) for h, f in futs.items()}
        trainer = res.pop("trainer")
        return self.round_from("gloo broadcast", go, res), trainer


# ---------------------------------------------------------------- output shared by the scenarios
def machine_info() -> dict:
    return {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
            "loadavg": os.getloadavg()}


def write_outputs(res: dict, json_path: Path | None, plot) -> None:
    """Write the JSON (raw figures + ratios) and, beside it, the PNG that `plot(res, path)` draws."""
    if json_path is None:
        return
    json_path.parent.mkdir(parents=True, exist_ok=True)
    png = json_path.with_suffix(".png")
    try:
        import matplotlib
        matplotlib.use("Agg")
        plot(res, png)
        res["plot"] = str(png)
    except Exception as e:  # noqa: BLE001 - a plot failure must not lose the figures
        log.warning("plot failed: %s", e)
    json_path.write_text(json.dumps(res, indent=2, default=_json_default))
    log.info("wrote %s and %s", json_path, png)


def _json_default(o):
    if hasattr(o, "__dataclass_fields__"):
        return asdict(o)
    raise TypeError(f"cannot serialize {type(o).__name__}")


def skip_reason() -> str | None:
    return check_support()


def command_line() -> str:
    return "python -m rlsync.bench " + " ".join(sys.argv[1:])
