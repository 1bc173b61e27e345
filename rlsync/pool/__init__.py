"""rlsync.pool: elastic rollout pools (a library room; its command line is `python -m rlsync.pools`).

    pool_set.py   PoolSet: every pool's members and lifecycle, what the driver talks to
    policies.py   pool policies (fixed, spot, autoscale) in a registry; the churn schedule and autoscale rule
    churn.py      the churn schedule and autoscale rule (pure)
    attach.py     the job file and the job's PoolRegistry actor (attach pools from another terminal)
"""
