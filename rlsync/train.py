"""`python -m rlsync.train +recipe=grpo_standalone [key=value ...]`: run the RL loop (Hydra entry point).

    python -m rlsync.train +recipe=grpo_standalone run_dir=runs/r1            # train; metrics, train.log in runs/r1
    python -m rlsync.train +recipe=grpo_standalone --cfg job                  # print the config the run would use
    python -m rlsync.train --help                                             # every key, its default and doc
    python -m rlsync.train +recipe=grpo_standalone run_dir=runs/r1 resume=auto steps=300

The configs ship inside the package (`rlsync.configs`), so this works from any directory. The schema
(every field typed and documented) is `rlsync.config.schema.TrainConfig`; docs/rl.md walks through it.
`run_dir=X` and `hydra.run.dir=X` both make X the run dir (configs/train.yaml); with neither, Hydra's
`runs/<date>/<time>/`.
"""

from __future__ import annotations

import logging
import sys
import time

import hydra
from omegaconf import DictConfig, OmegaConf

from rlsync.config.compose import register_configs, to_config, unknown_override
from rlsync.core.errors import ConfigError
from rlsync.core.registry import UnknownNameError
from rlsync.workers.process import CHATTER
from rlsync.hub.logs import quiet_console

log = logging.getLogger("rlsync.train")
register_configs()
# configs/train.yaml: hydra.run.dir is `run_dir` when set (train.log beside metrics.jsonl), else the default folder
OmegaConf.register_new_resolver("rlsync_run_dir", lambda run_dir, default: run_dir or default, replace=True)


@hydra.main(config_path="pkg://rlsync.configs", config_name="train", version_base=None)
def main(dcfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    quiet_console(CHATTER)  # Hydra's own file handler (<run dir>/train.log) keeps them
    cfg = _checked(dcfg)
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


def _checked(dcfg: DictConfig):
    try:
        return to_config(dcfg)
    except (ConfigError, UnknownNameError) as e:  # before Ray starts: the key and the valid choices
        sys.exit(f"error: {e}")


def print_job_config(overrides: list[str]) -> None:
    """`--cfg job`: the config as the run would use it (after `to_config`: task args completed with the task's
    defaults, plugin paths made absolute), not Hydra's composition before those steps."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="rlsync.configs", version_base=None):
        cfg = _checked(compose(config_name="train", overrides=overrides))
    print(OmegaConf.to_yaml(OmegaConf.structured(cfg)), end="")


def _cfg_job(args: list[str]) -> list[str] | None:
    """The overrides of a `--cfg job` / `-c job` command line (`--resolve` is implied), or None."""
    for i, a in enumerate(args):
        if a in ("--cfg", "-c") and args[i + 1:i + 2] == ["job"]:
            return [x for x in args[:i] + args[i + 2:] if x != "--resolve"]
        if a == "--cfg=job":
            return [x for x in args[:i] + args[i + 1:] if x != "--resolve"]
    return None


if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--help" in argv or "-h" in argv:
        from rlsync.config.help import help_text

        print(help_text(), end="")
        sys.exit(0)
    for arg in argv:
        if why := unknown_override(arg):
            sys.exit(f"error: {why}")
    if (overrides := _cfg_job(argv)) is not None:
        print_job_config(overrides)
        sys.exit(0)
    main()
