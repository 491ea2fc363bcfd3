"""Opening and migrating the database file: clear errors naming the path, atomic migrations."""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlite_utils import Database, Migrations

import bootstrap
from datamachine.errors import DatabaseError
from datamachine.storage.database import open_database
from datamachine.storage.sqlite_migrations import MIGRATIONS, migrate

TABLES = {"settings", "transcripts", "transcript_messages", "transcript_locks", "chat_sessions",
          "jobs", "api_tokens"}


def _schema(path: Path) -> list[tuple[str, str]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT name, sql FROM sqlite_master ORDER BY name").fetchall()
    finally:
        conn.close()


def test_a_new_file_gets_every_table_in_wal_mode(tmp_path: Path) -> None:
    db = open_database(tmp_path / "new.db")
    assert set(db.table_names()) >= TABLES
    assert db.conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert db.conn.execute("PRAGMA busy_timeout").fetchone() == (30_000,)
    assert db.conn.execute("PRAGMA foreign_keys").fetchone() == (1,)
    assert MIGRATIONS.pending(db) == []


def test_reopening_a_migrated_file_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "dm.db"
    open_database(path).conn.close()
    before = _schema(path)
    open_database(path).conn.close()
    assert _schema(path) == before


def test_the_host_exposes_the_stores_on_its_database(tmp_path: Path) -> None:
    with bootstrap.boot(db_path=tmp_path / "dm.db", load_entrypoints=False) as host:
        job = host.jobs.create()
        assert host.jobs.get(job.id).status == "pending"
        assert host.chat_sessions.create().max_turns == 25
        assert host.tokens.verify(host.tokens.create("x")) == "x"
        assert host.transcripts.acquire("s", 5) is not None


def test_a_failing_migration_leaves_the_database_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "dm.db"
    open_database(path).conn.close()
    before = _schema(path)

    extra = Migrations("datamachine-test")

    @extra()
    def m001_fine(db: Database) -> None:
        db.execute("CREATE TABLE extra_one (id INTEGER PRIMARY KEY)")

    @extra()
    def m002_broken(db: Database) -> None:
        db.execute("CREATE TABLE extra_two (id INTEGER PRIMARY KEY)")
        raise ValueError("disk full, say")

    db = Database(sqlite3.connect(path))
    with pytest.raises(DatabaseError) as caught:
        migrate(db, label=str(path), migrations=extra)
    message = str(caught.value)
    assert str(path) in message
    assert "m002_broken" in message
    assert "disk full" in message
    assert not db.conn.in_transaction
    db.conn.close()
    # Neither the failing migration nor the one before it left anything behind.
    assert _schema(path) == before


def test_a_migration_failing_on_sqlite_itself_is_a_database_error(tmp_path: Path) -> None:
    extra = Migrations("datamachine-test")

    @extra()
    def m001_bad_sql(db: Database) -> None:
        db.execute("CREATE TABLE broken (")

    db = Database(sqlite3.connect(tmp_path / "x.db"))
    with pytest.raises(DatabaseError, match="m001_bad_sql"):
        migrate(db, label="x.db", migrations=extra)
    assert db.table_names() == []


@pytest.mark.parametrize(
    "content",
    [b"hello, I am a text file\n" * 50, os.urandom(8192),
     b"SQLite format 3\x00" + b"\xff" * 4080],
    ids=["text", "random", "damaged-header"],
)
def test_a_file_that_is_not_sqlite_is_refused_and_left_untouched(tmp_path: Path,
                                                                 content: bytes) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(content)
    with pytest.raises(DatabaseError, match=str(path)):
        open_database(path)
    assert path.read_bytes() == content
    with pytest.raises(DatabaseError, match=str(path)):
        bootstrap.boot(db_path=path, load_entrypoints=False)


def test_a_sqlite_database_of_another_application_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    conn.commit()
    conn.close()
    before = _schema(path)
    with pytest.raises(DatabaseError, match=f"{path}.*another application.*invoices"):
        open_database(path)
    assert _schema(path) == before


def test_a_missing_directory_is_named_not_created(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "dir" / "dm.db"
    with pytest.raises(DatabaseError, match=f"{path}.*does not exist"):
        open_database(path)
    assert not (tmp_path / "no").exists()


def test_a_directory_given_as_the_database_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DatabaseError, match=f"{tmp_path}.*is a directory"):
        open_database(tmp_path)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses Linux's /proc")
def test_a_directory_nobody_can_write_is_a_clear_error() -> None:
    """/proc refuses new files even to root, unlike a chmod-ed directory."""
    path = Path("/proc/datamachine-test.db")
    with pytest.raises(DatabaseError, match=f"{path}.*writable"):
        open_database(path)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root ignores directory permissions; the /proc test covers this")
def test_a_read_only_directory_is_a_clear_error(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        with pytest.raises(DatabaseError, match=str(locked / "dm.db")):
            open_database(locked / "dm.db")
    finally:
        locked.chmod(0o755)


def test_the_schema_check_at_boot_knows_every_migration() -> None:
    from datamachine.storage import database as dbmodule

    assert (MIGRATIONS.migrations_table, MIGRATIONS.name) == (
        dbmodule.MIGRATIONS_TABLE, dbmodule.MIGRATION_SET)
    assert tuple(m.name for m in MIGRATIONS._migrations) == dbmodule.MIGRATION_NAMES


def test_a_database_missing_a_migration_is_migrated_when_opened(tmp_path: Path) -> None:
    from datamachine.storage.database import MIGRATION_NAMES, open_handle

    path = tmp_path / "partial.db"
    handle = open_handle(path)
    assert handle.migrated
    last = "m008_token_claims"
    assert last in MIGRATION_NAMES
    added = [("api_tokens", "tools"), ("api_tokens", "site"), ("chat_sessions", "token_name"),
             ("transcripts", "token_name")]  # what that migration made
    for table, column in added:
        handle.conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    handle.conn.execute("DELETE FROM _sqlite_migrations WHERE name = ?", [last])
    handle.conn.commit()
    assert not handle.migrated
    handle.conn.close()
    reopened = open_handle(path)
    assert reopened.migrated
    for table, column in added:
        columns = {row[1] for row in reopened.conn.execute(f"PRAGMA table_info({table})")}
        assert column in columns, (table, column)
    reopened.conn.close()


def test_the_handles_database_shares_its_connection_and_lock(tmp_path: Path) -> None:
    from datamachine.storage._tx import connection_lock
    from datamachine.storage.database import open_handle

    handle = open_handle(tmp_path / "shared.db")
    # Set from the start, as sqlite-utils would set it: the connection behaves the same
    # before and after the Database is built.
    assert handle.conn.execute("PRAGMA recursive_triggers").fetchone() == (1,)
    database = handle.database
    assert database is handle.database  # built once
    assert database.conn is handle.conn
    assert connection_lock(database) is connection_lock(handle)
    handle.conn.close()


def test_stored_refusals_move_to_the_executors_own_mark_and_tool_data_stays(
        tmp_path: Path) -> None:
    import json

    from datamachine.storage.database import open_handle
    from datamachine.tools.results import REJECTED

    path = tmp_path / "old.db"
    handle = open_handle(path)

    def envelope(payload: dict[str, Any]) -> str:
        return json.dumps({"schema": "agents-api.message", "version": 1, "type": "tool_result",
                           "role": "tool", "content": "x", "payload": payload,
                           "metadata": {"tool_call_id": "c"}}, separators=(",", ":"))

    refused: dict[str, Any] = {"success": False, "error_type": "duplicate_tool_call",
                               "rejected": True}
    own: dict[str, Any] = {"success": True, "result": 1, "rejected": True}  # its own data
    handle.conn.execute("INSERT INTO transcripts (id, status, created_at, updated_at) "
                        "VALUES ('s', 'completed', 0, 0)")
    handle.conn.executemany(
        "INSERT INTO transcript_messages (session_id, position, turn, envelope, created_at) "
        "VALUES ('s', ?, 1, ?, 0)", [(0, envelope(refused)), (1, envelope(own))])
    # The database as a version before m009 left it.
    handle.conn.execute("DELETE FROM _sqlite_migrations WHERE name = 'm009_rejected_mark'")
    handle.conn.commit()
    handle.conn.close()

    reopened = open_handle(path)
    stored = [json.loads(row[0])["payload"] for row in reopened.conn.execute(
        "SELECT envelope FROM transcript_messages ORDER BY position")]
    reopened.conn.close()
    assert stored == [{"success": False, "error_type": "duplicate_tool_call", REJECTED: True},
                      own]
