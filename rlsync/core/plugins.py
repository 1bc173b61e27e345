"""User plugins: the user's own modules that register tasks, rewards, losses, advantage estimators.

    load_plugins(["my_task"], ["/home/me/exp"])   # sys.path gets the dir, then `import my_task`

The config's `plugins` (module names) and `plugin_path` (directories; default: the driver's working
directory) travel inside the run's config, so the driver, every Ray worker and a pool attached with
`python -m rlsync.pools join` call this before they build anything: each process's registries then
hold what the user's module registered. Nothing is copied: the directories must be readable where
the workers run (one machine, or a shared file system; else install the module as a package).
"""

from __future__ import annotations

import importlib
import sys


class PluginError(ImportError):
    """A plugin module could not be imported: names the module and where it was looked for."""


def load_plugins(modules: list[str], path: list[str]) -> None:
    """Put `path` first on sys.path (once) and import every module in `modules` (idempotent)."""
    for d in reversed(path):
        if d not in sys.path:
            sys.path.insert(0, d)
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and name.split(".")[0] == e.name.split(".")[0]:
                raise PluginError(f"plugins: no module {name!r} on plugin_path {list(path)} "
                                  "(nor installed); run from the module's directory or set plugin_path") from None
            raise
