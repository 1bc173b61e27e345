"""`python -m rlsync.train +recipe=grpo_standalone [key=value ...]`: run the RL loop (Hydra entry point).

    python -m rlsync.train +recipe=grpo_standalone hydra.run.dir=runs/r1      # train, logs in runs/r1
    python -m rlsync.train +recipe=grpo_standalone --cfg job                  # print the resolved config
    python -m rlsync.train +recipe=grpo_standalone hydra.run.dir=runs/r1 resume=auto steps=300

The configs ship inside the package (`rlsync.configs`), so this works from any directory. The schema
(every field typed and documented) is `rlsync.config.TrainConfig`; docs/rl.md walks through it.
"""

from __future__ import annotations

import logging
import signal
import sys

import hydra
from omegaconf import DictConfig

from rlsync.config import CHATTER, ConfigError, register_configs, to_config, unknown_override
from rlsync.core.registry import UnknownNameError
from rlsync.hub.logs import quiet_console

log = logging.getLogger("rlsync.train")
register_configs()

def _interrupt(signum, _frame) -> None:
    raise KeyboardInterrupt


@hydra.main(config_path="pkg://rlsync.configs", config_name="train", version_base=None)
def main(dcfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from rlsync.driver import Driver

    quiet_console(CHATTER)  # Hydra's own file handler (<run dir>/train.log) keeps them
    try:
        cfg = to_config(dcfg)
    except (ConfigError, UnknownNameError) as e:  # before Ray starts: the key and the valid choices
        sys.exit(f"error: {e}")
    run_dir = cfg.run_dir or HydraConfig.get().runtime.output_dir
    signal.signal(signal.SIGTERM, _interrupt)  # like Ctrl-C: the driver's clean-up runs
    try:
        summary = Driver(cfg, run_dir).run()
    except KeyboardInterrupt:
        log.warning("interrupted: workers, hub and temp dirs cleaned up; run dir %s (resume=auto continues)", run_dir)
        sys.exit(130)
    log.info("done: %s; run dir %s", {k: round(v, 4) for k, v in summary.items()}, run_dir)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        if why := unknown_override(arg):
            sys.exit(f"error: {why}")
    main()
