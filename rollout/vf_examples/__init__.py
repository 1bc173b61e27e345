"""Small verifiers environments that run offline, written against verifiers' own API (`verifiers.v1`).

No verifiers environment on PyPI both installs beside verifiers 0.4.0 and runs without a download
(docs/extending.md lists the ones tried), so these show the `verifiers` task end to end:

    task.name=verifiers task.args.env=rlsync_arithmetic          # single-turn: a Taskset, its @vf.reward
    task.name=verifiers task.args.env=rlsync_arithmetic_retry    # multi-turn: an Env whose run() gives feedback

Each module exports its Taskset (and Env) through `__all__`, as a verifiers environment package does;
importing one imports verifiers (the `tasks` extra).
"""
