"""rlsync.config: the run's configuration, at the top of the driver rooms (only the driver and the CLIs import it).

    schema.py    TrainConfig and the run-level sections (hub, ray, checkpoint, eval); it assembles the sections
                 declared beside their components (workers/, pools/, sync/)
    rules.py     value rules: each field's bounds, read from its metadata, and rules across fields
    compose.py   the Hydra store, `to_config`, `check_config`, `unknown_override`, the run's weight-sync route,
                 and what each actor is built from (its sections, never the whole config)
    help.py      `python -m rlsync.train --help`: every key with its type, default and declared docstring

Import from the modules (`from rlsync.config.schema import TrainConfig`); this package's namespace is empty.
"""
