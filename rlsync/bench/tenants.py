"""`python -m rlsync.bench tenants`: a pool of HF engines serving many tenants' LoRA adapters over one base.

    python -m rlsync.bench tenants [--model smollm2|tiny] [--tenants 32] [--revisions 4] [--trials 40]
                                   [--updates 1000] [--dtype bf16|fp32] [--threads 1]
                                   [--json F]

One embedded hub; a trainer client publishes the base once (`policy` v0) and, per tenant t, adapter revisions
as versions of its own model `policy.lora.t` (rlsync/sync/hub_adapter.py: the base version inside each adapter's
bytes). A pool of two HF engines (rollout/adapters.py, peft slots; each its own hub client, in this process)
takes adapters straight from the hub into slots; one intra-op thread, and `serving_gc()` once all is built, as a rollout
worker. The base in bf16 by default (`--dtype bf16`), exactly as a run's adapter pool with `sync.variant=bf16` serves
it: the trainer publishes its fp32 base, each engine is loaded in fp32 as the run's model loader does, and the run's
receiver (`choose_route` -> hub_adapter) casts the engine's base to bf16 once and reads `policy@bf16` (derived once by
the first engine, read from it by the other); adapters stay fp32. `--dtype fp32`: the base as published (`sync.variant`
none). Figures (engine side of issue 34 item 3):

- `resident_adapters`: tenants x revisions resident on the pool at once (engine 0's LRU bound is set above
  it), each slot checked bit for bit against what its tenant published (`resident_verified`);
- `publish_to_first_token_{p50,p95}_ms`: a tenant publishes a new revision; the engine fetches it into a slot
  and a request (one prompt, greedy) samples its first token with it: time to first token, streamed out of
  `generate`, not the whole call (`publish_to_response_p95_ms`: + the re-score forward). Baseline in the same
  run: the first token on an adapter already resident (`first_token_resident_p95_ms`), and the ratio;
  `publish_to_resident_p95_ms` is the publish, fetch and slot alone (what the weights' path adds), and
  `publish_to_first_token_parts_p95_ms` splits the figure into publish, fetch and prefill;
- `evicted_restore_s`: engine 0 evicts an adapter (LRU pressure from other tenants) that engine 1 and the
  trainer still hold; the next request for it fetches it again (`evicted_restore_sources`: who served it);
  beside it the first fetch of the same adapter (`first_fetch_s`);
- `request_kept_revision`: a request under tenant A's revision k runs while revision k+1 is published and
  fetched into the same engine; its log-probs equal those of revision k alone;
- `isolation_drift_bits`: tenant B's greedy log-probs (as fp32, compared bit for bit) checked every
  `--check-every` of `--updates` interleaved revisions of tenant A, each fetched into the same engine (when A's
  revisions have pushed B out of the LRU, the check fetches B again first: `isolation_b_restored`).

The hub-side figures (`quota_share_error_max`, `cross_tenant_read_refused`) come from
rlsync/bench/tenants_hub.py when that module is present (the tenants' credentials and quotas); without it
they are left out and the output says so. The load average is written beside the figures.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import time

from . import register_scenario

log = logging.getLogger(__name__)

LORA = dict(lora_rank=8, lora_alpha=16.0, lora_targets=("q_proj", "v_proj"))
PROMPT = "What is 3 + 4? Reply with just the number."


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


VARIANT = {"fp32": "none", "bf16": "bf16"}
"""--dtype -> the run's `sync.variant` the pool is served with (the base always published fp32, as the trainer does)."""


def _model(kind: str):
    """(HF model in fp32, as a run's model loader builds it, prompt token ids) of `kind`."""
    import torch

    if kind == "tiny":
        from rlsync.rollout import TinyModelConfig, build_tiny_model

        torch.manual_seed(0)
        return build_tiny_model(TinyModelConfig(arch="llama"), vocab_size=64).eval(), [3, 9, 4, 12, 7, 5]
    from rlsync.rollout import load_smollm2

    m, tok = load_smollm2(cache_dir=os.path.expanduser("~/.cache/rlsync/smollm2"))
    text = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=False)
    return m.eval(), list(tok(text)["input_ids"])


