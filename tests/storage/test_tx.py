"""The write transaction every store uses: commit, rollback, savepoints, errors, the lock."""

from __future__ import annotations

import contextlib
import re
import sqlite3
import threading

import psycopg
import pytest

from datamachine.errors import DatabaseError
from datamachine.host import Host
from datamachine.storage._tx import Conn, StoreLock, connection_lock, db_label, immediate
from tests.storage import backends


def _rows(host: Host) -> list[tuple[str, str]]:
    rows = host.handle.conn.execute("SELECT key, value FROM settings ORDER BY key").fetchall()
    return [(row[0], row[1]) for row in rows]


def _insert(conn: Conn, key: str) -> None:
    conn.execute("INSERT INTO settings (key, value, updated_at) VALUES (?, '1', 0)", [key])


def _lock_is_free(lock: StoreLock) -> bool:
    # Another thread can take it only if this one released every hold.
    got: list[bool] = []

    def try_it() -> None:
        got.append(lock.acquire(blocking=False))
        if got[0]:
            lock.release()

    thread = threading.Thread(target=try_it)
    thread.start()
    thread.join(timeout=30)
    return got[0]


def test_a_block_commits_as_one_transaction_and_frees_the_lock(host: Host) -> None:
    before = _rows(host)
    lock = connection_lock(host.handle)
    with immediate(host.handle, lock, "test.db", "write") as conn:
        assert conn.in_transaction
        _insert(conn, "tx_a")
        _insert(conn, "tx_b")
    assert not host.handle.conn.in_transaction
    assert _rows(host) == sorted([*before, ("tx_a", "1"), ("tx_b", "1")])
    assert _lock_is_free(lock)


def test_a_sqlite_failure_rolls_back_everything_and_names_the_file_and_action(
    host: Host,
) -> None:
    before = _rows(host)
    lock = connection_lock(host.handle)
    label = db_label(host.handle)
    def write() -> None:
        with immediate(host.handle, lock, label, "store a thing") as conn:
            _insert(conn, "tx_a")
            _insert(conn, "tx_a")  # the primary key refuses the second

    expected = f"Cannot store a thing in the database {re.escape(label)}"
    with pytest.raises(DatabaseError, match=expected) as info:
        write()
    assert isinstance(info.value.__cause__,
                      psycopg.errors.UniqueViolation if backends.is_postgres(host)
                      else sqlite3.IntegrityError)
    assert not host.handle.conn.in_transaction
    assert _rows(host) == before
    assert _lock_is_free(lock)


def test_any_other_failure_rolls_back_and_propagates_unchanged(host: Host) -> None:
    before = _rows(host)
    lock = connection_lock(host.handle)
    def write() -> None:
        with immediate(host.handle, lock, "test.db", "write") as conn:
            _insert(conn, "tx_a")
            raise KeyError("boom")

    with pytest.raises(KeyError):
        write()
    assert _rows(host) == before
    assert _lock_is_free(lock)


def test_inside_a_callers_transaction_the_block_is_a_savepoint(host: Host) -> None:
    before = _rows(host)
    lock = connection_lock(host.handle)

    class CallerRollsBack(Exception):
        pass

    def write() -> None:
        with immediate(host.handle, lock, "test.db", "write") as inner:
            _insert(inner, "inner")
            _insert(inner, "inner")

    def callers_transaction() -> None:
        with immediate(host.handle, lock, "test.db", "the caller's") as conn:
            _insert(conn, "outer")
            with pytest.raises(DatabaseError):
                write()
            # Only the block was undone; the caller's transaction is still open and its own.
            assert conn.in_transaction
            assert ("outer", "1") in _rows(host)
            with immediate(host.handle, lock, "test.db", "write") as inner:
                _insert(inner, "kept")
            assert conn.in_transaction  # released into the caller's transaction, uncommitted
            assert ("kept", "1") in _rows(host)
            raise CallerRollsBack

    with pytest.raises(CallerRollsBack):
        callers_transaction()
    assert _rows(host) == before
    assert _lock_is_free(lock)


def test_a_failed_commit_rolls_back_and_frees_the_lock(host: Host,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    before = _rows(host)
    lock = connection_lock(host.handle)
    postgres = backends.is_postgres(host)

    # SQLite checks a deferred foreign key at COMMIT; on PostgreSQL a deferred constraint
    # trigger fails it. Either way the commit itself fails.
    def write() -> None:
        with immediate(host.handle, lock, "test.db", "write") as conn:
            _insert(conn, "tx_a")
            if not postgres:
                conn.execute("PRAGMA defer_foreign_keys = ON")
            conn.execute(
                "INSERT INTO transcripts (id, status, created_at, updated_at) "
                "VALUES ('t', 'running', 0, 0)")
            if not postgres:
                conn.execute("INSERT INTO transcript_messages (session_id, position, turn, "
                             "envelope, created_at) VALUES ('nobody', 0, 0, '{}', 0)")

    with contextlib.ExitStack() as stack:
        if postgres:
            stack.enter_context(backends.failing_commits(host, monkeypatch))
        with pytest.raises(DatabaseError, match="disk I/O error" if postgres else "FOREIGN KEY"):
            write()
    assert not host.handle.conn.execute("SELECT id FROM transcripts").fetchall()
    assert not host.handle.conn.in_transaction
    assert _rows(host) == before
    assert _lock_is_free(lock)
