"""The write transaction every store uses: commit, rollback, savepoints, errors, the lock."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from datamachine.errors import DatabaseError
from datamachine.host import Host
from datamachine.storage._tx import connection_lock, immediate


def _rows(host: Host) -> list[tuple[str, str]]:
    return host.db.conn.execute("SELECT key, value FROM settings ORDER BY key").fetchall()


def _insert(conn: sqlite3.Connection, key: str) -> None:
    conn.execute("INSERT INTO settings (key, value, updated_at) VALUES (?, '1', 0)", [key])


def _lock_is_free(lock: threading.RLock) -> bool:
    # Another thread can take it only if this one released every hold.
    got: list[bool] = []

    def try_it() -> None:
        got.append(lock.acquire(blocking=False))
        if got[0]:
            lock.release()

    thread = threading.Thread(target=try_it)
    thread.start()
    thread.join()
    return got[0]


def test_a_block_commits_as_one_transaction_and_frees_the_lock(host: Host) -> None:
    before = _rows(host)
    lock = connection_lock(host.db)
    with immediate(host.db, lock, "test.db", "write") as conn:
        assert conn.in_transaction
        _insert(conn, "tx_a")
        _insert(conn, "tx_b")
    assert not host.db.conn.in_transaction
    assert _rows(host) == sorted([*before, ("tx_a", "1"), ("tx_b", "1")])
    assert _lock_is_free(lock)


def test_a_sqlite_failure_rolls_back_everything_and_names_the_file_and_action(
    host: Host,
) -> None:
    before = _rows(host)
    lock = connection_lock(host.db)
    def write() -> None:
        with immediate(host.db, lock, "test.db", "store a thing") as conn:
            _insert(conn, "tx_a")
            _insert(conn, "tx_a")  # the primary key refuses the second

    with pytest.raises(DatabaseError, match=r"Cannot store a thing in the database test\.db") \
            as info:
        write()
    assert isinstance(info.value.__cause__, sqlite3.IntegrityError)
    assert not host.db.conn.in_transaction
    assert _rows(host) == before
    assert _lock_is_free(lock)


def test_any_other_failure_rolls_back_and_propagates_unchanged(host: Host) -> None:
    before = _rows(host)
    lock = connection_lock(host.db)
    def write() -> None:
        with immediate(host.db, lock, "test.db", "write") as conn:
            _insert(conn, "tx_a")
            raise KeyError("boom")

    with pytest.raises(KeyError):
        write()
    assert _rows(host) == before
    assert _lock_is_free(lock)


def test_inside_a_callers_transaction_the_block_is_a_savepoint(host: Host) -> None:
    before = _rows(host)
    lock = connection_lock(host.db)
    conn = host.db.conn
    conn.execute("BEGIN IMMEDIATE")
    _insert(conn, "outer")
    def write() -> None:
        with immediate(host.db, lock, "test.db", "write") as inner:
            _insert(inner, "inner")
            _insert(inner, "inner")

    with pytest.raises(DatabaseError):
        write()
    # Only the block was undone; the caller's transaction is still open and still its own.
    assert conn.in_transaction
    with immediate(host.db, lock, "test.db", "write") as inner:
        _insert(inner, "kept")
    assert conn.in_transaction  # released into the caller's transaction, not committed
    conn.execute("ROLLBACK")
    assert _rows(host) == before
    assert _lock_is_free(lock)


def test_a_failed_commit_rolls_back_and_frees_the_lock(host: Host) -> None:
    before = _rows(host)
    lock = connection_lock(host.db)
    # A deferred foreign key is checked at COMMIT, so the commit itself fails.
    def write() -> None:
        with immediate(host.db, lock, "test.db", "write") as conn:
            _insert(conn, "tx_a")
            conn.execute("PRAGMA defer_foreign_keys = ON")
            conn.execute(
                "INSERT INTO transcript_messages (session_id, position, turn, envelope, "
                "created_at) VALUES ('nobody', 0, 0, '{}', 0)")

    with pytest.raises(DatabaseError, match="FOREIGN KEY"):
        write()
    assert not host.db.conn.in_transaction
    assert _rows(host) == before
    assert _lock_is_free(lock)