class _Engine:
    """One engine of the pool: an HF engine with adapter slots, its own hub client and the run's adapter receiver."""

    def __init__(self, kind: str, hub, name: str, max_resident: int, dtype: str = "fp32"):
        from rlsync.core.stall import StallClock
        from rlsync.hub import HubClient, Location
        from rlsync.rollout import RolloutEngine
        from rlsync.sync import RunShape, Side, SyncConfig, choose_route

        model, self.prompt = _model(kind)
        self.engine = RolloutEngine(RolloutEngine.Config(max_new_tokens=1, do_sample=False), model,
                                    pad_token_id=0, eos_token_id=-1)
        self.client = HubClient(hub.address, token=hub.token)
        self.client.join(Location(host=name), name=name)
        sync, shape = SyncConfig(max_adapters=max_resident, variant=VARIANT[dtype]), RunShape(**LORA)
        side = Side(sync=sync, model="policy", hub=self.client, clock=StallClock(name, "rollout"),
                    hub_address=hub.address, shape=shape)
        self.rcv = choose_route(sync, shape).receiver(side, self.engine)  # hub_adapter, as in a run

    def first_token(self, key) -> tuple[float, float]:
        """A request under adapter `key` (resident): (when its first token was sampled, when it returned), as
        `perf_counter` times. The first token is streamed out of `generate` (HF `BaseStreamer`), so its time is
        the prefill alone, not the call's re-score forward that follows (the behaviour log-probs)."""
        from transformers.generation.streamers import BaseStreamer

        class FirstToken(BaseStreamer):
            at = None

            def put(self, value):  # the prompt first, then each sampled token
                self.puts = getattr(self, "puts", 0) + 1
                if self.puts == 2:
                    self.at = time.perf_counter()

            def end(self):
                pass

        s = FirstToken()
        self.engine.generate([self.prompt], adapter=key, streamer=s)
        return s.at, time.perf_counter()

    def greedy_logprobs(self, key):
        """Greedy 8 tokens under `key`, then their fp32 log-probs (the isolation gate's numbers)."""
        from rlsync.core.logprobs import token_logprobs

        self.engine.config.max_new_tokens = 8
        try:
            out = self.engine.generate([self.prompt], adapter=key)
        finally:
            self.engine.config.max_new_tokens = 1
        with self.engine.adapters.use(key):
            lp, _ = token_logprobs(self.engine.model, out.input_ids, out.attention_mask)
        return (lp * out.response_mask).float()


class _Tenants:
    """The trainer side: the base published once, then each tenant's adapter revisions (live tensors, released
    before they are rewritten: the mutability contract)."""

    def __init__(self, hub, kind: str, names: dict, n: int):
        import torch

        from rlsync.hub import HubClient, Location
        from rlsync.sync.hub_adapter import ADAPTER_BASE

        model, _ = _model(kind)
        self.client = HubClient(hub.address, token=hub.token)
        self.client.join(Location(host="trainer"), name="trainer")
        self.client.publish("policy", 0, {k: p.data for k, p in model.named_parameters()})
        self.model = model
        self.record = {ADAPTER_BASE: torch.zeros(1, dtype=torch.int64)}
        self.live = [{k: torch.zeros(s, dtype=d) for k, (s, d) in names.items()} for _ in range(n)]
        self.version = [-1] * n
        self.ready: dict[int, dict | None] = {}  # a tenant's stepped values, until published
        self.bytes = sum(t.numel() * t.element_size() for t in self.live[0].values())

    @staticmethod
    def model_of(t: int) -> str:
        from rlsync.sync.hub_adapter import adapter_model

        return adapter_model("policy", f"t{t}")

    def step(self, t: int) -> None:
        """Tenant t's training step: its next revision's values (new random adapter values), computed into a
        buffer of their own (the live adapter still holds the published revision, which peers may be reading)."""
        import torch

        g = torch.Generator().manual_seed(1000 * t + self.version[t] + 1)
        self.ready[t] = {n: torch.randn(x.shape, generator=g) * 0.02 for n, x in self.live[t].items()}

    def publish(self, t: int) -> int:
        """Tenant t's next revision, as the hub_adapter route publishes it (release the previous one, write the
        stepped values into the live adapter, publish); its version. Steps first when `step` was not called."""
        if self.ready.get(t) is None:
            self.step(t)
        if self.version[t] >= 0:
            self.client.release(self.model_of(t), self.version[t])
        self.version[t] += 1
        for n, x in self.live[t].items():
            x.copy_(self.ready[t][n])
        self.ready[t] = None
        self.client.publish(self.model_of(t), self.version[t], {**self.live[t], **self.record})
        return self.version[t]


