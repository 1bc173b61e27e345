"""Errors every room may raise before anything starts (the hub's own errors are `rlsync.hub.errors`)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config value no component accepts: names the key and the valid choices. Raised before anything starts
    (`rlsync.config.compose.check_config`, `rlsync.config.rules.check_values`)."""
