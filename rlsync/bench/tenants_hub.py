"""`python -m rlsync.bench tenants_hub`: the hub's half of `bench tenants` (issue 34): data-plane shares under a
saturating co-tenant, and a cross-tenant read. Real hub processes, real data-plane transfers on loopback.

    python -m rlsync.bench tenants_hub [--size-mb 32] [--seconds 8] [--shares 3,1] [--json F]

`quota_shares`: a standalone hub (`python -m rlsync.hub serve --tenants F`) with tenants a and b (shares 3:1
by default); one source worker (the operator's credential: a shared pool) holds a model of each; one reader
process per tenant, with its own credential, fetches its tenant's model again and again (release, fetch),
so both keep the source's uplink busy. The source schedules unit sends by tenant weight
(hub/dataplane/shares.py) and counts the bytes it granted while both tenants were waiting: each tenant's
share of those against its configured share is `quota_share_error_max` (max over tenants of
|measured / configured - 1|; target 0.05); `served_share_window` is each one's share of all bytes the source
served in the window, gaps between fetches included. Baseline in the same run: the same readers with the
operator's credential (unscheduled), their shares of the bytes served (`baseline_share_error_max`), and the
aggregate rate of each (`rate_ratio_scheduled_vs_unscheduled`: what the scheduling costs).

`cross_tenant_read`: tenant b reads tenant a's model with its own credential (fetch, latest, versions,
publish), for a model that exists and one that does not: every call refused with `TenantAccessError`, the
two answers identical but for the name, and the hub's view of a's model unchanged
(`cross_tenant_read_refused`). The load average is written beside the figures.

The h-lora bench (`bench tenants`) imports both functions: each returns a dict of figures.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time

from . import register_scenario


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def write_tenants(tmp: str, tenants: list[dict], models: list[dict] = ()) -> tuple[str, dict[str, str]]:
    """`tenants` (TenantConfig fields, each with a `token`) as token files beside a tenants file in `tmp`, for
    `python -m rlsync.hub serve --tenants FILE`; returns (that file, {tenant name: token})."""
    import yaml

    entries, tokens = [], {}
    for t in tenants:
        t = dict(t)
        tokens[t["name"]] = t.pop("token")
        path = os.path.join(tmp, f"{t['name']}.token")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(tokens[t["name"]])
        entries.append({**t, "token_file": os.path.basename(path)})
    spec = os.path.join(tmp, "tenants.yaml")
    with open(spec, "w") as f:
        yaml.safe_dump({"tenants": entries, "models": list(models)}, f)
    return spec, tokens


@contextlib.contextmanager
def tenant_hub(tenants: list[dict], models: list[dict] = ()):
    """A standalone hub process serving `tenants` (TenantConfig fields, each with a `token`; written to
    token files beside a tenants file); yields (address, operator token, {tenant name: token})."""
    from rlsync.hub.tools.demo import start_hub_process
    with tempfile.TemporaryDirectory(prefix="rlsync-tenants-") as tmp:
        spec, tokens = write_tenants(tmp, tenants, models)
        proc, address, op_token = start_hub_process(tmp, extra=("--tenants", spec))
        try:
            yield address, op_token, tokens
        finally:
            proc.terminate()
            proc.wait(10)


def _saturate(address: str, src_token: str, reader_tokens: dict[str, str], models: dict[str, str], size_mb: float,
              seconds: float, src) -> dict:
    """Each reader (token per tenant) refetches its model from `src` for `seconds`; its bytes and rate."""
    from rlsync.hub.client import ClientConfig
    from rlsync.hub.dataplane.config import DataPlaneConfig
    from rlsync.hub.tools.procs import WorkerProcess, close_all
    cfg = ClientConfig(transport="tcp", dataplane=DataPlaneConfig(streams=4))  # each reader keeps its tenant backlogged
    readers = {t: WorkerProcess(address, tok, cfg, name=f"reader-{t}") for t, tok in reader_tokens.items()}
    try:
        for t, w in readers.items():
            w.join(host=f"host-{t}", rack="r0", dc="dc0")
        for t, w in readers.items():
            w.call("refetch_loop", model=models[t], version=1)
        w.call("wait_results", n=1, within=60)  # both loops under way (the last reader's first fetch done)
        before, served0, t0 = src.call("shares"), src.call("served"), time.monotonic()
        time.sleep(seconds)  # the measuring window itself, not a synchronisation
        during, served1, wall = src.call("shares"), src.call("served"), time.monotonic() - t0
        for w in readers.values():
            w.call("stop_loop")
    finally:
        close_all(list(readers.values()))
    # source-side bytes per model over the window (counted as each connection ends: ~size/streams grains)
    by_model = {m: sum(r["bytes"] - served0.get(rid, {}).get("bytes", 0) for rid, r in served1.items()
                       if rid.split(":")[1] == m) for m in models.values()}
    return {"read_bytes": {t: by_model[m] for t, m in models.items()}, "window_s": wall,
            "contended": {t: during["contended"].get(t, 0) - before["contended"].get(t, 0) for t in reader_tokens}}


def _error(bytes_by: dict[str, int], want: dict[str, float]) -> tuple[dict, float]:
    total = sum(bytes_by.values()) or 1
    share = {t: bytes_by.get(t, 0) / total for t in want}
    return share, max(abs(share[t] / want[t] - 1.0) for t in want)


def quota_shares(size_mb: float = 32.0, seconds: float = 8.0, shares: tuple[float, float] = (3.0, 1.0)) -> dict:
    """Two tenants saturating one source: each one's share of bytes served vs its configured share."""
    from rlsync.hub.client import ClientConfig
    from rlsync.hub.model.manifest import ManifestConfig
    from rlsync.hub.tools.procs import WorkerProcess, close_all
    tenants = [{"name": n, "token": f"bench-{n}-{os.urandom(8).hex()}", "publish": [f"{n}/*"], "share": s}
               for n, s in zip("ab", shares)]
    want = {t["name"]: t["share"] / sum(shares) for t in tenants}
    models = {"a": "a/policy", "b": "b/policy"}
    load0 = _load()
    with tenant_hub(tenants) as (address, op_token, tokens):
        src_cfg = ClientConfig(transport="tcp", manifest=ManifestConfig(chunk_bytes=1 << 20))
        src = WorkerProcess(address, op_token, src_cfg, name="pool")
        try:
            src.join(host="pool", rack="r0", dc="dc0")
            for i, m in enumerate(models.values()):
                src.call("publish", model=m, version=1, size_mb=size_mb, seed=i)
            sched = _saturate(address, op_token, tokens, models, size_mb, seconds, src)
            base = _saturate(address, op_token, {t: op_token for t in tokens}, models, size_mb, seconds, src)
        finally:
            close_all([src])
    share, err = _error(sched["contended"], want)
    r_share, r_err = _error(sched["read_bytes"], want)
    b_share, b_err = _error(base["read_bytes"], want)
    rate = {k: sum(x["read_bytes"].values()) / max(x["window_s"], 1e-9) / 1e9 for k, x in (("s", sched), ("b", base))}
    return {"quota_share_error_max": round(err, 4), "configured_share": want,
            "served_share_contended": {t: round(v, 4) for t, v in share.items()},
            "contended_bytes": sched["contended"], "served_share_window": {t: round(v, 4) for t, v in r_share.items()},
            "served_share_window_error_max": round(r_err, 4),
            "baseline_share_unscheduled": {t: round(v, 4) for t, v in b_share.items()},
            "baseline_share_error_max": round(b_err, 4),
            "rate_gbytes_s_scheduled": round(rate["s"], 3), "rate_gbytes_s_unscheduled": round(rate["b"], 3),
            "rate_ratio_scheduled_vs_unscheduled": round(rate["s"] / max(rate["b"], 1e-9), 3),
            "size_mb": size_mb, "seconds": seconds, "loadavg_before": load0, "loadavg_after": _load()}


