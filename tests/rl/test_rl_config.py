"""Configs: every recipe composes into a typed TrainConfig; every field of the schema is documented."""
import ast
import inspect

import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException

from rlsync.config.compose import recipe_files, register_configs, to_config
from rlsync.config.schema import TrainConfig

RECIPES = sorted(recipe_files())  # every recipes/*.yaml and recipes/tests/*.yaml: a new recipe is tested by being there


def test_recipes_are_discovered_at_the_top_level_with_test_recipes_apart():
    assert {"grpo_standalone", "grpo_elastic", "grpo_crossdc", "ppo_standalone", "tests/tiny_e2e"} <= set(RECIPES)
    assert all(f.parent.name in ("recipes", "tests") for f in recipe_files().values())


def test_a_derived_recipe_holds_only_its_difference_and_inherits_the_rest():
    base, elastic = to_config(_compose("+recipe=grpo_standalone")), to_config(_compose("+recipe=grpo_elastic"))
    assert "defaults" in recipe_files()["grpo_elastic"].read_text()
    assert elastic.trainer.algo.optimizer.lr == base.trainer.algo.optimizer.lr  # from the base
    assert elastic.checkpoint.every == base.checkpoint.every == 50
    assert elastic.steps == 250 and elastic.pools["spot"].policy == "spot"    # its own


def _compose(*overrides):
    register_configs()
    with initialize_config_module(config_module="rlsync.configs", version_base=None):
        return compose(config_name="train", overrides=list(overrides))


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_composes_into_a_typed_config(recipe):
    cfg = to_config(_compose(f"+recipe={recipe}"))
    assert isinstance(cfg, TrainConfig) and cfg.steps > 0 and cfg.pools


def test_recipes_pick_their_algorithm_and_overrides_are_type_checked():
    assert to_config(_compose("+recipe=ppo_standalone")).trainer.algo.adv_est == "gae"
    cfg = to_config(_compose("+recipe=grpo_standalone", "rollout.max_staleness=0", "pools.main.size=3"))
    assert cfg.rollout.max_staleness == 0 and cfg.pools["main"].size == 3
    with pytest.raises(ConfigCompositionException):
        _compose("+recipe=grpo_standalone", "steps=many")
    with pytest.raises(ConfigCompositionException):
        _compose("+recipe=grpo_standalone", "trainer.no_such_knob=1")


def _reachable_dataclasses(root) -> list[type]:
    import dataclasses
    import typing

    seen, todo = [], [root]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.append(cls)
        for t in typing.get_type_hints(cls).values():
            for arg in (t, *typing.get_args(t)):
                if isinstance(arg, type) and dataclasses.is_dataclass(arg):
                    todo.append(arg)
    return seen


def test_every_field_reachable_from_the_schema_is_typed_and_documented():
    """Every dataclass the run config reaches (the trainer's, the engine's, the hub's own configs) documents
    each field where it is declared (a string right after it: what `--cfg job` readers look up)."""
    classes = _reachable_dataclasses(TrainConfig)
    assert len(classes) > 20
    undocumented = []
    for cls in classes:
        node = ast.parse(inspect.cleandoc("\n" + inspect.getsource(cls))).body[0]
        body = node.body
        for i, stmt in enumerate(body):
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                nxt = body[i + 1] if i + 1 < len(body) else None
                if not (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                        and isinstance(nxt.value.value, str)):
                    undocumented.append(f"{cls.__qualname__}.{stmt.target.id}")
    assert not undocumented


