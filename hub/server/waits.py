"""The hub server's `wait_latest` (a mixin of `HubServer`, hub/server/loop.py): a reply parked until a model's
`latest` reaches a version, or until the caller's timeout, whichever comes first.

    hub.wait_latest("policy", at_least=8, timeout_s=30)   # 8 (or more), in the loop pass that commits v8;
                                                          # at 30 s: whatever latest is then (7, or None)

A reader that needs version v asks once instead of polling `latest` (the RL rollout worker did, every
5 ms: docs/rl.md). The timeout is not an error: the reply is `latest` as it is then, and the caller
decides. A restarted hub holds no parked replies: the client's channel sends the call again when the
connection drops (hub/protocol/rpc.py) and the new hub parks it afresh.
"""
from __future__ import annotations

import math
import time
from typing import NamedTuple


DEFERRED = object()
"""What an operation returns when its reply is sent later (a parked wait, a release draining, a batched plan)."""


class _Wait(NamedTuple):
    deadline: float
    ident: bytes
    rid: object
    at_least: int


class WaitOps:
    def _init_waits(self) -> None:
        self._waits: dict[str, list[_Wait]] = {}  # model -> parked replies
        self._waits_seen: dict[str, int | None] = {}  # model -> latest when its waits were last looked at
        self.waits_due = math.inf  # the earliest deadline of a parked reply (time.monotonic())

    def _latest_of(self, model: str) -> int | None:
        m = self.state.models.get(model)
        return m.latest if m is not None else None

    def op_wait_latest(self, ident, rid, model: str, at_least: int, timeout_s: float):
        """`latest(model)` once it is >= at_least, else parked until it is or `timeout_s` has passed
        (then `latest` as it is: None while nothing of `model` is committed)."""
        latest = self._latest_of(model)
        if timeout_s <= 0 or (latest is not None and latest >= at_least):
            return latest
        w = _Wait(time.monotonic() + timeout_s, ident, rid, at_least)
        self._waits.setdefault(model, []).append(w)
        self._waits_seen[model] = latest
        self.waits_due = min(self.waits_due, w.deadline)
        return DEFERRED

    def _answer_waits(self) -> None:
        """Answer the parked replies whose version has committed or whose time is up. Each loop pass
        looks only at models whose `latest` moved, and at all of them once a deadline has passed."""
        if not self._waits:
            return
        now = time.monotonic()
        due = now >= self.waits_due
        for model in list(self._waits):
            latest = self._latest_of(model)
            if not due and latest == self._waits_seen.get(model):
                continue
            self._waits_seen[model] = latest
            keep, answer = [], []
            for w in self._waits[model]:
                (answer if now >= w.deadline or (latest is not None and latest >= w.at_least) else keep).append(w)
            if keep:
                self._waits[model] = keep
            else:
                del self._waits[model], self._waits_seen[model]
            for w in answer:  # after the tables: whoever hears the answer sees nothing parked for it
                self._reply(w.ident, w.rid, True, latest)
        if due:
            self.waits_due = min((w.deadline for ws in self._waits.values() for w in ws), default=math.inf)
