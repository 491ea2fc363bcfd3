"""The schema, as numbered sqlite-utils migrations.

Migrations run inside ``BEGIN IMMEDIATE``: two processes booting against a new file take turns
instead of both creating tables, and each migration is rolled back whole if it fails (sqlite-utils
wraps each one in a savepoint), leaving the database as it was.
"""

from __future__ import annotations

import sqlite3

from sqlite_utils import Database, Migrations

from datamachine.errors import DatabaseError

__all__ = ["MIGRATIONS", "migrate"]

MIGRATIONS = Migrations("datamachine")


@MIGRATIONS()
def m001_settings(db: Database) -> None:
    """Settings: one row per key, the value stored as JSON text."""
    db["settings"].create({"key": str, "value": str, "updated_at": float}, pk="key")


def migrate(db: Database, *, label: str = "database") -> None:
    """Apply pending migrations atomically; a failure leaves the schema untouched."""
    try:
        if not MIGRATIONS.pending(db):
            return
        db.conn.execute("BEGIN IMMEDIATE")
        try:
            MIGRATIONS.apply(db)
        except BaseException:
            db.conn.execute("ROLLBACK")
            raise
        db.conn.execute("COMMIT")
    except sqlite3.DatabaseError as exc:
        raise DatabaseError(f"Cannot migrate the database {label}: {exc}.") from exc