def test_every_hub_knob_is_reachable_from_the_run_config():
    from rlsync.hub import ClientConfig, HubConfig

    cfg = to_config(_compose("+recipe=grpo_elastic", "hub.server.planner.fanout_cap=8",
                             "hub.server.retention.retain_last=2",
                             "hub.server.retention.min_full_copies=3", "hub.client.dataplane.host=0.0.0.0",
                             "hub.client.manifest.chunk_bytes=1048576", "hub.client.transport=tcp-py"))
    assert isinstance(cfg.hub.server, HubConfig) and isinstance(cfg.hub.client, ClientConfig)
    assert cfg.hub.server.planner.fanout_cap == 8 and cfg.hub.server.retention.retain_last == 2
    assert cfg.hub.server.retention.min_full_copies == 3
    assert cfg.hub.client.dataplane.host == "0.0.0.0" and cfg.hub.client.manifest.chunk_bytes == 1 << 20
    assert cfg.hub.server.worker_timeout_s == 5.0                      # the recipe's own override
    # The run's one deliberate difference from the hub library's defaults (docs/rl.md).
    assert cfg.hub.server.retention.prefer_seed is True and HubConfig().retention.prefer_seed is False


@pytest.mark.parametrize("override, named", [
    ("trainer.backend=jax", "trainer.backend: unknown trainer backend 'jax'; known: deepspeed, torch"),
    ("rollout.engine=sglang", "rollout.engine: unknown rollout engine 'sglang'; known: hf"),
    ("model.kind=gpt5", "model.kind: unknown model loader 'gpt5'"),
    ("pools.main.policy=sometimes", "pools.main.policy: unknown pool policy 'sometimes'; known: autoscale, fixed, spot"),
    ("trainer.algo.policy_loss=dpo", "trainer.algo.policy_loss: unknown policy loss 'dpo'"),
    ("trainer.algo.policy_loss_args.correction=clip",
     "trainer.algo.policy_loss_args.correction: unknown off-policy correction 'clip'; known: mask, tis"),
    ("trainer.algo.policy_loss=ppo_clip trainer.algo.policy_loss_args.kl_coef=0.1",
     "trainer.algo.policy_loss_args.kl_coef: not a field of PPOClipLoss.Config; valid: clip_eps,"),
    ("trainer/algo=custom +trainer.algo.policy_loss_args.clip_epss=0.3",
     "trainer.algo.policy_loss_args.clip_epss: not a field of"),
    ("trainer/algo=custom +trainer.algo.policy_loss_args.clip_eps=abc", "trainer.algo.policy_loss_args.clip_eps: "),
    ("+task.args.lenght=4", "task.args.lenght: not a field of"),
    ("hub.client.transport=carrier-pigeon", "hub.client.transport: unknown transport 'carrier-pigeon'"),
])
def test_a_bad_choice_is_refused_when_composed_naming_the_key_and_the_choices(override, named):
    from rlsync.core.errors import ConfigError
    from rlsync.core.registry import UnknownNameError

    with pytest.raises((ConfigError, UnknownNameError)) as e:
        to_config(_compose("+recipe=grpo_standalone", *override.split()))
    assert named in str(e.value)


def test_algorithm_args_are_typed_per_algorithm_when_composed():
    """trainer/algos.py: each algorithm types its components' args; the run builds from the same values."""
    from rlsync.config.compose import unknown_override

    grpo, ppo = to_config(_compose("+recipe=grpo_standalone")), to_config(_compose("+recipe=ppo_standalone"))
    assert grpo.trainer.algo.policy_loss_args["kl_coef"] == 0.0 and grpo.trainer.algo.adv_est_args["norm_by_std"]
    assert (ppo.trainer.algo.adv_est, ppo.trainer.algo.policy_loss) == ("gae", "ppo_clip")
    assert ppo.trainer.algo.adv_est_args == {"gamma": 1.0, "lam": 0.95, "whiten": True}
    assert ppo.trainer.algo.value_loss_args == {"clip": 0.2, "coef": 0.5}
    kl = to_config(_compose("+recipe=grpo_standalone", "trainer.algo.policy_loss_args.kl_coef=0.01"))
    assert kl.trainer.algo.policy_loss_args["kl_coef"] == 0.01
    for bad, key in (("trainer.algo.policy_loss_args.clip_epss=0.3", "clip_epss"),
                     ("trainer.algo.policy_loss_args.clip_eps=abc", "clip_eps"),
                     ("trainer.algo.adv_est_args.gamma=0.9", "gamma")):  # a GAE arg under grpo
        with pytest.raises(ConfigCompositionException, match=key):
            _compose("+recipe=grpo_standalone", bad)
    assert unknown_override("trainer.algo.policy_loss_args.clip_epss=0.3") == (
        "unknown config key 'trainer.algo.policy_loss_args.clip_epss': trainer.algo.policy_loss_args has "
        "(trainer/algo=grpo) clip_eps, clip_eps_high, correct, correction, entropy_coef, kl_coef, loss_agg, tis_cap; "
        "(trainer/algo=ppo) clip_eps, clip_eps_high, correct, correction, entropy_coef, loss_agg, tis_cap")
    assert unknown_override("trainer/algo=dpo") == "unknown algorithm trainer/algo=dpo; known: custom, grpo, ppo"
    assert unknown_override("trainer/algo=ppo") is None


