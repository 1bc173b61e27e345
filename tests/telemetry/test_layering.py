"""The recording layer is a low-level primitive: it imports nothing from the driver, hub, trainer or rollout."""

import ast
from pathlib import Path

import pytest

import rlsync

LAYER = {"stall", "metrics", "loggers", "trace", "report", "progress"}
HEAVY = {"torch", "ray", "transformers", "deepspeed"}


@pytest.mark.parametrize("name", sorted(LAYER))
def test_imports_stay_inside_the_layer(name):
    path = Path(rlsync.__file__).parent / f"{name}.py"
    for node in ast.walk(ast.parse(path.read_text())):
        mods = []
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{name}: relative import"
            mods = [node.module or ""]
        for m in mods:
            top, _, rest = m.partition(".")
            assert top not in {"hub", "trainer", "rollout"} and top not in HEAVY, f"{name} imports {m}"
            if top == "rlsync":
                assert rest.split(".")[0] in LAYER, f"{name} imports {m}, outside the recording layer"
