"""Printing the paper-scale results: every assumption, then one table per workload with the ratios."""
from __future__ import annotations

from dataclasses import fields

from .paper import GB, PaperSetup

PAPER = {"standalone": "paper: up to 6.7x lower total GPU stall than NCCL",
         "elastic": "paper: 4.8x faster weight update than UCX (trainer-only p2p)",
         "crossdc": "paper: 19x lower cross-DC rollout stall (baseline not named in /work/shared/seeds)"}
FIGURES = {"total_gpu_stall_s": "total GPU stall (GPU-s)", "seconds": "s until the last joiner holds it",
           "remote_gpu_stall_s": "remote engines' GPU stall (GPU-s)"}


def print_paper(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console(width=160)
    s = res["setup"]
    a = Table(title="assumptions (python -m rlsync.sim paper --set NAME=VALUE changes one)")
    for col in ("name", "value", "meaning"):
        a.add_column(col)
    for f in fields(PaperSetup):
        a.add_row(f.name, f"{s[f.name]:g}" if isinstance(s[f.name], float) else str(s[f.name]), _doc(f.name))
    c.print(a)
    c.print(f"derived: shard per GPU {res['shard_gb']:.1f} GB; {res['trainer_replicas']} trainer replicas of each "
            f"shard are sources; rollout GPUs {s['engines'] * s['engine_gpus']:,}; one rail simulated "
            f"(WAN per rail {s['wan_gbit_per_dc'] / s['engine_gpus']:.0f} Gbit/s); one transfer at NIC goodput "
            f"{res['shard_gb'] * GB / (s['nic_gbit'] * 1e9 / 8 * s['nic_efficiency']):.2f} s")
    c.print("model: max-min fair sharing of every link among active flows; relays pipelined one unit behind "
            "their upstream; the real HubState (planner, retention) plans every rlsync and p2p read; RPC "
            f"{s['rpc_ms']} ms round trip, hub time per request = "
            + ("the real call's CPU time here" if s['hub_service_ms'] < 0 else f"{s['hub_service_ms']} ms"))
    for name, w in res["workloads"].items():
        key = w["figure"]
        t = Table(title=f"{name}: {FIGURES[key]}")
        t.add_column("system")
        t.add_column(FIGURES[key], justify="right")
        t.add_column("mean wait (s)", justify="right")
        t.add_column("last (s)", justify="right")
        t.add_column("x rlsync", justify="right")
        for system, v in w["systems"].items():
            mean = v.get("mean_engine_wait_s", v.get("mean_remote_wait_s"))
            last = v.get("last_engine_s", v.get("last_remote_s"))
            ratio = "1" if system == "rlsync" else f"{w['ratio_vs_rlsync'][system]:.2f}"
            t.add_row(system, f"{v[key]:,.1f}", f"{mean:.2f}", f"{last:.2f}", ratio)
        c.print(t)
        c.print(PAPER[name] + "; not the same set-up: ours is every assumption above")
        if name == "elastic":
            c.print("NCCL broadcast: n/a (a static group cannot admit joiners without re-forming; not modelled)")
    c.print(f"elapsed {res.get('elapsed_s', 0)} s")


def _doc(name: str) -> str:
    import ast
    import inspect

    from . import paper
    src = inspect.getsource(paper.PaperSetup)
    tree = ast.parse(src)
    body = tree.body[0].body
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == name and i + 1 < len(body):
            nxt = body[i + 1]
            if isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant):
                return str(nxt.value.value).split("\n")[0]
    return ""
