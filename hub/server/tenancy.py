"""The hub server's tenants (a mixin of `HubServer`, hub/server/loop.py): who sent a request, may it
do that, and what its reads weigh on the data plane.

Every control RPC carries a credential. `_authenticate` maps it to a tenant (hub/state/tenants.py;
the hub token is the operator's), `_authorize` checks the operation before any handler runs:

    a model named in the arguments     within the tenant's scope for the operation (publish: publish
                                       scope; every other operation on a model: read scope)
    a worker id                        one that this tenant joined (no acting for another's workers)
    publish                            the model owner's quota (hub/state/quotas.py)

A refusal is a `TenantAccessError` whose text depends only on what the caller sent, never on whether
the model exists, so a tenant learns nothing of another's models. `models` and `stats` list only what
the caller may list. A fetch plan's tickets carry the reader's tenant and weight; each source
schedules its unit sends by them (hub/dataplane/shares.py).
"""
from __future__ import annotations

from rlsync.hub import errors as E
from rlsync.hub.state.quotas import check_publish_quota
from rlsync.hub.state.tenants import OPERATOR, Tenant, Tenants

SCOPE = {"publish": "publish"}
"""The scope an operation on a model needs; every other operation naming a model needs `read`."""


class TenantOps:
    def _init_tenants(self) -> None:
        self.tenants = Tenants(self.cfg.tenants, self.token)
        self._by_name: dict[str, Tenant] = {t.name: t for t in self.tenants.tenants}
        self._worker_tenant: dict[str, str] = {}  # worker id -> the tenant that joined it
        self._owners: dict[str, Tenant | None] = {}  # model -> its owner (quota), by name
        self._caller: Tenant = OPERATOR  # the sender of the request being handled (one thread)

    def _authenticate(self, token) -> Tenant:
        t = self.tenants.who(token)
        if t is None:
            raise E.AuthError("missing or wrong hub token")
        return t

    def _authorize(self, t: Tenant, op: str, args: dict) -> None:
        """Refuse (typed, before anything changes) what tenant `t` may not do."""
        self._caller = t
        if not self.tenants.enabled:
            return  # the hub token alone: everything, as before tenants existed
        model = args.get("model")
        if model is not None:
            scope = "publish" if op == "register" and args.get("origin") else SCOPE.get(op, "read")
            if not t.may(scope, model):
                raise E.TenantAccessError(f"{op}: tenant {t.name or 'operator'!r} has no {scope} scope over model "
                                          f"{model!r}; use that model's tenant's credential")
        wid = args.get("worker_id") if op == "join" else args.get("wid")
        if wid is not None:
            owner = self._worker_tenant.get(wid)
            if owner is not None and owner != t.name and (op != "join" or wid in self.state.workers):
                raise E.TenantAccessError(f"{op}: worker {wid} was joined with another tenant's credential; "
                                          "each tenant acts only for its own workers")
        if op == "publish":
            owner = self._owner(model)
            if owner is not None:
                owned = [m for m in self.state.models if self._owner(m) is owner]
                check_publish_quota(self.state, owner, owned, model, args["version"], args["shard"].key,
                                    args["manifest"])

    def _joined(self, wid: str) -> None:
        """Bind a worker that just joined to its tenant (forgetting workers the hub no longer knows)."""
        if len(self._worker_tenant) > 2 * len(self.state.workers) + 64:
            self._worker_tenant = {w: n for w, n in self._worker_tenant.items() if w in self.state.workers}
        self._worker_tenant[wid] = self._caller.name

    def _owner(self, model: str) -> Tenant | None:
        if model not in self._owners:
            self._owners[model] = self.tenants.owner(model)
        return self._owners[model]

    def _share_of(self, wid: str) -> tuple[str, float] | None:
        """What the tickets of `wid`'s reads carry: its tenant's (name, weight); None for the operator."""
        t = self._by_name.get(self._worker_tenant.get(wid, ""))
        return t.share if t is not None else None

    def _visible(self, models):
        """The names among `models` the caller may list."""
        t = self._caller
        return [m for m in models if not self.tenants.enabled or t.may("list", m)]

    def op_models(self, ident, rid):
        """{model: latest} of every model the caller may list (a tenant sees only its own)."""
        return {m: self.state.models[m].latest for m in sorted(self._visible(self.state.models))}


def load_tenants_file(path: str) -> tuple[list, list]:
    """([TenantConfig], [ModelPolicyConfig]) from a YAML (or JSON) file `python -m rlsync.hub serve
    --tenants` reads; a relative `token_file` is relative to the file's directory (docs/tenants.md)."""
    import os

    import yaml

    from rlsync.hub.state.policy import ModelPolicyConfig
    from rlsync.hub.state.tenants import TenantConfig
    try:
        with open(path) as f:
            doc = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        raise E.InvalidArgumentError(f"tenants file {path}: {e}") from None
    if not isinstance(doc, dict) or set(doc) - {"tenants", "models"}:
        raise E.InvalidArgumentError(f"tenants file {path}: a map with `tenants` and `models` lists only")
    out = []
    for key, cls in (("tenants", TenantConfig), ("models", ModelPolicyConfig)):
        items = doc.get(key) or []
        if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
            raise E.InvalidArgumentError(f"tenants file {path}: `{key}` must be a list of maps")
        try:
            objs = [cls(**x) for x in items]
        except TypeError as e:
            raise E.InvalidArgumentError(f"tenants file {path}: `{key}`: {e}") from None
        for o in objs:
            if getattr(o, "token_file", ""):
                o.token_file = os.path.join(os.path.dirname(os.path.abspath(path)), o.token_file)
        out.append(objs)
    return out[0], out[1]
