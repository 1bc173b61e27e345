"""`python -m rlsync.train +recipe=grpo_standalone [key=value ...]`: run the RL loop (Hydra entry point).

    python -m rlsync.train +recipe=grpo_standalone hydra.run.dir=runs/r1      # train, logs in runs/r1
    python -m rlsync.train +recipe=grpo_standalone --cfg job                  # print the resolved config
    python -m rlsync.train +recipe=grpo_standalone hydra.run.dir=runs/r1 resume=auto steps=300

The configs ship inside the package (`rlsync.configs`), so this works from any directory. The schema
(every field typed and documented) is `rlsync.config.schema.TrainConfig`; docs/rl.md walks through it.
"""

from __future__ import annotations

import logging
import sys
import time

import hydra
from omegaconf import DictConfig

from rlsync.config.compose import register_configs, to_config, unknown_override
from rlsync.core.errors import ConfigError
from rlsync.core.registry import UnknownNameError
from rlsync.workers.process import CHATTER
from rlsync.hub.logs import quiet_console

log = logging.getLogger("rlsync.train")
register_configs()

@hydra.main(config_path="pkg://rlsync.configs", config_name="train", version_base=None)
def main(dcfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    quiet_console(CHATTER)  # Hydra's own file handler (<run dir>/train.log) keeps them
    try:
        cfg = to_config(dcfg)
    except (ConfigError, UnknownNameError) as e:  # before Ray starts: the key and the valid choices
        sys.exit(f"error: {e}")
    # the run machinery (Ray, the hub, the workers, rich) only once the config is valid: a bad value fails fast
    from rlsync.driver import Driver
    from rlsync.driver.interrupt import EXIT_INTERRUPTED, GracefulStop
    from rlsync.telemetry.summary import print_run_summary, summarize_run

    run_dir = cfg.run_dir or HydraConfig.get().runtime.output_dir
    driver, t0 = Driver(cfg, run_dir), time.monotonic()
    with GracefulStop(driver, run_dir) as stop:  # Ctrl-C / SIGTERM: stop at the next loop turn, then wind down
        try:
            driver.run()
        except KeyboardInterrupt:  # during start-up
            stop.signalled = stop.signalled or "KeyboardInterrupt"
    print_run_summary(summarize_run(run_dir, getattr(driver, "totals", None), time.monotonic() - t0,
                                    status=f"interrupted ({stop.signalled})" if stop.signalled else "done"))
    if stop.signalled:
        log.warning("interrupted: workers, hub and temp dirs cleaned up; run dir %s (resume=auto continues)", run_dir)
        sys.exit(EXIT_INTERRUPTED)
    log.info("done: run dir %s", run_dir)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        if why := unknown_override(arg):
            sys.exit(f"error: {why}")
    main()
