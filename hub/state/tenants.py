"""Tenants: which credential may publish, read and list which models, its quota and its data-plane
weight. No I/O but reading each tenant's token file once, when the hub starts.

Several jobs share one hub. Each tenant has its own credential (a token) and scopes, each a list of
model-name patterns (`fnmatch`; a model's derived objects (`NAME@delta`, `NAME@bf16`) follow `NAME`):

    publish   publish versions of these models (and release, re-register them)
    read      fetch them, ask their `latest` / `versions`
    listing   see them in `models` and `stats`

Scopes nest: what a tenant may publish it may read, what it may read it may list. The hub's own
token stays valid as the operator's credential (every scope, no quota, unscheduled reads): with no
tenants configured it is the only one, and the hub behaves as it always did.

A model's *owner* is the first tenant (in the configured order) whose publish patterns match it; its
retained bytes count against that tenant's `quota_bytes` (hub/state/quotas.py). A tenant's reads are
served at each source with weight `share` × its priority class's weight (hub/dataplane/shares.py).

    >>> t = Tenants([TenantConfig(name="a", token="ta", publish=["a/*"], listing=["shared/*"])], hub_token="op")
    >>> a = t.who("ta")
    >>> a.may("read", "a/policy"), a.may("list", "shared/base"), a.may("read", "shared/base"), t.who("op").name
    (True, True, False, '')
"""
from __future__ import annotations

import fnmatch
import hashlib
import math
from dataclasses import dataclass, field

from rlsync.hub.errors import InvalidArgumentError
from rlsync.hub.model.names import root_model

PRIORITY_WEIGHTS = {"bulk": 1.0, "normal": 4.0, "interactive": 16.0}
"""Serving weight of each priority class (times the tenant's `share`)."""


@dataclass(kw_only=True, slots=True)
class TenantConfig:
    name: str
    """The tenant's name (in logs, stats, error messages and data-plane tickets)."""
    token_file: str = ""
    """File holding the tenant's credential (as a hub token file: one line). Exactly one of
    token_file and token."""
    token: str = ""
    """The credential itself (embedded hubs and tests; a file keeps it out of configs)."""
    publish: list[str] = field(default_factory=list)
    """Model-name patterns this tenant may publish (and read, and list)."""
    read: list[str] = field(default_factory=list)
    """Model-name patterns this tenant may read (and list), e.g. a shared base model."""
    listing: list[str] = field(default_factory=list)
    """Model-name patterns this tenant may only see listed."""
    quota_bytes: int = 0
    """Most bytes of retained versions of the models this tenant owns (0: no quota)."""
    share: float = 1.0
    """Relative data-plane weight of this tenant's reads at a busy source (times its priority class's)."""
    priority: str = "normal"
    """Priority class: bulk | normal | interactive (weights 1, 4, 16)."""


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    """'' for the operator (the hub token)."""
    publish: tuple[str, ...]
    read: tuple[str, ...]
    listing: tuple[str, ...]
    quota_bytes: int = 0
    weight: float = 0.0
    """Data-plane weight; 0 for the operator (its reads are not scheduled)."""

    def may(self, scope: str, model: str) -> bool:
        """May this tenant `scope` (publish | read | list) `model`?"""
        name = root_model(model)  # a derived object (NAME@delta, NAME@bf16, ...) follows NAME
        pats = {"publish": self.publish, "read": self.publish + self.read,
                "list": self.publish + self.read + self.listing}[scope]
        return any(fnmatch.fnmatchcase(name, p) for p in pats)

    @property
    def share(self) -> tuple[str, float] | None:
        """What a data-plane ticket for this tenant's reads carries: (name, weight), None for the operator."""
        return (self.name, self.weight) if self.name else None


OPERATOR = Tenant("", ("*",), (), ())


class Tenants:
    """Credential -> tenant. Tokens are looked up by their SHA-256, never compared byte by byte."""

    def __init__(self, tenants: list[TenantConfig], hub_token: str) -> None:
        self._by_digest: dict[bytes, Tenant] = {_digest(hub_token): OPERATOR}
        self.tenants: list[Tenant] = []
        for c in tenants:
            token = c.token or (read_token_file(c.token_file) if c.token_file else "")
            t = _tenant(c, token)
            if t.name in {x.name for x in self.tenants}:
                raise InvalidArgumentError(f"tenant {t.name!r} is configured twice")
            if _digest(token) in self._by_digest:
                raise InvalidArgumentError(f"tenant {t.name!r} has the credential of another tenant or the hub's "
                                           "own token: give each tenant its own")
            self._by_digest[_digest(token)] = t
            self.tenants.append(t)

    @property
    def enabled(self) -> bool:
        return bool(self.tenants)

    def who(self, token: object) -> Tenant | None:
        """The tenant `token` belongs to, or None (no such credential)."""
        if not isinstance(token, str):
            return None
        return self._by_digest.get(_digest(token))

    def owner(self, model: str) -> Tenant | None:
        """The tenant whose quota `model`'s retained versions count against (None: nobody's)."""
        return next((t for t in self.tenants if t.may("publish", model)), None)


def _tenant(c: TenantConfig, token: str) -> Tenant:
    if not isinstance(c.name, str) or not c.name:
        raise InvalidArgumentError(f"every tenant needs a non-empty name, got {c.name!r}")
    if bool(c.token) == bool(c.token_file):
        raise InvalidArgumentError(f"tenant {c.name!r}: give exactly one of token and token_file")
    if not token:
        raise InvalidArgumentError(f"tenant {c.name!r}: empty credential in {c.token_file or 'token'}")
    for scope in ("publish", "read", "listing"):
        pats = getattr(c, scope)
        if not isinstance(pats, (list, tuple)) or not all(isinstance(p, str) and p for p in pats):
            raise InvalidArgumentError(f"tenant {c.name!r}: {scope} must be a list of model-name patterns")
    if c.priority not in PRIORITY_WEIGHTS:
        raise InvalidArgumentError(f"tenant {c.name!r}: priority must be one of {sorted(PRIORITY_WEIGHTS)}, "
                                   f"got {c.priority!r}")
    if isinstance(c.share, bool) or not isinstance(c.share, (int, float)) or not 0 < c.share < math.inf:
        raise InvalidArgumentError(f"tenant {c.name!r}: share must be a finite number > 0, got {c.share!r}")
    if isinstance(c.quota_bytes, bool) or not isinstance(c.quota_bytes, int) or c.quota_bytes < 0:
        raise InvalidArgumentError(f"tenant {c.name!r}: quota_bytes must be an int >= 0, got {c.quota_bytes!r}")
    return Tenant(c.name, tuple(c.publish), tuple(c.read), tuple(c.listing), c.quota_bytes,
                  float(c.share) * PRIORITY_WEIGHTS[c.priority])


def read_token_file(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as e:
        raise InvalidArgumentError(f"tenant token file {path}: {e.strerror}") from None


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
