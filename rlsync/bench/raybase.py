"""Ray's object store across the emulated hosts (storage's shape): the trainer `put`s, readers `get`.

Not wired yet, and the scenario output says so. What it takes, for whoever finishes it: Ray's
object store is per node, so running it *across* the shaped links needs one Ray node per network
namespace — `ray start --head --node-ip-address <hub ip>` in the hub's namespace and
`ray start --address <hub ip>:6379 --node-ip-address <own ip> --resources '{"host_<name>": 1}'` in
every other one (a raylet, an object store and agents per host: ~0.3 GB and several seconds each on
this 2-core machine), then a trainer actor pinned to `host_trainer` that `ray.put`s the flat
buckets and reader actors pinned to their hosts that `ray.get` and copy into their buffers.
A single-node Ray (the easy set-up) would move every byte through one namespace's shared memory
and never touch the shaped links, so it would not be a like-for-like figure: we report no number
rather than that one.
"""
from __future__ import annotations

NOT_WIRED = ("not run: Ray's object store is per node, so across the shaped links it needs a Ray "
             "node (raylet + object store) in every namespace; that set-up is not wired yet, and "
             "single-node Ray would bypass the links (see rlsync/bench/raybase.py)")


class RayObjectStore:
    def __init__(self, cluster) -> None:
        self.c = cluster

    def start(self) -> str | None:
        """None when running; otherwise why this baseline does not run here."""
        return NOT_WIRED

    def round(self, readers):
        raise NotImplementedError(NOT_WIRED)

    def close(self) -> None:
        pass
