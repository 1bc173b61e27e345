"""Delta objects as the hub sees them, and the choice between a full fetch and a chain of deltas.
Pure logic, no I/O.

A delta (v_base -> v) of a shard is published as version v of the companion model `NAME@delta`
(`delta_model`), one uint8 tensor per transfer unit of v named `base{v_base}.u{i}` (the frames of
`hub/delta/codec.py`). So a delta is an ordinary immutable version to the rest of the hub: the same
commit, manifest (tiny deltas packed into one unit, large ones chunked), replicas, relays, fan-out
cap, cross-DC rule, retention and re-plan apply to it unchanged — a delta crosses a DC link once
and fans out from the replicas that hold it, as a full version does.

`choose` compares, for one reader, the time to pull v in full from the best tier that holds it
against pulling the chain of deltas from the version it holds (each from its best tier) plus
decoding it, with the configured link rates.

    >>> cfg = DeltaConfig()
    >>> choose(cfg, full_bytes=1000, full_tier=3, chain=[(30, 3)], model_bytes=1000)[0]
    'delta'
    >>> choose(cfg, full_bytes=1000, full_tier=0, chain=[(900, 3)], model_bytes=1000)[0]
    'full'
"""
from __future__ import annotations

from dataclasses import dataclass

from rlsync.hub import errors as E
from rlsync.hub.model.manifest import Manifest
from rlsync.hub.model.replica_id import ReplicaId
from rlsync.hub.model.names import delta_model
from rlsync.hub.model.shard import Shard

def tensor_name(base: int, unit: int) -> str:
    return f"base{base}.u{unit}"


def delta_base(manifest: Manifest) -> int:
    """The base version a delta object's manifest was made against (from its tensor names)."""
    try:
        bases = {int(t.name.split(".", 1)[0].removeprefix("base")) for t in manifest.tensors}
        units = [int(t.name.split(".u", 1)[1]) for t in manifest.tensors]
    except (ValueError, IndexError):
        raise E.ManifestMismatchError("not a delta object: tensors must be named base<v>.u<i>") from None
    if len(bases) != 1 or units != list(range(len(units))) or any(t.dtype != "uint8" for t in manifest.tensors):
        raise E.ManifestMismatchError("not a delta object: one base, uint8 frames u0..un in order")
    return bases.pop()


def compact_wire(m: Manifest) -> dict:
    """A delta object's manifest without what its naming rule implies (tensor names, dtype, shape):
    {"b": base, "n": [frame bytes], "u": units}. A unit made of whole frames in order (a packed unit
    of small frames: every frame of a small model's delta) is [checksum, first frame, count] — its
    segments and size follow from "n"; any other is [nbytes, checksum, segments] as in
    `Manifest.to_wire`."""
    sizes = [t.nbytes for t in m.tensors]
    units = []
    for u in m.units:
        i0 = u.segments[0][0]
        whole = all(ti == i0 + k and off == 0 and ln == sizes[ti] for k, (ti, off, ln) in enumerate(u.segments))
        units.append([u.checksum, i0, len(u.segments)] if whole else [u.nbytes, u.checksum, [list(g) for g in u.segments]])
    return {"b": delta_base(m), "n": sizes, "u": units}


def from_compact_wire(d: dict) -> dict:
    """`compact_wire`'s inverse, as `Manifest.to_wire` (for `Manifest.from_wire`, which validates it)."""
    try:
        base, sizes = int(d["b"]), [int(n) for n in d["n"]]
        units = []
        for u in d["u"]:
            if isinstance(u[2], int):  # whole frames i0 .. i0 + count - 1
                checksum, i0, count = int(u[0]), int(u[1]), int(u[2])
                if not (0 <= i0 and 0 < count and i0 + count <= len(sizes)):
                    raise ValueError(f"frames {i0}..{i0 + count - 1} of {len(sizes)}")
                units.append([sum(sizes[i0:i0 + count]), checksum, [[i, 0, sizes[i]] for i in range(i0, i0 + count)]])
            else:
                units.append(u)
        return {"t": [[tensor_name(base, i), "uint8", [n], n] for i, n in enumerate(sizes)], "u": units}
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise E.ManifestMismatchError(f"malformed compact delta manifest: {e}") from None


def compact_plan(plan: dict, model: str, shard: Shard) -> dict:
    """The first delta's plan without what the reader knows (`expand_plan` puts it back): its
    version (the chain's first), `held` (false), and each source's replica id when it is the source's
    live replica of that delta object."""
    ver = plan.pop("version")
    plan.pop("held")
    for src in plan["sources"]:
        if src["replica"] == ReplicaId(src["worker"], delta_model(model), ver, shard.key).wire:
            del src["replica"]
    return plan


def expand_plan(plan: dict, model: str, version: int, shard: Shard) -> dict:
    """`compact_plan`'s inverse (`version`: the chain's first)."""
    sources = [{**src, "replica": src.get("replica") or ReplicaId(str(src.get("worker")), delta_model(model), version,
                                                                   shard.key).wire} for src in plan.get("sources", [])]
    return {**plan, "version": version, "held": False, "sources": sources}


@dataclass(kw_only=True, slots=True)
class DeltaConfig:
    tier_gbps: tuple[float, float, float, float] = (80.0, 25.0, 10.0, 1.0)
    """Assumed link rate (Gbit/s) from a source at each distance tier: same host, rack, DC, another DC.
    Only their ratios matter to the choice; set them to the deployment's."""
    decode_gbytes_s: float = 0.3
    """Delta decode rate per byte of the full version (0.3 GB/s measured on SmolLM2-135M at load ~3 on
    this 2-core machine, one thread: docs/deltas.md)."""
    max_chain: int = 8
    """Longest chain of deltas a reader is offered; a reader further behind fetches in full."""
    retain_chain: int = 4
    """The newest this-many deltas of a model stay retained: a seed worker following `latest` keeps
    them, and the last copy of one is offload-seeded rather than dropped, so a late joiner up to this
    many versions behind finds a chain."""
    mode: str = "auto"
    """'auto': choose by the estimate; 'always': a chain whenever one exists (tests, and measuring the
    delta path on updates where it does not pay); 'never': always full."""

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "always", "never"):
            raise ValueError(f"DeltaConfig.mode must be auto, always or never, got {self.mode!r}")
        if len(self.tier_gbps) != 4 or min(self.tier_gbps) <= 0 or self.decode_gbytes_s <= 0 or self.max_chain < 1 \
                or self.retain_chain < 1:
            raise ValueError("DeltaConfig: four positive tier rates, a positive decode rate, max_chain and "
                             "retain_chain >= 1")


def choose(cfg: DeltaConfig, *, full_bytes: int, full_tier: int | None, chain: list[tuple[int, int]],
           model_bytes: int) -> tuple[str, float, float]:
    """('delta' | 'full', estimated full seconds, estimated delta seconds).

    `chain`: (delta bytes, best source tier) per delta, oldest first; empty = no usable chain.
    `full_tier`: best tier holding v (None: nobody can serve it in full now)."""
    def secs(nbytes: int, tier: int) -> float:
        return nbytes * 8 / (cfg.tier_gbps[tier] * 1e9)

    t_full = float("inf") if full_tier is None else secs(full_bytes, full_tier)
    if not chain or len(chain) > cfg.max_chain or cfg.mode == "never":
        return "full", t_full, float("inf")
    t_delta = sum(secs(b, t) for b, t in chain) + len(chain) * model_bytes / (cfg.decode_gbytes_s * 1e9)
    return ("delta" if cfg.mode == "always" or t_delta < t_full else "full"), t_full, t_delta
