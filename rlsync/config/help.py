"""`python -m rlsync.train --help`: every config key with its type, default and the docstring it is declared with.

    print(help_text())          # usage, recipes, then `key: type = default  doc` per field, nested keys dotted
    field_docs(TrainConfig)     # {"steps": "Trainer steps (= versions published after the initial one).", ...}

The docs are the strings right after each field in the dataclasses (rlsync/config/schema.py and the sections
it assembles), read from the source, so `--help` says what the code says.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import typing
from typing import Any, Iterator

USAGE = """\
python -m rlsync.train +recipe=NAME [key=value ...]

  +recipe=NAME        a whole experiment (recipes: {recipes})
  key=value           any key below, e.g. steps=300 trainer.algo.optimizer.lr=1e-3 pools.main.size=3
  --cfg job           print the config the run would use (task args and plugin paths resolved), then exit
  --hydra-help        Hydra's own flags (hydra.run.dir=..., --multirun, ...)

Config keys (type = default; `pools.<name>` is one rollout pool, `trainer.algo` is typed per trainer/algo=NAME):
"""


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the string literal right after its declaration in `cls` (and its dataclass bases)."""
    out: dict[str, str] = {}
    for klass in reversed([c for c in cls.__mro__ if dataclasses.is_dataclass(c)]):
        try:
            node = ast.parse(inspect.cleandoc("\n" + inspect.getsource(klass))).body[0]
        except (OSError, TypeError, SyntaxError, IndexError):  # no source (built dynamically): no docs
            continue
        body = getattr(node, "body", [])
        for stmt, nxt in zip(body, body[1:]):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
                out[stmt.target.id] = " ".join(nxt.value.value.split())
    return out


def _type_name(t: Any) -> str:
    name = getattr(t, "__name__", None) if not typing.get_args(t) else None
    return name or str(t).replace("typing.", "")


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "(required)"


def _fmt(v: Any) -> str:
    return repr(v.value) if isinstance(v, enum.Enum) else repr(v)


def field_lines(cls: type, prefix: str = "") -> Iterator[str]:
    """`key: type = default  doc` for every leaf field under `cls`; a nested dataclass is a heading with its doc."""
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    for f in dataclasses.fields(cls):
        key, t, doc = f"{prefix}{f.name}", hints.get(f.name), docs.get(f.name, "")
        value = _default(f)
        args = typing.get_args(t)
        inner = args[1] if typing.get_origin(t) is dict and len(args) == 2 else None
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield f"  {key}:  {doc}"
            yield from field_lines(type(value), key + ".")
        elif isinstance(inner, type) and dataclasses.is_dataclass(inner):
            yield f"  {key}.<name>:  {doc}"
            yield from field_lines(inner, key + ".<name>.")
        else:
            yield f"  {key}: {_type_name(t)} = {_fmt(value)}  {doc}".rstrip()


def help_text() -> str:
    from rlsync.config.compose import recipe_files
    from rlsync.config.schema import TrainConfig

    return USAGE.format(recipes=", ".join(recipe_files())) + "\n".join(field_lines(TrainConfig)) + "\n"
