"""Per-tenant quotas on held bytes. Pure logic over `HubState`'s tables, no I/O.

A tenant's *held bytes* are the bytes of the versions the hub keeps retrievable for the models it
owns (hub/state/tenants.py): every retained version (its model's `retain_last` newest, plus versions
pinned or being fetched) and every version still being published, each counted once whatever the
number of replicas. A publish is checked before anything changes, as if its version had committed:
the commit slides that model's own retention window, so the versions it lets go are credited first.
A publish that would still end above the quota is refused (`QuotaExceededError`): the hub never drops
anything to make room, and another tenant's versions never enter the count.

    publishing v5 of `a/lora` with retain_last=2: held after = bytes(v4) + bytes(v5) (+ pinned older)
"""
from __future__ import annotations

from rlsync.hub import errors as E
from rlsync.hub.model.manifest import Manifest
from rlsync.hub.model.names import delta_model
from rlsync.hub.state import retention


def held_bytes(state, models: list[str], publishing: tuple[str, int, str, int] | None = None) -> int:
    """Bytes the hub keeps retrievable for `models`; with `publishing` = (model, version, shard key,
    bytes of that shard's manifest), as they would be once that version committed."""
    total = 0
    for name in models:
        m = state.models.get(name)
        if m is None:
            continue
        committed = list(m.committed)
        if publishing is not None and publishing[0] == name and publishing[1] not in committed:
            committed.append(publishing[1])
        keep = state.retained_window(name)
        pinned = [p.version for p in m.pins.values()]
        fetching = state._index.fetch_versions.get(name, ())
        for v, rec in m.versions.items():
            if not rec.committed and not (publishing and publishing[:2] == (name, v)):
                total += sum(x.nbytes for x in rec.manifests.values())  # another publish in progress
            elif retention.is_retained(v, committed, keep, pinned, fetching):
                total += sum(x.nbytes for k, x in rec.manifests.items()
                             if not (publishing and publishing[:3] == (name, v, k)))
    if publishing is not None:
        total += publishing[3]
    return total


def check_publish_quota(state, tenant, owned: list[str], model: str, version: int, shard_key: str,
                        manifest: Manifest) -> None:
    """QuotaExceededError if publishing (model, version, shard) takes `tenant`'s held bytes over its
    quota; `owned`: the models `tenant` owns (their `@delta` companions count too)."""
    if not tenant.quota_bytes:
        return
    models = sorted({n for o in owned for n in (o, delta_model(o))} | {model})
    after = held_bytes(state, models, (model, version, shard_key, manifest.nbytes))
    if after > tenant.quota_bytes:
        raise E.QuotaExceededError(
            f"tenant {tenant.name!r}: publishing {model!r} v{version} {shard_key} ({manifest.nbytes} bytes) would "
            f"hold {after} bytes of retained versions, over its quota of {tenant.quota_bytes}; raise quota_bytes, "
            f"lower the model's retain_last (HubConfig.models), or release pinned older versions")
