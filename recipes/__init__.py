"""Recipes: whole experiments, selected with `python -m rlsync.train +recipe=NAME` (shipped as `rlsync.recipes`).

Each `NAME.yaml` here is stored in Hydra's ConfigStore as option NAME of group `recipe` (package
`_global_`) by `rlsync.config.compose.register_configs`; `tests/NAME.yaml` are test-only recipes
(`+recipe=tests/tiny_e2e`). A recipe inherits a base with `defaults: [grpo_standalone]` and holds
only its difference.
"""