def test_enum_choices_and_unknown_keys_are_refused_with_the_choices():
    from rlsync.config.compose import unknown_override

    with pytest.raises(ConfigCompositionException):
        _compose("+recipe=grpo_standalone", "trainer.elastic.optimizer_state=sometimes")
    assert unknown_override("trainer.lrr=1") == ("unknown config key 'trainer.lrr': trainer has algo, backend, churn, "
                                                 "elastic, extra_ds_config, location, lora, publish, world_size, "
                                                 "zero_stage")
    assert unknown_override("trainer.algo.optimizer.lr=1") is None and unknown_override("pools.x.size=1") is None


@pytest.mark.parametrize("overrides, named", [
    # ranges
    (["steps=0"], "steps=0: must be >= 1"),
    (["steps=-1"], "steps=-1: must be >= 1"),
    (["trainer.zero_stage=4"], "trainer.zero_stage=4: must be in 0..3"),
    (["trainer.world_size=0"], "trainer.world_size=0: must be >= 1"),
    (["rollout.prompts_per_step=0"], "rollout.prompts_per_step=0: must be >= 1"),
    (["rollout.group_size=0"], "rollout.group_size=0: must be >= 1"),
    (["pools.main.size=-1"], "pools.main.size=-1: must be >= 0"),
    (["trainer.algo.optimizer.lr=0"], "trainer.algo.optimizer.lr=0.0: must be > 0"),
    (["pools.main.engine.top_p=1.5"], "pools.main.engine.top_p=1.5: must be > 0 and <= 1"),
    (["rollout.max_staleness=-1"], "rollout.max_staleness=-1: must be >= 0"),
    # rules across fields
    (["rollout.prompts_per_step=30", "trainer.world_size=4"],
     "rollout.prompts_per_step=30: must be a multiple of trainer.world_size=4"),
    (["rollout.group_size=1"], "rollout.group_size=1: must be >= 2 with trainer.algo.adv_est=grpo"),
    (["rollout.max_off_policy_versions=-1"], "rollout.max_off_policy_versions=-1: must be >= 0"),
    (["rollout.max_staleness=2", "rollout.max_off_policy_versions=1"],
     "rollout.max_off_policy_versions=1: must be >= rollout.max_staleness=2"),
    (["pools.main.size=0"], "pools: main.size=0: at least one rollout worker is needed"),
    (["pools.main.engine.temperature=0.5"], "pools.main.engine.temperature=0.5: must equal trainer.algo.temperature=1.0"),
    (["resume=/nonexistent/ckpt"], "resume=/nonexistent/ckpt: must be auto, never or a checkpoint directory"),
    (["trainer.publish=scattered"], "trainer.publish=scattered: must be one of auto, gathered, sharded"),
    (["trainer.publish=sharded"], "trainer.publish=sharded needs trainer.backend=deepspeed and trainer.zero_stage=3"),
    (["trainer.publish=sharded", "trainer.backend=deepspeed", "trainer.zero_stage=3", "sync.mode=broadcast"],
     "trainer.publish=sharded needs sync.mode=hub"),
])
def test_a_value_out_of_range_or_breaking_a_cross_field_rule_is_refused_naming_key_value_and_rule(overrides, named):
    from rlsync.core.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        to_config(_compose("+recipe=grpo_standalone", *overrides))
    assert str(e.value).startswith(named) and "\n" not in str(e.value), str(e.value)


