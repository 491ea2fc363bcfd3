"""Keys a site makes for itself once: :class:`SiteSecretStore` (the table ``site_secrets``).

Kept outside the settings, which are listed and exported: the run viewer's cookie signing key
is one. A secret is made on first use and never changes afterwards.
"""

from __future__ import annotations

from collections.abc import Callable

from agents_api import clock
from datamachine.storage._tx import Connected, connection_lock, db_label, immediate, query_one

__all__ = ["SiteSecretStore"]

_READ = "SELECT value FROM site_secrets WHERE name = ?"


class SiteSecretStore:
    """Read a site secret, making and storing it the first time."""

    def __init__(self, db: Connected) -> None:
        self._db = db
        self._lock = connection_lock(db)
        self._label = db_label(db)

    def get_or_create(self, name: str, make: Callable[[], str]) -> str:
        """The secret called ``name``; when there is none yet, ``make()`` stored under it.

        Read and made in one write transaction, so hosts starting together on one database
        agree on one secret (the first stored).
        """
        with self._lock:
            row = query_one(self._db.conn, _READ, [name])
        if row is not None:
            return str(row["value"])
        with immediate(self._db, self._lock, self._label, "create a site secret",
                       (f"secret:{name}",)) as conn:
            row = query_one(conn, _READ, [name])
            if row is not None:
                return str(row["value"])
            value = make()
            conn.execute("INSERT INTO site_secrets (name, value, created_at) VALUES (?, ?, ?)",
                         [name, value, clock.now()])
        return value
