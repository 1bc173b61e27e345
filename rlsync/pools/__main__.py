"""`python -m rlsync.pools join|list|leave`: attach rollout pools to a running job from another terminal.

    python -m rlsync.pools join  --job RUN_DIR --pool spot2 --size 2 [--dc dc0 --rack rack1] [--resources '{"pool_node": 1}']
    python -m rlsync.pools list  [--job RUN_DIR]
    python -m rlsync.pools leave [--job RUN_DIR] --pool spot2

The job writes `RUN_DIR/job.json` (mode 0600: Ray address, namespace, hub address and token, its
config) when it starts and removes it when it ends. `join` connects to that Ray cluster, starts
`--size` named detached `RolloutWorker` actors in the job's namespace, has each join the hub and
fetch `latest` (from peers when they hold it), registers them in the job's pool registry, and exits;
the driver adopts them within about a second and hands them prompts. `leave` asks the driver to let
the pool go (each worker finishes its call, then leaves the hub with notice) and waits until it has.
Without `--job`: $RLSYNC_JOB, else the one running job started from the current directory (or whose run dir it
is); never a machine-wide "last job", which on a shared machine is someone else's.
"""

from __future__ import annotations

import argparse
import sys
import time

from rlsync.hub import positive_float, positive_int
from rlsync.hub.logs import setup_logging


def _connect(job: dict):
    from rlsync.pool.attach import use_ray_client_auth

    use_ray_client_auth(job)  # before Ray reads its config: Ray's token auth as the job file says
    import ray

    if not ray.is_initialized():
        ray.init(address=job["ray_address"], namespace=job["namespace"], log_to_driver=False)
    try:
        return ray.get_actor("registry", namespace=job["namespace"])
    except ValueError:
        raise SystemExit(f"job {job['run_dir']}: its pool registry is gone (has the job ended?)") from None


def cmd_join(a, job: dict) -> int:
    import ray
    from omegaconf import OmegaConf

    from rlsync.config.compose import hub_access, rollout_kwargs, to_config
    from rlsync.pool.policies import PoolConfig
    from rlsync.pool.pool_set import rollout_group

    registry = _connect(job)
    view = ray.get(registry.snapshot.remote(), timeout=30)["pools"]
    if a.pool in view and not view[a.pool]["attached"]:
        raise SystemExit(f"pool {a.pool!r} is one of the job's configured pools; pick another name")
    cfg = to_config(OmegaConf.create(job["config"]))
    template = next(iter(cfg.pools.values()))
    pool = PoolConfig(size=a.size, engine=template.engine)
    pool.location.dc, pool.location.rack, pool.location.host = a.dc, a.rack, a.host
    taken = [int(k.rsplit("-", 1)[1]) for k in view.get(a.pool, {}).get("workers", {})]
    hub = hub_access(cfg, job["hub_address"], job["hub_token"])
    group = rollout_group(a.pool, pool, rollout_kwargs(cfg, hub), num_cpus=cfg.ray.actor_num_cpus,
                          first_index=max(taken, default=-1) + 1, resources=a.resources)
    keys = [group.add(namespace=job["namespace"], detached=True) for _ in range(a.size)]
    refs = {group.members[k].join_run.remote(): k for k in keys}
    print(f"starting {len(keys)} workers in pool {a.pool} ({a.dc}/{a.rack}) for job {job['run_dir']}", flush=True)
    infos = []
    try:
        for info in ray.get(list(refs), timeout=a.timeout):
            srcs = ", ".join(f"{w} {n / 1e6:.2f} MB" for w, n in info.bytes_by_source.items()) or "nothing yet"
            print(f"  {info.worker}: hub worker {info.wid}, fetched v{info.version} from {srcs}", flush=True)
            infos.append(info)
    except Exception as e:
        for h in group.members.values():
            ray.kill(h, no_restart=True)
        raise SystemExit(f"workers failed to join: {e}") from e
    loc = {"dc": a.dc, "rack": a.rack, "host": a.host}
    ray.get(registry.attach.remote(a.pool, [{"worker": i.worker, "wid": i.wid, "dc": i.dc} for i in infos],
                                   loc), timeout=30)
    end = time.monotonic() + a.timeout
    while time.monotonic() < end:  # until the driver adopted them
        w = ray.get(registry.snapshot.remote(), timeout=30)["pools"].get(a.pool, {}).get("workers", {})
        if all(k in w for k in keys):
            print(f"pool {a.pool}: {len(keys)} workers generating for the job", flush=True)
            return 0
        time.sleep(0.5)
    print(f"pool {a.pool}: registered, but the driver has not adopted it yet", file=sys.stderr)
    return 1


