"""A discrete-event simulator of weight sync at scales this machine cannot run (issue 23, DESIGN §7).

`python -m rlsync.sim validate | paper | federation | cost` (see __main__.py and docs/scale.md). The real hub state
machine (`rlsync.hub.state.HubState`, hence the real planner and retention code) makes every
decision; the simulator only moves bytes over modelled links:

    fairshare.py   max-min fair sharing of links among flows (pure arithmetic)
    network.py     nodes, racks, DCs, WAN: the links a transfer crosses and their capacities
    engine.py      the event loop; flows, and relay flows pipelined behind their upstream
    cluster.py     simulated workers driving an in-process HubState on the simulated clock
    scenarios.py   the emulated-topology benchmarks (rlsync/bench), replayed
    baselines.py   NCCL-style broadcast, trainer-only p2p, object store at any scale
    validate.py    simulated vs measured (a benchmark run's JSON)
    paper.py       the paper's three workloads at its scale
    cost.py        tokens and reward per dollar, spot vs on-demand (a price model; pure arithmetic)

Room: imports `rlsync.hub` only (never the RL side, never the benchmarks' process machinery).
"""
