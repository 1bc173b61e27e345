"""Max-min fair sharing of links among flows (progressive filling). Pure arithmetic, no state.

Every active flow crosses a set of links; each link has a capacity (bytes/s). Rates grow together
from zero; a link that fills freezes every flow crossing it, a flow that reaches its own cap (a relay
that may not run ahead of its upstream) freezes alone, and the others keep growing. The result is
the max-min fair allocation: no flow can go faster without slowing one that is no faster than it.

    >>> rates = max_min_rates({"a": (["nic0"], None), "b": (["nic0", "wan"], None), "c": (["wan"], 1.0)},
    ...                       {"nic0": 10.0, "wan": 4.0})
    >>> {k: round(v, 6) for k, v in sorted(rates.items())}
    {'a': 7.0, 'b': 3.0, 'c': 1.0}

Here `c` is capped at 1, so `b` gets the rest of the WAN (3) and `a` the rest of the NIC (7).
A flow that crosses no link is limited only by its cap (infinite rate without one is refused).
"""
from __future__ import annotations

import math
from typing import Hashable, Iterable, Mapping

EPS = 1e-9


def max_min_rates(flows: Mapping[Hashable, tuple[Iterable[Hashable], float | None]],
                  capacity: Mapping[Hashable, float]) -> dict[Hashable, float]:
    """`flows`: id -> (links it crosses, cap or None). `capacity`: link -> bytes/s. Returns id -> rate."""
    links_of: dict = {}
    cap: dict = {}
    users: dict = {}
    for f, (links, c) in flows.items():
        ls = tuple(dict.fromkeys(links))
        for link in ls:
            if link not in capacity:
                raise KeyError(f"flow {f!r} crosses unknown link {link!r}")
            users.setdefault(link, []).append(f)
        if not ls and c is None:
            raise ValueError(f"flow {f!r} crosses no link and has no cap: its rate would be infinite")
        links_of[f] = ls
        cap[f] = math.inf if c is None else max(0.0, float(c))
    rate: dict = {}
    # Flows that share no link with another are independent problems: solve each connected group
    # of flows alone (a relay chain is mostly such groups of one), so cost follows group sizes.
    seen: set = set()
    for f0 in flows:
        if f0 in seen:
            continue
        group, stack = [], [f0]
        seen.add(f0)
        while stack:
            f = stack.pop()
            group.append(f)
            for link in links_of[f]:
                for g in users[link]:
                    if g not in seen:
                        seen.add(g)
                        stack.append(g)
        if len(group) == 1:
            f = group[0]
            rate[f] = min([cap[f]] + [float(capacity[link]) for link in links_of[f]])
        else:
            rate.update(_fill(group, links_of, cap, users, capacity))
    return rate


def _fill(group: list, links_of: dict, cap: dict, users: dict, capacity: Mapping) -> dict:
    """Progressive filling of one connected group of flows."""
    rate = {f: 0.0 for f in group}
    glinks = {link for f in group for link in links_of[f]}
    left = {link: float(capacity[link]) for link in glinks}
    count = {link: len(users[link]) for link in glinks}
    active = set(group)
    for f in [f for f in active if cap[f] <= EPS]:  # flows capped at zero never move
        _freeze(f, active, links_of, count)
    while active:
        step = math.inf
        for link, n in count.items():
            if n:
                step = min(step, left[link] / n)
        for f in active:
            step = min(step, cap[f] - rate[f])
        step = max(0.0, step)
        for f in active:
            rate[f] += step
        for link, n in count.items():
            if n:
                left[link] -= step * n
        full = [link for link, n in count.items() if n and left[link] <= EPS * max(1.0, capacity[link])]
        done = {f for link in full for f in users[link] if f in active}
        done |= {f for f in active if rate[f] >= cap[f] - EPS * max(1.0, cap[f])}
        if not done:  # numerical safety: never loop without progress
            break
        for f in done:
            _freeze(f, active, links_of, count)
    return rate


def _freeze(f, active: set, links_of: dict, count: dict) -> None:
    active.discard(f)
    for link in links_of[f]:
        count[link] -= 1
