from model_fixtures import one_torch_thread, tiny  # noqa: F401  (shared fixtures, tests/model_fixtures.py)
