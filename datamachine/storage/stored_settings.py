"""The ``settings`` table: :class:`SettingsStore`, every stored key and the JSON text of its
value.

:class:`datamachine.settings.Settings` decides what a value means (declarations, environment
overrides, validation, decoding); this store only reads and writes the rows, under the
connection's lock the other stores take, so a settings write never lands inside another
thread's transaction and a read never sees another thread's uncommitted one.

Why a cache: a run reads about ten settings. ``PRAGMA data_version`` moves when another
connection (another process) commits, and this store's own writes drop the cache, so those
reads cost one cheap query instead of one each. PostgreSQL has no counterpart of
``data_version``: there the table (a few rows) is read each time, still one query for a whole
:meth:`SettingsStore.batch`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from agents_api import clock
from datamachine.storage._tx import Connected, connection_lock, db_label, dialect, immediate

__all__ = ["SettingsStore"]

_UPSERT = ("INSERT INTO settings (key, value, updated_at) VALUES (?, ?, ?) "
           "ON CONFLICT(key) DO UPDATE SET value = excluded.value, "
           "updated_at = excluded.updated_at")
# A stored JSON null is no value: settings.get reads it as unset, so it may be replaced.
_INSERT_UNSET = _UPSERT + " WHERE settings.value = 'null'"


class _BatchState(threading.local):
    """Whether this thread is inside :meth:`SettingsStore.batch`: per thread, because on
    PostgreSQL nothing keeps other threads out while one batch is open."""

    trusted = False


class SettingsStore:
    """Read, write and delete the rows of ``settings`` (key -> JSON text)."""

    def __init__(self, db: Connected) -> None:
        self._db = db
        self._lock = connection_lock(db)
        self._label = db_label(db)
        self._sqlite = dialect(db.conn) == "sqlite"
        self._cache: dict[str, str] | None = None
        self._version: int | None = None
        self._batch = _BatchState()

    def rows(self) -> dict[str, str]:
        """Every stored key and its JSON text, read again only when the database changed.

        The same dict is returned while nothing changed (callers may cache what they derive
        from it by identity); callers must not change it.
        """
        with self._lock:
            if self._batch.trusted and self._cache is not None:
                return self._cache  # inside batch(): checked once already
            conn = self._db.conn
            version = conn.execute("PRAGMA data_version").fetchone()[0] if self._sqlite else None
            if self._cache is None or version is None or version != self._version:
                self._cache = dict(conn.execute("SELECT key, value FROM settings").fetchall())
                self._version = version
            return self._cache

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Read the rows as one consistent snapshot: checked for changes once, on entry.

        Holds the connection lock for the block (keep it short: a run's set-up uses it), so no
        other thread can write in between.
        """
        with self._lock:
            if self._batch.trusted:
                yield
                return
            self.rows()
            self._batch.trusted = True
            try:
                yield
            finally:
                self._batch.trusted = False

    def put(self, key: str, encoded: str) -> None:
        """Store ``encoded`` (JSON text) under ``key``, replacing any stored value."""
        with self._lock:
            self._cache = None
            with immediate(self._db, self._lock, self._label,
                           f"store the setting {key!r}") as conn:
                conn.execute(_UPSERT, [key, encoded, clock.now()])

    def put_if_unset(self, key: str, encoded: str) -> str:
        """Store ``encoded`` under ``key`` unless it holds a value already (a stored JSON
        ``null`` is none); the JSON text ``key`` holds afterwards.

        One write transaction: processes that start together on one database agree on the
        first value stored instead of each keeping their own.
        """
        with self._lock:
            self._cache = None
            with immediate(self._db, self._lock, self._label,
                           f"store the setting {key!r}") as conn:
                conn.execute(_INSERT_UNSET, [key, encoded, clock.now()])
                row = conn.execute("SELECT value FROM settings WHERE key = ?", [key]).fetchone()
        return str(row[0])

    def remove(self, key: str) -> bool:
        """Delete the stored value of ``key``; True if there was one."""
        with self._lock:
            self._cache = None
            with immediate(self._db, self._lock, self._label,
                           f"delete the setting {key!r}") as conn:
                cursor = conn.execute("DELETE FROM settings WHERE key = ?", [key])
        return bool(cursor.rowcount)
