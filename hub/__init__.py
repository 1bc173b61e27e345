"""rlsync.hub — Reference-Oriented Storage: versions look stored; the hub stores no bytes.

Public API:
    start_embedded_hub, HubServer, HubConfig   — run a hub (in-process or `python -m rlsync.hub serve`)
    HubClient, ClientConfig, FetchResult       — publish / fetch / release from any training loop
    Location, Shard                            — where a worker is; which model-parallel shard
    errors (HubError and subclasses)           — every refusal is typed
"""
from . import errors
from .client import ClientConfig, FetchResult, HubClient
from .errors import HubError
from .location import Location
from .manifest import ManifestConfig
from .planner import PlannerConfig
from .retention import RetentionConfig
from .server import EmbeddedHub, HubServer, start_embedded_hub
from .shard import Shard
from .state import HubConfig

__all__ = ["ClientConfig", "EmbeddedHub", "FetchResult", "HubClient", "HubConfig", "HubError", "HubServer",
           "Location", "ManifestConfig", "PlannerConfig", "RetentionConfig", "Shard", "errors",
           "start_embedded_hub"]
