"""Retention: what the last full replica of a version must do before it lets go. Pure logic.

A version is *retained* while someone may still need it: it is among the `retain_last` newest
committed versions of its model, or an in-progress fetch or a reader group is pinned to it. When a
worker releases (or leaves with notice) the last full replica of a retained shard, the policy
decides, so that the default never loses a retained version:

- a relay (a reader mid-fetch) exists → WAIT for it: once it completes it is a full replica;
- otherwise → SEED: copy the bytes to host memory held by the data-plane server (or a seed worker),
  register that copy as a replica, then release.

    >>> RetentionPolicy(RetentionConfig()).decide(retained=True, other_full=0, relays=1)
    <Decision.WAIT_RELAY: 'wait_relay'>
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


class Decision(str, enum.Enum):
    RELEASE = "release"
    WAIT_RELAY = "wait_relay"
    SEED = "seed"


@dataclass(kw_only=True, slots=True)
class RetentionConfig:
    retain_last: int = 1
    """How many of a model's newest committed versions stay retained (fetchable by number)."""
    prefer_seed: bool = False
    """Seed at once even when a relay is in progress (faster release, costs a host copy)."""


class RetentionPolicy:
    def __init__(self, cfg: RetentionConfig) -> None:
        if cfg.retain_last < 1:
            raise ValueError("retain_last must be >= 1: the latest version is always retained")
        self.cfg = cfg

    def decide(self, *, retained: bool, other_full: int, relays: int) -> Decision:
        if not retained or other_full > 0:
            return Decision.RELEASE
        if relays > 0 and not self.cfg.prefer_seed:
            return Decision.WAIT_RELAY
        return Decision.SEED
