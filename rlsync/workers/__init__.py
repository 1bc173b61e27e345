"""rlsync.workers: the run's Ray actors, one per file, and their common lifecycle.

    group.py           WorkerGroup (start, add, remove, kill), process set-up, the hub client workers join with
    policy.py          build_policy / build_task: the model and task every process builds the same way
    trainer_worker.py  TrainerWorker: one trainer rank (step, publish, elastic re-form)
    rollout_worker.py  RolloutWorker: fetch from the hub into the engine, generate, score
    seed_worker.py     SeedWorker: keeps `latest` in one DC, takes hand-offs
    trainer_group.py   TrainerGroup: the trainer ranks as one group (static or elastic; elastic.py: its config)

These speak to the hub on the trainer's and rollout's behalf, through the run's weight-sync route
(rlsync/sync/: `TrainerWorker.publisher`, `RolloutWorker.receiver`; docs/architecture.md): `rlsync.trainer`
and `rlsync.rollout` never import the hub or each other.
"""
