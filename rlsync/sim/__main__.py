"""`python -m rlsync.sim validate | paper`: the simulator's two jobs (docs/scale.md).

    python -m rlsync.sim validate --json outputs/sim/validate.json    # vs the stored benchmark runs
    python -m rlsync.sim validate --measure --json F                  # re-run the benchmarks first (root, heavy)
    python -m rlsync.sim paper --json outputs/sim/paper.json          # 1T model, 1,024 engines, 4 DCs
    python -m rlsync.sim paper --set engines=256 --only standalone    # any assumption changed
    python -m rlsync.sim federation --json outputs/sim/federation.json # 10 DCs: one hub vs a hub per DC
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rlsync.hub import cli_args as V


FRACTIONS = {"nic_efficiency": (False, True), "wan_efficiency": (False, True), "preempt_frac": (True, True)}
"""(0 allowed, 1 allowed) of the assumptions that are fractions; every other one is > 0, but for
`hub_service_ms` (< 0: measure the real HubState) and `order_seed` (-1: by name)."""


def assumption(text: str) -> str:
    """A `--set NAME=VALUE` of a PaperSetup field, its value of the field's type and in its range."""
    from dataclasses import fields

    from .paper import PaperSetup
    kinds = {f.name: f.type for f in fields(PaperSetup)}
    name, eq, raw = text.partition("=")
    if name not in kinds or not eq:
        raise V.Bad(f"{text!r}: want NAME=VALUE with NAME one of {', '.join(kinds)}")
    is_int = kinds[name] in ("int", int)
    v = V.number(raw, int if is_int else float)
    zero_ok, one_ok = FRACTIONS.get(name, (False, False))
    ok = (name == "hub_service_ms" or (name == "order_seed" and v >= -1)
          or (name in FRACTIONS and (v > 0 or zero_ok and v == 0) and (v < 1 or one_ok and v == 1))
          or (name not in FRACTIONS and v > 0))
    if not ok:
        want = "a fraction in [0, 1]" if name == "preempt_frac" else "in (0, 1]" if name in FRACTIONS else \
            ">= -1" if name == "order_seed" else "> 0"
        raise V.Bad(f"{name} must be {want}, got {raw!r}")
    return text


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsync.sim", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("validate", help="simulated vs measured, the four emulated-topology benchmarks")
    v.add_argument("--json", type=Path, help="write the table, max_rel_error and sources here")
    v.add_argument("--measured", type=lambda t: Path(V.existing_file(t)), help="a bundle of benchmark --json outputs (default: the stored one)")
    v.add_argument("--measure", action="store_true", help="run the four benchmarks now (root; minutes)")
    v.add_argument("--save-measured", type=Path, help="with --measure: also store the bundle here")
    v.add_argument("--rpc-ms", type=V.nonneg_float, default=2.0, help="control-plane round trip per hub RPC (ms)")
    pa = sub.add_parser("paper", help="the paper's three workloads at its scale vs the baselines")
    pa.add_argument("--json", type=Path)
    pa.add_argument("--set", type=assumption, action="append", default=[], metavar="NAME=VALUE",
                    help="change an assumption")
    pa.add_argument("--only", action="append", choices=["standalone", "elastic", "crossdc"])
    fe = sub.add_parser("federation", help="one cross-DC update over 10 DCs: one hub vs a hub per DC")
    fe.add_argument("--json", type=Path)
    fe.add_argument("--set", type=assumption, action="append", default=[], metavar="NAME=VALUE",
                    help="change a paper assumption (dcs=10 unless set)")
    fe.add_argument("--poll-ms", type=V.positive_float, default=50.0, help="the gateways' poll of the home hub's latest")
    co = sub.add_parser("cost", help="tokens and reward per dollar: a churning spot pool vs on-demand of equal cost")
    co.add_argument("--json", type=Path)
    co.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="change a PriceModel or JobModel field (rlsync/sim/cost.py)")
    a = p.parse_args(argv)
    if a.cmd == "cost":
        return _cost(a)
    if a.cmd == "validate":
        return _validate(a)
    if a.cmd == "federation":
        return _federation(a)
    return _paper(a)


def _cost(a) -> int:
    from dataclasses import fields, replace

    from . import cost as C
    price, job = C.PriceModel(), C.JobModel()
    for text in a.set:
        name, _, raw = text.partition("=")
        obj = price if name in {f.name for f in fields(price)} else job
        kinds = {f.name: f.type for f in fields(obj)}
        if name not in kinds:
            raise SystemExit(f"--set {text!r}: NAME is a field of PriceModel or JobModel (rlsync/sim/cost.py)")
        value = V.number(raw, int if kinds[name] in ("int", int) else float)
        price, job = (replace(price, **{name: value}), job) if obj is price else (price, replace(job, **{name: value}))
    res = C.compare(price, job)
    res["sweep"], res["balance"] = C.sweep(price, job), C.balance_sweep(price, job)
    print(f"{res['engines_on_demand']} on-demand engines vs {res['engines_spot']} spot (equal cost per hour): "
          f"spot/on-demand tokens/$ (reward/$ at equal final reward, spot_steps_factor {job.spot_steps_factor}), cold "
          f"joiners {res['tokens_per_dollar_ratio_spot_cold_vs_on_demand']:.3f} "
          f"({res['reward_per_dollar_ratio_spot_cold_vs_on_demand']:.3f}), warm "
          f"{res['tokens_per_dollar_ratio_spot_warm_vs_on_demand']:.3f} ({res['reward_per_dollar_ratio_spot_warm_vs_on_demand']:.3f})")
    for row in res["sweep"]:
        print(f"  preempt/h {row['preempt_per_h']}, notice {row['notice_fraction']}: cold {row['cold']}, warm {row['warm']}, "
              f"availability {row['availability_warm']}")
    for row in res["balance"]:
        print(f"  on-demand generation / train per step {row['gen_over_train_on_demand']}: cold {row['cold']}, warm {row['warm']}")
    _write(a.json, res)
    return 0


def _federation(a) -> int:
    from . import federation as F
    from .paper import parse_set
    setup = parse_set(["dcs=10", *a.set])
    t0 = time.monotonic()
    res = F.run(setup, a.poll_ms)
    res["elapsed_s"] = round(time.monotonic() - t0, 1)
    F.print_federation(res)
    _write(a.json, res)
    return 0


def _validate(a) -> int:
    from . import validate as V
    bundle = V.load_bundle(a.measured, a.measure)
    if a.measure and a.save_measured:
        a.save_measured.parent.mkdir(parents=True, exist_ok=True)
        a.save_measured.write_text(json.dumps(bundle, indent=1))
    res = V.result(bundle, a.rpc_ms / 1e3)
    V.print_table(res)
    _write(a.json, res)
    return 0 if res["within_10pct"] else 1


def _paper(a) -> int:
    from . import paper as P
    from .report import print_paper
    setup = P.parse_set(a.set)
    t0 = time.monotonic()
    res = P.run(setup, a.only)
    res["elapsed_s"] = round(time.monotonic() - t0, 1)
    print_paper(res)
    _write(a.json, res)
    return 0


def _write(path: Path | None, res: dict) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
