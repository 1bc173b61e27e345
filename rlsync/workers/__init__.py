"""rlsync.workers: the run's Ray actors, one per file, and their common lifecycle.

    process.py         what every worker starts with: ProcessSetup, HubAccess, LocationConfig, the hub client (no Ray)
    group.py           WorkerGroup (start, add, remove, kill)
    policy.py          build_policy / build_task: the model and task every process builds the same way (+ their sections)
    trainer_worker.py  TrainerWorker: one trainer rank (step, publish, elastic re-form)
    rollout_worker.py  RolloutWorker: fetch from the hub into the engine, generate, score
    seed_worker.py     SeedWorker: keeps `latest` in one DC, takes hand-offs
    trainer_group.py   TrainerGroup: the trainer ranks as one group (static or elastic; elastic.py: its config)

These speak to the hub on the trainer's and rollout's behalf, through the run's weight-sync route
(rlsync/sync/: `TrainerWorker.publisher`, `RolloutWorker.receiver`; docs/architecture.md): `rlsync.trainer`
and `rlsync.rollout` never import the hub or each other. Each actor is built from its own config sections
plus the hub's address (`HubAccess`) and `ProcessSetup`, never the whole `TrainConfig`: this room never
imports `rlsync.config` (pyproject's import contracts).
"""