def cross_tenant_read() -> dict:
    """Tenant b reads tenant a's model with its own credential: refused, typed, nothing learned."""
    import torch

    from rlsync.hub import HubClient, Location
    from rlsync.hub import errors as E
    tenants = [{"name": n, "token": f"bench-{n}-{os.urandom(8).hex()}", "publish": [f"{n}/*"]} for n in "ab"]
    with tenant_hub(tenants) as (address, op_token, tokens):
        a, b, op = HubClient(address, tokens["a"]), HubClient(address, tokens["b"]), HubClient(address, op_token)
        try:
            a.join(Location(host="a"), "a")
            b.join(Location(host="b"), "b")
            a.publish("a/policy", 1, {"w": torch.arange(1 << 16, dtype=torch.float32)})
            seen = (op.versions("a/policy"), op.models())
            answers, typed = {}, True
            for model in ("a/policy", "a/no-such-model"):
                for name, call in (("fetch", lambda: b.fetch(model, "latest")), ("fetch_v1", lambda: b.fetch(model, 1)),
                                   ("latest", lambda: b.latest(model)), ("versions", lambda: b.versions(model)),
                                   ("publish", lambda: b.publish(model, 2, {"w": torch.zeros(4)}))):
                    try:
                        call()
                        answers[(model, name)] = "ANSWERED"
                    except E.TenantAccessError as e:
                        answers[(model, name)] = str(e).replace(model, "MODEL")
                    except Exception as e:  # noqa: BLE001 - any other answer fails the gate
                        typed, answers[(model, name)] = False, f"{type(e).__name__}: {e}"
            refused = all(v != "ANSWERED" for v in answers.values()) and typed
            same = all(answers[("a/policy", n)] == answers[("a/no-such-model", n)]
                       for n in ("fetch", "fetch_v1", "latest", "versions", "publish"))
            unchanged = (op.versions("a/policy"), op.models()) == seen
            hidden = "a/policy" not in b.models() and "a/policy" not in b.stats()["models"]
        finally:
            for c in (a, b):
                c.leave()
    return {"cross_tenant_read_refused": bool(refused and same and unchanged and hidden), "refused_typed": refused,
            "existence_hidden": same and hidden, "hub_unchanged": unchanged,
            "sample_refusal": answers[("a/policy", "fetch")], "loadavg": _load()}


