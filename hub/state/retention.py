"""Retention and release: every decision about keeping or letting go of a version. Pure logic, no I/O.

A version is *retained* while someone may still need it: it is among the `retain_last` newest
committed versions of its model, or an in-progress fetch or a reader group is pinned to it. The
hub's state (hub/state/releases.py, state_versions.py) gathers a snapshot of one replica or model
and applies what these functions return; they never read or change the hub's tables.

- `decide_release(cfg, view)`: one evaluation of a release of one replica. The origin's copy (the
  publisher's) counts as "the last" until `min_full_copies` (default 2) other full copies exist (or
  it keeps an offload seed), so one `kill -9` of a reader cannot lose a retained version. The last
  full replica of a retained shard never just goes: it WAITs for a relay (a reader mid-fetch becomes a full
  replica), or, when its holder is leaving with notice, HANDs OFF to a seed worker, or asks its
  holder to SEED (copy to host memory and register that copy) first. A replica still being read
  WAITs for its readers to drain. An offload seed that is the last copy is REFUSEd.
- `is_retained`, `drop_seed`: which versions stay fetchable, which seeds may be dropped (an offload
  seed also once `min_full_copies` live copies exist: it was kept only until then).
- `choose_seed_worker`: who takes a hand-off (the nearest seed worker not holding it already).
- `forget_below`, `forgettable`: committed versions whose manifests the hub may forget (KEEP_OLD).

    >>> cfg = RetentionConfig()
    >>> decide_release(cfg, ReleaseView(retained=True, other_full=0, relays=1)).action
    <Action.WAIT: 'wait'>
    >>> decide_release(cfg, ReleaseView(retained=True, other_full=0, relays=0, leaving=True,
    ...                                 seed_candidate="w9"))
    ReleaseDecision(action=<Action.HANDOFF: 'handoff'>, target='w9', ask=True)
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable

from rlsync.hub.model.location import Location


@dataclass(kw_only=True, slots=True)
class RetentionConfig:
    retain_last: int = 1
    """How many of a model's newest committed versions stay retained (fetchable by number)."""
    prefer_seed: bool = False
    """Seed at once even when a relay is in progress (faster release, costs a host copy)."""
    min_full_copies: int = 2
    """The origin's copy of a retained version (its publisher's) is released only when at least this
    many OTHER live full copies exist, or the origin keeps an offload seed of it; otherwise the release
    waits for a relay, or seeds (prefer_seed, or no relay), as for the last copy. A worker leaving with
    notice cannot stay: it hands off its last copy (one other copy suffices), as before. 2: one
    `kill -9` of a reader never loses a retained version (with 1, the trainer let go once one reader
    held it, and that reader's death lost it: docs/benchmarks.md). Must be an int >= 1. The seed it
    keeps is a backup: read only when no full live copy can serve (planner rule 5), and dropped once
    this many full live copies exist beside it (`drop_seed`)."""


KEEP_OLD = 64
"""Manifests of this many committed versions below the retained ones are kept (in memory and in the
journal); older versions nobody holds, pins or fetches are forgotten, their numbers stay reserved.
Without it the hub grew by every version's manifest for ever (`python -m rlsync.bench soak`)."""


class Decision(str, enum.Enum):
    """What the last-copy rule alone says (`RetentionPolicy.decide`)."""
    RELEASE = "release"
    WAIT_RELAY = "wait_relay"
    SEED = "seed"


class Action(str, enum.Enum):
    """What the hub does with a replica being released, after one evaluation."""
    RELEASE = "release"
    """Drop it now: the hub forgets it, its holder may reuse the buffers."""
    WAIT = "wait"
    """Route no new read to it; evaluate again when its readers drained or its relay completed."""
    HANDOFF = "handoff"
    """Its holder is leaving: keep serving it while seed worker `target` fetches it; evaluate again."""
    SEED = "seed"
    """The holder must offload-seed a host copy first, then release again."""
    REFUSE = "refuse"
    """It is an offload seed and the last copy of a retained version: it cannot be released."""


@dataclass(frozen=True, slots=True)
class ReleaseView:
    """What the hub knows about one replica being released, at one instant."""
    retained: bool
    """Its version is retained (`is_retained`)."""
    other_full: int
    """Other full replicas of the same shard that are not themselves releasing."""
    relays: int
    """Replicas of the same shard still being fetched (each becomes full when its fetch completes)."""
    inflight: int = 0
    """Open fetches that read from this replica."""
    seed_slot: bool = False
    """The replica is itself an offload seed."""
    leaving: bool = False
    """Its holder is leaving with notice: the last copy goes to a seed worker, not to a host copy here."""
    handoff_target: str = ""
    """The live seed worker already asked to take it ('' if none, or if that one is gone)."""
    seed_candidate: str = ""
    """The seed worker that would take it now (`choose_seed_worker`); '' if none."""
    origin: bool = False
    """It is the publisher's copy: `min_full_copies` other full copies are needed before it goes."""
    own_seed: bool = False
    """Its holder keeps a full offload seed of the same shard (the origin's copy stays, in host memory)."""