def run(kind: str, tenants: int, revisions: int, trials: int, updates: int, check_every: int,
        save=lambda out: None, dtype: str = "fp32") -> dict:
    """Every figure; `save(out)` is called after each phase (a run cut short keeps what it measured)."""
    import torch

    from rlsync.hub import HubConfig, RetentionConfig, start_embedded_hub

    load_before = _load()
    # every revision of a tenant stays fetchable by number (an engine may ask for any it evicted)
    hub = start_embedded_hub(config=HubConfig(retention=RetentionConfig(retain_last=revisions + 2)))
    cap = tenants * revisions + 8
    pool = [_Engine(kind, hub, "e0", cap, dtype), _Engine(kind, hub, "e1", cap, dtype)]
    e0, e1 = pool
    names = e0.engine.adapters.shapes()
    tr = _Tenants(hub, kind, names, tenants)
    from rlsync.rollout import serving_gc

    serving_gc()  # this process serves from here on, as a rollout worker does after its start-up
    out: dict = {"model": kind, "dtype": dtype, "torch_threads": torch.get_num_threads(), "tenants": tenants,
                 "revisions": revisions, "adapter_bytes": tr.bytes,
                 "lora": {k: list(v) if isinstance(v, tuple) else v for k, v in LORA.items()}}
    try:
        # ---- residency: tenants x revisions on engine 0, each checked against its tenant's bytes
        t0 = time.perf_counter()
        ok = True
        for r in range(revisions):
            for t in range(tenants):
                v = tr.publish(t)
                e0.rcv.take(tr.model_of(t), v, use=False)
                got = e0.engine.adapters.tensors_of((tr.model_of(t), v))
                ok &= all(torch.equal(got[k], x) for k, x in tr.live[t].items())
        out["resident_adapters"] = len(set(e0.engine.adapters.resident()) | set(e1.engine.adapters.resident()))
        out["resident_verified"], out["fill_s"] = bool(ok), time.perf_counter() - t0
        out["base_served"] = {"model": e0.rcv.base_held, "dtypes": sorted({str(x.dtype) for x in
                              e0.engine.adapters.base_tensors().values()}),
                              "derivations": sum(e.rcv.reader.derivations for e in pool if e.rcv.reader)}
        out["load_now"] = _load()
        save(out)
        # ---- publish -> first token on the new revision, vs the first token on a resident adapter
        e0.engine.adapters.max_resident = cap  # the slots exist: new revisions reuse the LRU ones
        ph = {k: [] for k in ("first_token", "publish", "fetch", "prefill", "response", "resident")}
        for i in range(trials):
            t = i % tenants
            tr.step(t)  # the tenant's training step: not part of publish -> first token
            t1 = time.perf_counter()
            v = tr.publish(t)
            t2 = time.perf_counter()
            e0.rcv.take(tr.model_of(t), v, use=False)
            t3 = time.perf_counter()
            first, done = e0.first_token((tr.model_of(t), v))
            for k, x in (("first_token", first - t1), ("publish", t2 - t1), ("fetch", t3 - t2),
                         ("prefill", first - t3), ("response", done - t1)):
                ph[k].append(x)
            t4 = time.perf_counter()
            ph["resident"].append(e0.first_token((tr.model_of(t), v))[0] - t4)
        out["publish_to_first_token_p50_ms"] = 1e3 * _pct(ph["first_token"], 0.5)
        out["publish_to_first_token_p95_ms"] = 1e3 * _pct(ph["first_token"], 0.95)
        out["first_token_resident_p95_ms"] = 1e3 * _pct(ph["resident"], 0.95)
        out["publish_to_resident_p95_ms"] = 1e3 * _pct([a + b for a, b in zip(ph["publish"], ph["fetch"])], 0.95)
        out["publish_to_first_token_ratio_vs_resident_p95"] = _pct(ph["first_token"], 0.95) / _pct(ph["resident"], 0.95)
        # where the time goes: publish (trainer), fetch into a slot (engine), prefill to the first token; and the
        # whole request (the re-score forward for the behaviour log-probs included), which is not the figure
        out["publish_to_first_token_parts_p95_ms"] = {k: 1e3 * _pct(ph[k], 0.95) for k in ("publish", "fetch", "prefill")}
        # every trial, in order: which part a slow one lost its time in (the p95 of 40 is the third slowest)
        out["publish_to_first_token_trials_ms"] = {k: [round(1e3 * x, 1) for x in ph[k]] for k in ph}
        out["publish_to_response_p95_ms"] = 1e3 * _pct(ph["response"], 0.95)
        out["load_now"] = _load()
        save(out)
        # ---- evicted adapter restored: engine 1 and the trainer hold it, engine 0 evicts it, then asks again
        t = 0
        key = (tr.model_of(t), tr.version[t])
        t1 = time.perf_counter()
        e1.rcv.take(*key, use=False)
        out["first_fetch_s"] = time.perf_counter() - t1
        e0.rcv.take(*key, use=False)
        ev0 = e0.engine.adapters.evictions
        k = 1
        while e0.engine.adapters.has(key):  # LRU pressure: other tenants' new revisions
            tt = 1 + k % (tenants - 1)
            e0.rcv.take(tr.model_of(tt), tr.publish(tt), use=False)
            k += 1
        t1 = time.perf_counter()
        by = e0.rcv.take(*key, use=False)
        out["evicted_restore_s"] = time.perf_counter() - t1
        out["evicted_restore_sources"] = {("peer" if s == e1.client.worker_id else "trainer"
                                           if s == tr.client.worker_id else s): n for s, n in by.items()}
        out["evictions"] = e0.engine.adapters.evictions - ev0
        out["load_now"] = _load()
        save(out)
        # ---- a request finishes on the revision it started with: A's next revision lands in another slot meanwhile
        import threading

        ka = (tr.model_of(0), tr.version[0])
        if not e0.engine.adapters.has(ka):
            e0.rcv.take(*ka, use=False)
        before = e0.greedy_logprobs(ka)
        seen = {}
        req = threading.Thread(target=lambda: seen.update(lp=e0.greedy_logprobs(ka)))
        req.start()
        e0.rcv.take(tr.model_of(0), tr.publish(0), use=False)
        req.join()
        out["request_kept_revision"] = bool(torch.equal(seen["lp"], before))
        out["load_now"] = _load()
        save(out)
        # ---- isolation: tenant B's greedy log-probs across tenant A's interleaved updates
        a, b = 0, 1 % tenants
        kb = (tr.model_of(b), tr.version[b])
        if not e0.engine.adapters.has(kb):
            e0.rcv.take(*kb, use=False)
        ref = e0.greedy_logprobs(kb).view(torch.int32)
        drift, checks, restored = 0, 0, 0
        t1 = time.perf_counter()
        for i in range(1, updates + 1):
            v = tr.publish(a)
            e0.rcv.take(tr.model_of(a), v, use=False)
            if i % check_every == 0 or i == updates:
                if not e0.engine.adapters.has(kb):  # A's revisions pushed B out (LRU): a request fetches it again
                    e0.rcv.take(*kb, use=False)
                    restored += 1
                now = e0.greedy_logprobs(kb).view(torch.int32)
                x = (ref ^ now) if now.shape == ref.shape else torch.full_like(ref, -1)
                drift += sum(bin(int(w) & 0xFFFFFFFF).count("1") for w in x.flatten().tolist())
                checks += 1
        out["isolation_drift_bits"], out["isolation_updates"], out["isolation_checks"] = drift, updates, checks
        out["isolation_b_restored"] = restored  # checks that found B evicted and fetched it again first
        out["isolation_s"] = time.perf_counter() - t1
    finally:
        for e in pool:
            e.client.leave()
        tr.client.leave()
        hub.stop()
    out.update(_hub_part())
    out["load_before"], out["load_after"], out["cpus"] = load_before, _load(), os.cpu_count()
    return out


