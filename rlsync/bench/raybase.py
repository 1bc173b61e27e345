"""Ray's object store across the emulated hosts (storage's shape): the trainer `put`s, readers `get`.

Ray's object store is per node, so to run across the shaped links every namespace gets its own
Ray node: `ray start --head` in the `hub` namespace, `ray start --address` in every other one, each
with `--node-ip-address` = its namespace address, a `host_<name>` custom resource, and a private
`--temp-dir` (so nobody else's `ray.init()` on this machine can discover this cluster) and its own
auth token (RAY_AUTH_TOKEN; the user's ~/.ray is not touched); each node has its own temp dir
(they share this machine's file system, hence its unix-socket paths). The
driver runs in the hub's agent. A trainer actor pinned to `host_trainer` holds the model's flat
buckets; each round it `ray.put`s them (storage's push, the copy the paper calls the storage tax)
and reader actors pinned to their hosts `ray.get` them (Ray's object manager pulls the chunks over
the links, from whichever node already has a copy) and copy them into their own buffers. Timed:
from the shared start (put included) to the last reader's copy done. One untimed warm-up round.
The driver's and actors' code is the agent's `cmd_ray_store.py`; this is the benchmark's side.
Teardown: the topology kills every process in its namespaces (never `ray stop`, which would stop
other users' Ray on this machine).
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import time

from .agent.protocol import GO_DELAY_S

log = logging.getLogger(__name__)


class RayObjectStore:
    def __init__(self, cluster) -> None:
        self.c = cluster
        self.tmp = tempfile.mkdtemp(prefix="rlsync-ray-")
        self.step = 1000
        import secrets
        self.token = secrets.token_hex(32)  # this cluster's own token; ~/.ray is left alone

    def _ray_start(self, host: str, *args: str) -> subprocess.Popen:
        ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
        # Every node shares this machine's file system: each needs a temp dir (unix sockets) of its own.
        tmp = os.path.join(self.tmp, host)
        argv = [ray_bin, "start", "--node-ip-address", self.c.topo.ip(host), "--num-cpus", "1",
                "--resources", f'{{"host_{host}": 1}}', "--object-store-memory", str(256 << 20),
                "--disable-usage-stats", "--temp-dir", tmp, *args]
        env = dict(os.environ, RAY_TMPDIR=self.tmp, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token)
        return self.c.topo.popen(host, argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)

    def start(self) -> str | None:
        """None when running; otherwise why this baseline does not run here."""
        hub_ip = self.c.topo.ip("hub")
        t0 = time.monotonic()
        p = self._ray_start("hub", "--head", "--port", "6379", "--include-dashboard=false")
        out, _ = p.communicate(timeout=180)
        if p.returncode != 0:
            return f"ray start --head failed in the hub's namespace: {out.strip().splitlines()[-3:]}"
        hosts = ["trainer"] + self.c.readers
        # Two at a time: `ray start` gives a raylet 30 s (hard-coded) to register, which nine
        # starting at once on two loaded cores can miss.
        for i in range(0, len(hosts), 2):
            procs = {h: self._ray_start(h, "--address", f"{hub_ip}:6379") for h in hosts[i:i + 2]}
            for h, p in procs.items():
                out, _ = p.communicate(timeout=300)
                if p.returncode != 0:
                    return f"ray start --address failed in {h}'s namespace: {out.strip().splitlines()[-3:]}"
        try:
            info = self.c.agents["hub"].call("ray_driver", timeout=600, address=f"{hub_ip}:6379", hosts=hosts,
                                             mib=self.c.cfg.model_mib, seed=self.c.cfg.seed,
                                             bucket_mib=self.c.cfg.bucket_mib, token=self.token)
        except Exception as e:  # noqa: BLE001 - reported as the reason this baseline did not run
            return f"Ray driver/actors failed across namespaces: {str(e).splitlines()[0]}"
        log.info("ray: %d nodes up in %.1fs", info["nodes"], time.monotonic() - t0)
        return None

    def round(self, readers: list[str]):
        self.step += 1
        go = time.monotonic() + GO_DELAY_S
        r = self.c.agents["hub"].call("ray_round", readers=readers, step=self.step, go=go)
        res = {h: {"t1": x["t1"], "digest": x["digest"]} for h, x in r["readers"].items()}
        saved, self.c.trainer_digest = self.c.trainer_digest, r["trainer_digest"]
        try:
            return self.c.round_from("ray object store", go, res)
        finally:
            self.c.trainer_digest = saved

    def close(self) -> None:
        pass  # the topology's teardown kills every Ray process in its namespaces