def test_adding_a_key_the_schema_does_not_have_is_refused_but_mappings_and_recipes_are_not():
    from rlsync.config.compose import unknown_override

    assert unknown_override("+trainer.lrr=1").startswith("unknown config key 'trainer.lrr': trainer has algo,")
    assert unknown_override("++steps2=1").startswith("unknown config key 'steps2': the top level has")
    for fine in ("+recipe=grpo_standalone", "+pools.far.size=1", "+task.args.max_operand=9", "trainer.algo.policy_loss_args.clip_eps=0.3"):
        assert unknown_override(fine) is None, fine


def test_the_defaults_and_every_recipe_pass_the_value_rules():
    from rlsync.config.compose import check_config

    check_config(TrainConfig())
    for recipe in RECIPES:
        check_config(to_config(_compose(f"+recipe={recipe}")))


# `python -m rlsync.train ...` in a wrapper that, at exit, prints which heavy packages the process had imported:
# the failure path must not import the run machinery (Ray, transformers, vLLM), so a bad value fails fast.
_TRAIN_REPORTING_IMPORTS = """
import runpy, sys
try:
    runpy.run_module("rlsync.train", run_name="__main__", alter_sys=True)
finally:
    print("imported at exit:", sorted(m for m in ("ray", "transformers", "vllm") if m in sys.modules), file=sys.stderr)
"""


@pytest.mark.timeout(300)  # 2 interpreter starts: ~5 s each idle, ~8-20 s each at load 80
def test_a_typo_fails_in_seconds_before_ray_starts_naming_the_key(tmp_path):
    """As a process: a key Hydra refuses (at compose) and a value the schema's rules refuse (after it), both before
    anything heavy is imported. `+trainer.lrr` and `trainer.backend=jax` take these two paths; their messages are
    checked in-process above (test_adding_a_key_..., test_a_bad_choice_...)."""
    import subprocess
    import sys

    for override, named in [("trainer.lrr=1", "trainer.lrr"), ("steps=0", "steps=0")]:
        p = subprocess.run([sys.executable, "-c", _TRAIN_REPORTING_IMPORTS, "+recipe=grpo_standalone", override,
                            f"hydra.run.dir={tmp_path}"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert p.returncode != 0 and named in p.stderr, p.stderr[-2000:]
        assert "imported at exit: []" in p.stderr, p.stderr[-2000:]    # neither Ray nor the model packages loaded


def test_auto_publish_is_sharded_exactly_where_zero3_partitions_can_be_read():
    from rlsync.config.compose import route_of

    def cfg(*o):
        return to_config(_compose("+recipe=grpo_standalone", *o))

    def sharded_publish(c):
        return route_of(c).shards

    z3 = ("trainer.backend=deepspeed", "trainer.zero_stage=3")
    assert sharded_publish(cfg(*z3))
    assert not sharded_publish(cfg()) and not sharded_publish(cfg("trainer.backend=deepspeed", "trainer.zero_stage=2"))
    assert not sharded_publish(cfg(*z3, "trainer.publish=gathered"))
    assert not sharded_publish(cfg(*z3, "sync.mode=object_store"))
    assert not sharded_publish(cfg(*z3, "trainer.elastic.enabled=true"))
    assert not sharded_publish(cfg(*z3, "sync.deltas=true"))
