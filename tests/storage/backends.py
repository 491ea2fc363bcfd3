"""What the storage tests do differently per backend: inject a failure, read every stored byte.

Each helper does the same thing on SQLite and on PostgreSQL with that backend's own means (a
trigger, a deferred constraint, a dump), so a test states its expectation once.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from datamachine.host import Host
from datamachine.storage._tx import dialect


def is_postgres(host: Host) -> bool:
    return dialect(host.handle.conn) == "postgresql"


def dump(host: Host) -> str:
    """Every row of every table, as text (to check what a store never writes)."""
    conn = host.handle.conn
    if not is_postgres(host):
        assert isinstance(conn, sqlite3.Connection)
        return "\n".join(conn.iterdump())
    tables = [row[0] for row in conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'datamachine'").fetchall()]
    return "\n".join(str(row[0]) for table in tables
                     for row in conn.execute(f"SELECT t::text FROM {table} t").fetchall())


@contextmanager
def refuse_message_at(host: Host, position: int) -> Iterator[None]:
    """Any INSERT of a transcript message at ``position`` fails (inside its transaction)."""
    conn = host.handle.conn
    if not is_postgres(host):
        conn.execute(
            "CREATE TEMP TRIGGER refuse_position AFTER INSERT ON transcript_messages "
            f"WHEN NEW.position = {position} BEGIN SELECT RAISE(ABORT, 'refused'); END")
        try:
            yield
        finally:
            conn.execute("DROP TRIGGER refuse_position")
        return
    conn.execute(
        "CREATE FUNCTION refuse_position() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "RAISE EXCEPTION 'refused'; END $$")
    conn.execute(
        "CREATE TRIGGER refuse_position AFTER INSERT ON transcript_messages FOR EACH ROW "
        f"WHEN (NEW.position = {position}) EXECUTE FUNCTION refuse_position()")
    try:
        yield
    finally:
        conn.execute("DROP TRIGGER refuse_position ON transcript_messages")
        conn.execute("DROP FUNCTION refuse_position()")


@contextmanager
def failing_commits(host: Host, monkeypatch: pytest.MonkeyPatch, *,
                    once: bool = False) -> Iterator[None]:
    """Every COMMIT fails (``once``: only the first), as a full disk would make it.

    SQLite: the connection's COMMIT raises ``disk I/O error``. PostgreSQL: a deferred
    constraint trigger on ``transcripts`` raises at COMMIT, the server's own commit failure.
    """
    if not is_postgres(host):
        real = host.handle.conn
        armed = [True]

        class FailingCommit:
            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            def execute(self, sql: str, *args: Any) -> Any:
                if sql == "COMMIT" and armed[0]:
                    armed[0] = not once
                    raise sqlite3.OperationalError("disk I/O error (simulated)")
                return real.execute(sql, *args)

        stores = [host.handle, host.transcripts._db]
        for store in stores:
            monkeypatch.setattr(store, "conn", FailingCommit())
        try:
            yield
        finally:
            for store in stores:
                monkeypatch.setattr(store, "conn", real)
        return
    conn = host.handle.conn
    # A sequence, because nextval() survives the rollback of the commit it failed.
    conn.execute("CREATE SEQUENCE fail_commit_count")
    condition = "nextval('fail_commit_count') = 1" if once else "true"
    conn.execute(
        "CREATE FUNCTION fail_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        f"IF {condition} THEN RAISE EXCEPTION 'disk I/O error (simulated)'; END IF; "
        "RETURN NULL; END $$")
    for table in ("transcripts", "transcript_messages", "transcript_locks"):
        conn.execute(
            f"CREATE CONSTRAINT TRIGGER fail_commit AFTER INSERT OR UPDATE OR DELETE ON {table} "
            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fail_commit()")
    try:
        yield
    finally:
        for table in ("transcripts", "transcript_messages", "transcript_locks"):
            conn.execute(f"DROP TRIGGER fail_commit ON {table}")
        conn.execute("DROP FUNCTION fail_commit()")
        conn.execute("DROP SEQUENCE fail_commit_count")