def _hub_part() -> dict:
    """quota_share_error_max and cross_tenant_read_refused from tenants_hub.py (the tenants' hub side), if present."""
    try:
        from .tenants_hub import cross_tenant_read, quota_shares
    except ImportError:
        return {"hub_part": "left out: rlsync/bench/tenants_hub.py is not in this tree"}
    return {**quota_shares(), **cross_tenant_read()}


@register_scenario("tenants")
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsync.bench tenants", description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2", help="base model of the pool")
    p.add_argument("--tenants", type=int, default=32, help="tenants, each its own adapter model")
    p.add_argument("--revisions", type=int, default=4, help="revisions per tenant made resident at once")
    p.add_argument("--trials", type=int, default=40, help="publish -> first token trials")
    p.add_argument("--updates", type=int, default=1000, help="tenant A's updates in the isolation gate")
    p.add_argument("--check-every", type=int, default=10, help="tenant B re-checked every N of A's updates")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (1: under other load, 2 threads on 2 cores wait on each other)")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16",
                   help="the engines' base: bf16 = a run's sync.variant=bf16 (the trainer's fp32 base derived once "
                        "into policy@bf16; adapters stay fp32), fp32 = the base as published (sync.variant none)")
    p.add_argument("--json", help="write every figure here")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import torch

    torch.set_num_threads(a.threads)
    def save(out: dict) -> None:
        if a.json:
            os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)

    res = run(a.model, a.tenants, a.revisions, a.trials, a.updates, a.check_every, save, a.dtype)
    print(f"tenants: {a.model} {a.dtype}, {a.tenants} tenants x {a.revisions} revisions, adapter {res['adapter_bytes'] / 1e6:.2f} MB "
          f"(load {res['load_before']} -> {res['load_after']}, {res['cpus']} cpus)")
    print(f"  resident_adapters {res['resident_adapters']} (target >= 128; verified {res['resident_verified']})")
    print(f"  publish_to_first_token p50 {res['publish_to_first_token_p50_ms']:.1f} ms p95 "
          f"{res['publish_to_first_token_p95_ms']:.1f} ms (target <= 250; resident first token p95 "
          f"{res['first_token_resident_p95_ms']:.1f} ms, ratio {res['publish_to_first_token_ratio_vs_resident_p95']:.2f}; "
          f"publish -> resident p95 {res['publish_to_resident_p95_ms']:.1f} ms)")
    print(f"  evicted_restore_s {res['evicted_restore_s']:.3f} (target <= 1; first fetch {res['first_fetch_s']:.3f} s; "
          f"from {res['evicted_restore_sources']})")
    print(f"  isolation_drift_bits {res['isolation_drift_bits']} over {res['isolation_updates']} updates of tenant A, "
          f"{res['isolation_checks']} checks (target 0)")
    print(f"  request_kept_revision {res['request_kept_revision']} (a request under A vk while A vk+1 is fetched)")
    print(f"  {res.get('hub_part') or {k: res[k] for k in ('quota_share_error_max', 'cross_tenant_read_refused') if k in res}}")
    save(res)
    return 0
