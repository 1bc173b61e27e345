"""rlsync.core: the low room — what the trainer, rollout and the driver all need.

`Batch` (batch.py), the one `Registry` (registry.py), log-prob helpers (logprobs.py), the stall clock
(stall.py), typed records that cross process boundaries (events.py: `FetchEvent`, `RolloutResult`),
weight digests (digest.py), `ConfigError` (errors.py). It imports nothing above it (no driver file, no
trainer, no rollout, no hub), so `rlsync.trainer` and `rlsync.rollout` both import it without meeting
each other. An import-linter contract in pyproject.toml enforces this (tests/test_rooms.py).

Import from the modules (`from rlsync.core.batch import Batch`); this package's own namespace is
empty so that `import rlsync.core.stall` stays free of torch.
"""
