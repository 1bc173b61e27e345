"""Configs: every recipe composes into a typed TrainConfig; every field of the schema is documented."""
import ast
import inspect

import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException

import rlsync.config as config_module
from rlsync.config import TrainConfig, recipe_files, register_configs, to_config

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


def test_every_field_of_the_schema_is_typed_and_documented():
    tree = ast.parse(inspect.getsource(config_module))
    undocumented = []
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        body = cls.body
        for i, node in enumerate(body):
            if isinstance(node, ast.AnnAssign):
                nxt = body[i + 1] if i + 1 < len(body) else None
                if not (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                        and isinstance(nxt.value.value, str)):
                    undocumented.append(f"{cls.name}.{node.target.id}")
    assert not undocumented