@dataclass(frozen=True, slots=True)
class ReleaseDecision:
    action: Action
    target: str = ""
    """HANDOFF: the seed worker that takes the replica."""
    ask: bool = False
    """HANDOFF: `target` has not been asked yet (the hub queues the fetch task for it)."""


class RetentionPolicy:
    """The last-copy rule, with its config checked once."""

    def __init__(self, cfg: RetentionConfig) -> None:
        if cfg.retain_last < 1:
            raise ValueError("retain_last must be >= 1: the latest version is always retained")
        if type(cfg.min_full_copies) is not int or cfg.min_full_copies < 1:
            raise ValueError(f"min_full_copies must be an int >= 1, got {cfg.min_full_copies!r}")
        self.cfg = cfg

    def decide(self, *, retained: bool, other_full: int, relays: int) -> Decision:
        return _last_copy(self.cfg, retained, other_full, relays)

    def decide_release(self, view: ReleaseView) -> ReleaseDecision:
        return decide_release(self.cfg, view)


def decide_release(cfg: RetentionConfig, v: ReleaseView) -> ReleaseDecision:
    """One evaluation of a release (see the module docstring); the hub re-evaluates WAIT and HANDOFF."""
    # The origin's copy needs min_full_copies others, unless its holder keeps a host copy. A worker
    # leaving cannot stay: its last copy goes to a relay or seed worker (one other copy) as before.
    need = cfg.min_full_copies if v.origin and not v.own_seed and not v.leaving else 1
    d = _last_copy(cfg, v.retained, v.other_full, v.relays, need)
    if d is Decision.SEED and v.leaving:
        target = v.handoff_target or v.seed_candidate
        if target:
            return ReleaseDecision(Action.HANDOFF, target, ask=target != v.handoff_target)
    if d is Decision.SEED:
        return ReleaseDecision(Action.REFUSE if v.seed_slot else Action.SEED)
    if d is Decision.WAIT_RELAY or v.inflight > 0:
        return ReleaseDecision(Action.WAIT)
    return ReleaseDecision(Action.RELEASE)


def _last_copy(cfg: RetentionConfig, retained: bool, other_full: int, relays: int, need: int = 1) -> Decision:
    """`need`: other full copies that must exist for it to go (1, or `min_full_copies` for an origin's)."""
    if not retained or other_full >= need:
        return Decision.RELEASE
    if relays > 0 and not cfg.prefer_seed:
        return Decision.WAIT_RELAY
    return Decision.SEED


def is_retained(version: int, committed: list[int], retain_last: int, pinned: Iterable[int] = (),
                fetching: Iterable[int] = ()) -> bool:
    """Retained: among the `retain_last` newest of `committed` (ascending), pinned by a reader group,
    or being fetched."""
    return version in committed[-retain_last:] or version in set(pinned) or version in set(fetching)


def drop_seed(*, retained: bool, inflight: int, releasing: bool, redundant: bool = False) -> bool:
    """A seed (an offload copy, or any replica of a seed worker) goes once nobody needs or reads it.

    `redundant`: an offload seed whose version has `min_full_copies` other full live copies is no
    longer needed either (the origin kept it only until a second reader finished; the hub passes
    False for a seed worker's replicas, which it asks for again while they are the latest)."""
    return (not retained or redundant) and inflight == 0 and not releasing


@dataclass(frozen=True, slots=True)
class SeedWorker:
    id: str
    location: Location
    tasks: int
    """Hand-offs it was asked for and has not picked up yet."""


def choose_seed_worker(src: Location, seeds: Iterable[SeedWorker], holders: Iterable[str]) -> str:
    """The nearest seed worker (then the least asked, then by id) not in `holders`, or ''."""
    held = set(holders)
    ok = [w for w in seeds if w.id not in held]
    return min(ok, key=lambda w: (src.distance(w.location), w.tasks, w.id)).id if ok else ""


def forget_below(latest: int, retain_last: int) -> int:
    """Committed versions below this may have their manifests forgotten (KEEP_OLD below the retained)."""
    return latest - retain_last - KEEP_OLD


def forgettable(versions: Iterable[int], below: int, used: set[int]) -> list[int]:
    """Versions below `below` that nobody holds, pins or fetches (`used`): their manifests may go."""
    return [v for v in versions if v < below and v not in used]
