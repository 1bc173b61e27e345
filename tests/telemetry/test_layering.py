"""The recording layer is a low-level primitive: it imports only `rlsync.core` and itself, nothing heavy.

(The room-level contracts are import-linter's, tests/test_rooms.py; this adds "no torch/ray/transformers".)
"""

import ast
from pathlib import Path

import pytest

import rlsync.telemetry

HEAVY = {"torch", "ray", "transformers", "deepspeed"}
LAYER = Path(rlsync.telemetry.__file__).parent
MODULES = sorted(p.stem for p in LAYER.glob("*.py") if p.stem != "__init__")
ALLOWED = ("rlsync.telemetry.", "rlsync.core.stall", "rlsync.core.events")


def test_the_layer_is_what_its_package_docstring_lists():
    assert {"metrics", "sync_sources", "trace", "loggers", "progress"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_imports_stay_inside_the_layer(name):
    path = LAYER / f"{name}.py"
    for node in ast.walk(ast.parse(path.read_text())):
        mods = []
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{name}: relative import"
            mods = [node.module or ""]
        for m in mods:
            top = m.partition(".")[0]
            assert top not in {"hub", "trainer", "rollout"} and top not in HEAVY, f"{name} imports {m}"
            if top == "rlsync":
                assert m.startswith(ALLOWED), f"{name} imports {m}, outside the recording layer"
