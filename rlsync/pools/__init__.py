"""rlsync.pools: elastic rollout pools.

    pool_set.py   PoolSet: every pool's members and lifecycle, what the driver talks to
    policies.py   pool policies (fixed, spot, autoscale) in a registry; the churn schedule and autoscale rule
    attach.py     the job file and the job's PoolRegistry actor (attach pools from another terminal)
    __main__.py   `python -m rlsync.pools join|list|leave`
"""
