"""Typed errors of the ROS hub.

Every error a caller can provoke is a `HubError` subclass that says what to fix. The hub raises them
*before* changing any state, so a refused call leaves the hub exactly as it was. Errors cross the
control plane as `(code, message)` and are re-raised as the same class on the client.
"""
from __future__ import annotations


class HubError(Exception):
    """Base class of every rlsync hub error."""

    code = "hub_error"


class AuthError(HubError):
    """Missing or wrong token on a control RPC."""

    code = "auth"


class TenantAccessError(AuthError):
    """A tenant's credential used outside its scopes: publishing, reading or listing a model its
    patterns do not cover, or acting for another tenant's worker. The message is the same whether the
    model exists or not (it reveals nothing of other tenants); nothing was changed."""

    code = "tenant_access"


class QuotaExceededError(HubError):
    """A publish that would take the tenant's retained bytes past its quota, counted after its own
    retention let its older versions go (docs/tenants.md). Nothing was changed: raise the quota,
    lower the model's retain_last, or publish a smaller version."""

    code = "quota"


class HomeHubError(HubError):
    """A publish that would give a model a second history on this hub: a trainer publishing a model this hub
    follows from its home hub (through a gateway), or a gateway following a model this hub is home to or
    already follows from another hub (docs/scale.md, "Federation"). Nothing was changed."""

    code = "home_hub"


class UnknownModelError(HubError):
    """The model was never published on this hub."""

    code = "unknown_model"


class VersionError(HubError):
    """A version that cannot be published (not above the latest committed, or already published)."""

    code = "version"


class VersionNotFoundError(HubError):
    """Fetch of a version that was never committed."""

    code = "version_not_found"


class VersionNotRetainedError(HubError):
    """Fetch of a committed version that is no longer retained and has no live replica."""

    code = "version_not_retained"


class VersionLostError(HubError):
    """A retained version whose every replica died without notice: it is never served stale."""

    code = "version_lost"


class HolderWaitTimeoutError(VersionLostError):
    """A fetch or re-plan that the hub held back while it waited for a holder of the version to be heard
    from again (a stalled source, re-registrations after a restart) ran out of the caller's time."""

    code = "holder_wait_timeout"


class ManifestMismatchError(HubError):
    """A shard's manifest disagrees with another shard of the same version, or with itself."""

    code = "manifest_mismatch"


class ShardError(HubError):
    """A shard coordinate outside its group, or a group layout that disagrees."""

    code = "shard"


class BufferMismatchError(HubError):
    """`into` tensors whose names, shapes or dtypes do not match the version's manifest."""

    code = "buffer_mismatch"


class NotJoinedError(HubError):
    """A call that needs `join()` first, or a worker id the hub does not know (expired?)."""

    code = "not_joined"


class AlreadyJoinedError(HubError):
    """`join()` on a client that is already joined: call `leave()` first (one client, one worker id)."""

    code = "already_joined"


class LastReplicaError(HubError):
    """`release` of a seed copy that is the last full replica of a retained version: releasing it would
    lose the version. It is released once another replica exists or the version is no longer retained."""

    code = "last_replica"


class NotAReplicaError(HubError):
    """`release` of a (model, version, shard) that this worker does not hold."""

    code = "not_a_replica"


class TicketError(HubError):
    """A data-plane read with a missing, forged, expired or mismatched ticket."""

    code = "ticket"


class ProtocolError(HubError):
    """A malformed, oversized or unexpected frame on the control or data plane."""

    code = "protocol"


class UnknownFetchError(ProtocolError):
    """The hub does not know this fetch: it restarted, or expired the reader, since planning it.
    The client plans the missing units again (a new fetch); callers rarely see it."""

    code = "unknown_fetch"


class InvalidArgumentError(ProtocolError):
    """An argument of the wrong type or out of range: in a client call (e.g. `version=2**70`, a
    malformed hub address) or in a control frame with a valid token. Nothing was changed."""

    code = "invalid_argument"


class TransferError(HubError):
    """A data-plane read failed: peer died, timed out, or sent bytes whose checksum is wrong."""

    code = "transfer"


class ChecksumError(TransferError):
    """A received unit's checksum differs from the manifest's: the bytes are discarded."""

    code = "checksum"


class DeltaError(TransferError):
    """A delta that does not apply: corrupt, made against other bytes than the reader holds, or
    decoding to bytes whose checksum is not the target version's. The reader's held version is intact."""

    code = "delta"


class SourceGoneError(TransferError):
    """A source's data port refused the connection: nobody listens there any more (its worker died or
    left). Proof of death, unlike a stall: the reader tells the hub, which routes nothing to that
    worker from then on (a worker that is in fact alive re-joins at its next heartbeat)."""

    code = "source_gone"


class TransportUnavailableError(HubError):
    """A transport that cannot run here (missing device, permission, native build)."""

    code = "transport_unavailable"


class HubUnavailableError(HubError):
    """The hub did not answer within the client's deadline."""

    code = "hub_unavailable"


class LayoutError(HubError, ValueError):
    """A sharded layout whose pieces do not tile each tensor exactly (a gap, an overlap, a piece past
    the tensor's end), whose ranks disagree (dtype, shape, or another rank's layout of the same
    version), or a resharding destination it cannot serve (unknown tensor, uneven block, part out of
    range, mixed dtypes, no or duplicate destinations). Nothing was registered. Also a `ValueError`:
    resharding refused these as plain `ValueError`s before they were typed."""

    code = "layout"


class TimeoutError_(HubError):
    """A hub operation (e.g. a release waiting for readers to drain) exceeded its deadline."""

    code = "timeout"


_BY_CODE = {cls.code: cls for cls in list(globals().values())
            if isinstance(cls, type) and issubclass(cls, HubError)}


def error_from_code(code: str, message: str) -> HubError:
    """Rebuild the typed error the hub sent as (code, message)."""
    return _BY_CODE.get(code, HubError)(message)
