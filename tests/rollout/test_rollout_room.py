"""The rollout room's imports, read from the sources (lazy imports inside functions included): it uses
only the hub's public face, reads no private attribute of a hub client, and no module of it imports a
module that imports it back (issue 31; review 2026-11-27 §1.4 row 5, §1.5)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROLLOUT = ROOT / "rollout"
HUB_FACE = {"rlsync.hub", "rlsync.hub.errors"}


def _module(path: Path) -> str:
    parts = ["rlsync", "rollout", *path.relative_to(ROLLOUT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path):
    """(line, target module) of every import in `path`, relative ones resolved."""
    mod = _module(path)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            # `from pkg import mod` names a module when pkg/mod.py exists; otherwise the names are pkg's
            yield node.lineno, base
            yield from ((node.lineno, f"{base}.{a.name}") for a in node.names)


def _sources():
    return sorted(p for p in ROLLOUT.rglob("*.py") if "__pycache__" not in p.parts)


def _hub_face() -> set[str]:
    """The names `hub/__init__.py` exports (its `_EXPORTS` dict)."""
    for node in ast.parse((ROOT / "hub" / "__init__.py").read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_EXPORTS":
            return set(ast.literal_eval(node.value))
    raise AssertionError("hub/__init__.py has no _EXPORTS")


def test_the_rollout_room_uses_only_the_hubs_face():
    face, past = _hub_face(), []
    for p in _sources():
        for n in ast.walk(ast.parse(p.read_text())):
            where = f"{p.relative_to(ROOT)}:{getattr(n, 'lineno', 0)}"
            if isinstance(n, ast.Import):
                past += [f"{where} import {a.name}" for a in n.names
                         if a.name.startswith("rlsync.hub.") and a.name not in HUB_FACE]
            elif isinstance(n, ast.ImportFrom) and not n.level and (n.module or "").startswith("rlsync.hub"):
                if n.module not in HUB_FACE:
                    past.append(f"{where} from {n.module}")
                elif n.module == "rlsync.hub":
                    past += [f"{where} rlsync.hub.{a.name} (not in _EXPORTS)" for a in n.names if a.name not in face]
    private = [f"{p.relative_to(ROOT)}:{n.lineno} .{n.attr}" for p in _sources()
               for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Attribute) and n.attr == "_token"]
    assert not past and not private, (past, private)


def test_no_rollout_module_imports_one_that_imports_it_back():
    modules = {_module(p): p for p in _sources()}
    graph = {m: {t for _, t in _imports(p) if t in modules and t != m}
             for m, p in modules.items()}
    # a package's __init__ importing its children is its face, not a circle
    graph = {m: {t for t in ts if not (modules[m].name == "__init__.py" and t.startswith(m + "."))}
             for m, ts in graph.items()}

    def reaches(a: str, b: str) -> bool:
        seen, todo = set(), [a]
        while todo:
            for t in graph[todo.pop()] - seen:
                if t == b:
                    return True
                seen.add(t)
                todo.append(t)
        return False

    circles = sorted(f"{m} <-> {t}" for m in graph for t in graph[m] if reaches(t, m))
    assert not circles, circles
    assert graph["rlsync.rollout.vllm.engine"], "the graph reads the vLLM package's imports"
