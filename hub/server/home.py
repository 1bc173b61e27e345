"""The hub's identity and each model's home (a mixin of `HubServer`, hub/server/loop.py; the rule is
hub/state/homes.py).

`hub_id` is made once and kept in the journal (a restarted hub is the same hub); `join` answers it, so a
federation gateway knows the id of the home hub it reads from and sends it with each publish into its own DC's
hub (`home`). That hub journals which models it follows from where (meta row `homes`) before the first such
publish is accepted, so after a restart it still refuses a trainer's publish of a followed model.
"""
from __future__ import annotations

import uuid

from rlsync.hub.model.shard import Shard
from rlsync.hub.model.manifest import Manifest


class HomeOps:
    def _init_home(self) -> None:
        self.hub_id = self.journal.get_meta("hub_id")
        if not self.hub_id:
            self.hub_id = uuid.uuid4().hex[:16]
            self.journal.set_meta("hub_id", self.hub_id)
        self.state.homes.update(self.journal.get_meta("homes") or {})
        self.state.home_hook = self._journal_home

    def _journal_home(self, root: str, home: str) -> None:
        self.journal.set_meta("homes", {**self.state.homes, root: home})

    def op_publish(self, ident, rid, wid: str, model: str, version: int, shard: Shard, manifest: Manifest,
                   home: str | None = None):
        committed = self.state.publish(wid, model, version, shard, manifest, home=home)
        self._known.add(manifest)
        return {"committed": committed, "latest": self.state.models[model].latest}
