"""The hub's durable state: committed versions and their manifests, in SQLite (WAL).

Replica locations are soft state (workers re-register them); what must survive a `kill -9` of the
hub is which versions were committed, with which manifests, and the highest version number ever
committed per model, so a restarted hub never reuses a version number. A commit is journaled
(and fsynced by SQLite) *before* it becomes visible.

Every journal file is 0600 from creation: the database and its `-wal`/`-shm` side files are created
0600 by us before SQLite opens them (SQLite gives any other side file the database's mode), and files
left looser by an older version are tightened. The journal holds no secret (the ticket-signing key
has its own 0600 file, `<journal>.ticket-key`), but it is the hub's record and no one else's to read.
"""
from __future__ import annotations

import sqlite3
import threading

import msgpack

from rlsync.hub.errors import InvalidArgumentError
from rlsync.hub.private_files import create_private

_SCHEMA = """
CREATE TABLE IF NOT EXISTS versions (
  model TEXT NOT NULL, version INTEGER NOT NULL, tp_size INTEGER NOT NULL, pp_size INTEGER NOT NULL,
  manifests BLOB NOT NULL, committed_at REAL NOT NULL, PRIMARY KEY (model, version));
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS annotations (
  model TEXT NOT NULL, version INTEGER NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL,
  PRIMARY KEY (model, version, key));
"""


SIDE_FILES = ("", "-wal", "-shm")


class Journal:
    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        for suffix in SIDE_FILES:
            try:
                create_private(path + suffix)
            except OSError as e:  # a directory, a missing directory, no permission: the caller's path to fix
                raise InvalidArgumentError(f"journal {path}: cannot create {path + suffix} ({e.strerror}); "
                                           "pass a file path in an existing directory") from None
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA secure_delete=ON")  # deleted rows are zeroed, not left in free pages
        self._db.executescript(_SCHEMA)

    def record_commit(self, model: str, version: int, group: tuple[int, int],
                      manifests: dict[str, dict], at: float) -> None:
        blob = msgpack.packb(manifests)
        with self._lock:
            self._db.execute("INSERT INTO versions VALUES (?,?,?,?,?,?)",
                             (model, version, group[0], group[1], blob, at))

    def forget(self, model: str, below: int) -> None:
        """Drop manifests of versions below `below` (the numbers stay reserved via max())."""
        with self._lock:
            self._db.execute("DELETE FROM versions WHERE model=? AND version<? AND version < "
                             "(SELECT MAX(version) FROM versions WHERE model=?)", (model, below, model))
            self._db.execute("DELETE FROM annotations WHERE model=? AND version NOT IN "
                             "(SELECT version FROM versions WHERE model=?)", (model, model))

    def record_annotation(self, model: str, version: int, key: str, value) -> None:
        """A version's annotation (hub/state/annotations.py), durable before the hub shows it."""
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO annotations VALUES (?,?,?,?)",
                             (model, version, key, msgpack.packb(value)))

    def load_annotations(self) -> list[tuple[str, int, str, object]]:
        with self._lock:
            rows = self._db.execute("SELECT model, version, key, value FROM annotations "
                                    "ORDER BY model, version, key").fetchall()
        return [(m, v, k, msgpack.unpackb(b, strict_map_key=False)) for m, v, k, b in rows]

    def load(self) -> list[tuple[str, int, tuple[int, int], dict[str, dict], float]]:
        with self._lock:
            rows = self._db.execute("SELECT model, version, tp_size, pp_size, manifests, committed_at "
                                    "FROM versions ORDER BY model, version").fetchall()
        return [(m, v, (tp, pp), msgpack.unpackb(b, strict_map_key=False), at)
                for m, v, tp, pp, b, at in rows]

    def get_meta(self, key: str):
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else msgpack.unpackb(row[0])

    def set_meta(self, key: str, value) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO meta VALUES (?,?)", (key, msgpack.packb(value)))

    def scrub_meta(self, key: str) -> None:
        """Delete a meta row and leave no copy of it in the WAL (secure_delete zeroes the page)."""
        with self._lock:
            self._db.execute("DELETE FROM meta WHERE key=?", (key,))
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        """Checkpoint the WAL into the database and close (a clean stop leaves one file)."""
        with self._lock:
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                self._db.close()
