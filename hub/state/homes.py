"""One home per model (federation, docs/scale.md): a model's versions on this hub come either from its own
publishers (this hub is the model's home) or from one gateway that follows it from its home hub, never both.

A model's family is its root and the deltas of it (`policy`, `policy@delta`); variants (`policy@bf16`) are
derived here from committed versions, by anyone, and follow their base. `HubState.homes` maps a followed
family's root to its home hub's id (absent: this hub is its home, or has not seen it); `home_hook` journals a
new entry before it counts (hub/server/home.py).

    s.check_home(wid, "policy", home="a3f…")   # a gateway's publish: refused if `policy` has its own history here
    s.check_home(wid, "policy", home=None)     # a trainer's publish: refused if `policy` follows another hub
A mixin of `HubState` (hub/state/__init__.py).
"""
from __future__ import annotations

from rlsync.hub import errors as E
from rlsync.hub.model.names import is_variant_model, root_model


class Homes:
    """Checks and records which hub is each model's home."""

    def family_home(self, model: str) -> tuple[str, str] | None:
        """(the family's root, its home: "" = this hub) of a model whose home matters; None for a variant."""
        if is_variant_model(model):
            return None
        root = root_model(model)
        return root, self.homes.get(root, "")

    def check_home(self, wid: str, model: str, home: str | None) -> None:
        """Refuse (typed, nothing changed) a publish that would give `model` a second history on this hub."""
        fam = self.family_home(model)
        if fam is None:
            return
        root, have = fam
        if home is None:
            if have:
                raise E.HomeHubError(f"{root!r} follows hub {have} (its home) through a gateway: publish it there; "
                                     "this hub takes its versions only from that gateway")
            return
        if have and have != home:
            raise E.HomeHubError(f"{root!r} already follows hub {have}; a gateway cannot bring it from hub {home} too "
                                 "(one home per model)")
        if not have and self._published_here(root):
            raise E.HomeHubError(f"{root!r} has its own history on this hub (published here by its workers): it is "
                                 f"this hub's own model, so a gateway cannot follow it from hub {home}")

    def _published_here(self, root: str) -> bool:
        return any(m in self.models and self.models[m].versions for m in (root, f"{root}@delta"))

    def record_home(self, model: str, home: str) -> None:
        """Record `home` for `model`'s family (a gateway's publish that `check_home` let through)."""
        fam = self.family_home(model)
        if fam is None or fam[1] == home:
            return
        if self.home_hook is not None:
            self.home_hook(fam[0], home)
        self.homes[fam[0]] = home