def cmd_list(a, job: dict) -> int:
    import ray

    snap = ray.get(_connect(job).snapshot.remote(), timeout=30)
    print(f"job {job['run_dir']} (hub {job['hub_address']}, driver pid {job['driver_pid']})")
    print(f"{'pool':12s} {'kind':9s} {'policy':9s} {'dc/rack':16s} {'workers':>7s}  states")
    for name, p in sorted(snap["pools"].items()):
        states = {}
        for s in p["workers"].values():
            states[s] = states.get(s, 0) + 1
        st = " ".join(f"{k}={v}" for k, v in sorted(states.items())) or "-"
        print(f"{name:12s} {'attached' if p['attached'] else 'config':9s} {p['policy']:9s} "
              f"{p['dc'] + '/' + p['rack']:16s} {len(p['workers']):7d}  {st}")
    for name in snap["pending_attach"]:
        print(f"{name:12s} attaching (the driver has not picked it up yet)")
    return 0


def cmd_leave(a, job: dict) -> int:
    import ray

    registry = _connect(job)
    view = ray.get(registry.snapshot.remote(), timeout=30)["pools"]
    if a.pool not in view:
        raise SystemExit(f"no pool {a.pool!r} in job {job['run_dir']}; pools: {', '.join(sorted(view)) or 'none'}")
    if not view[a.pool]["attached"]:
        raise SystemExit(f"pool {a.pool!r} is one of the job's configured pools; only attached pools can leave")
    ray.get(registry.request_leave.remote(a.pool), timeout=30)
    end = time.monotonic() + a.timeout
    while time.monotonic() < end:
        if a.pool not in ray.get(registry.snapshot.remote(), timeout=30)["pools"]:
            print(f"pool {a.pool}: left the job", flush=True)
            return 0
        time.sleep(0.5)
    for k in view[a.pool]["workers"]:  # the driver did not let it go in time: end the actors ourselves
        try:
            ray.kill(ray.get_actor(k, namespace=job["namespace"]), no_restart=True)
        except ValueError:
            pass
    print(f"pool {a.pool}: the driver did not release it in {a.timeout:.0f}s; its actors were killed", file=sys.stderr)
    return 1


def _resources(text: str) -> dict[str, float]:
    import json

    try:
        r = json.loads(text)
        if isinstance(r, dict) and all(isinstance(k, str) and isinstance(v, (int, float)) and v > 0 for k, v in r.items()):
            return {k: float(v) for k, v in r.items()}
    except json.JSONDecodeError:
        pass
    raise argparse.ArgumentTypeError(f"{text!r}: want a JSON object of resource name -> positive amount")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsync.pools", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    j = sub.add_parser("join", help="start a pool of rollout workers and attach it to a running job")
    j.add_argument("--pool", required=True, help="name of the new pool (not one of the job's configured pools)")
    j.add_argument("--size", type=positive_int, default=1, help="rollout workers to start")
    j.add_argument("--dc", default="dc0", help="DC label the workers join the hub with")
    j.add_argument("--rack", default="rack0", help="rack label")
    j.add_argument("--host", default="", help="host label (default: this machine's hostname)")
    j.add_argument("--resources", type=_resources, default=None, metavar="JSON",
                   help='Ray custom resources each worker asks for, e.g. \'{"pool_node": 1}\': the workers start only '
                        'on nodes started with them (`ray start --resources=...`)')
    lv = sub.add_parser("leave", help="let an attached pool go (each worker leaves the hub with notice)")
    lv.add_argument("--pool", required=True)
    ls = sub.add_parser("list", help="the job's pools and their workers' states")
    for s in (j, lv, ls):
        s.add_argument("--job", default=None, help="the job's run dir (default: $RLSYNC_JOB, else the one job started from this directory)")
        s.add_argument("--timeout", type=positive_float, default=180.0,
                       help="seconds to wait for the workers / the driver")
    a = p.parse_args(argv)
    setup_logging("WARNING")
    from rlsync.pool.attach import read_job_file

    try:
        job = read_job_file(a.job)
    except (FileNotFoundError, PermissionError) as e:
        print(f"python -m rlsync.pools {a.cmd}: error: argument --job: {e}", file=sys.stderr)
        return 2
    return {"join": cmd_join, "list": cmd_list, "leave": cmd_leave}[a.cmd](a, job)


if __name__ == "__main__":
    sys.exit(main())