@register_scenario("tenants_hub")
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsync.bench tenants_hub", description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mb", type=float, default=32.0, help="each tenant's model (MB)")
    p.add_argument("--seconds", type=float, default=8.0, help="saturation window per configuration (s)")
    p.add_argument("--shares", default="3,1", help="tenant a's and b's configured shares")
    p.add_argument("--json", help="write every figure here")
    a = p.parse_args(argv)
    shares = tuple(float(x) for x in a.shares.split(","))
    res = {"quota_shares": quota_shares(a.size_mb, a.seconds, shares), "cross_tenant": cross_tenant_read()}
    res["quota_share_error_max"] = res["quota_shares"]["quota_share_error_max"]
    res["cross_tenant_read_refused"] = res["cross_tenant"]["cross_tenant_read_refused"]
    q = res["quota_shares"]
    print(f"shares configured {q['configured_share']}  served under contention {q['served_share_contended']}  "
          f"error max {q['quota_share_error_max']:.3f} (unscheduled baseline {q['baseline_share_error_max']:.3f})")
    print(f"rate scheduled {q['rate_gbytes_s_scheduled']} GB/s, unscheduled {q['rate_gbytes_s_unscheduled']} GB/s "
          f"(ratio {q['rate_ratio_scheduled_vs_unscheduled']}); load {q['loadavg_before']} -> {q['loadavg_after']}")
    print(f"cross-tenant read refused: {res['cross_tenant_read_refused']} ({res['cross_tenant']['sample_refusal']})")
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0
