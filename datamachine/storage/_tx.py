"""Write transactions shared by every store: one lock per connection, ``BEGIN IMMEDIATE``.

On PostgreSQL (``datamachine.storage._pg``) the same calls borrow a connection per thread and
take advisory locks instead; see that module for why.

Why ``BEGIN IMMEDIATE``: a deferred transaction that reads and then writes can fail at once with
``database is locked`` when another process wrote in between (SQLite cannot wait there without
risking a deadlock). Taking the write lock up front makes SQLite's busy timeout apply instead, so
concurrent processes queue rather than fail.

Why one lock per connection (not per store): the host shares one ``sqlite3`` connection across
threads, and a transaction belongs to the connection. Two stores writing from two threads on one
connection would otherwise nest into each other's transaction.
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from datamachine.errors import DatabaseError, UsageError

if TYPE_CHECKING:
    from datamachine.storage._pg import PgConnection

__all__ = ["Conn", "Connected", "StoreLock", "connection_lock", "db_label", "dialect",
           "immediate", "is_utf8", "no_lock", "query", "query_one", "share_lock", "snapshot",
           "sqlite_errors", "unstorable", "write_later", "write_many_later"]


class Rows(Protocol):
    """What a statement gives back, on either backend."""

    @property
    def rowcount(self) -> int: ...

    @property
    def lastrowid(self) -> int | None: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Conn(Protocol):
    """The part of a ``sqlite3.Connection`` the stores use; PostgreSQL's
    :class:`~datamachine.storage._pg.PgConnection` offers the same."""

    @property
    def in_transaction(self) -> bool: ...

    def execute(self, sql: str, parameters: Any = ..., /) -> Rows: ...

    def executemany(self, sql: str, parameters: Any, /) -> Rows: ...


class Connected(Protocol):
    """What a store needs of a database: its connection. A sqlite-utils ``Database`` has one,
    and so has the host's :class:`datamachine.storage.database.DatabaseHandle`, which lets a
    host boot without importing sqlite-utils, and its PostgreSQL twin ``PgHandle``."""

    @property
    def conn(self) -> sqlite3.Connection | PgConnection: ...


class StoreLock(Protocol):
    """The lock a store holds around its use of the connection (``threading.RLock`` on SQLite;
    nothing to hold on PostgreSQL, where every thread has its own connection)."""

    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...

    def release(self) -> None: ...

    def __enter__(self) -> bool: ...

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None, /) -> None: ...


class _NoLock:
    """The lock of a PostgreSQL handle: nothing to serialize in this process."""

    __slots__ = ()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return True

    def release(self) -> None:
        return None

    def __enter__(self) -> bool:
        return True

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None, /) -> None:
        return None


_NO_LOCK = _NoLock()


def no_lock() -> StoreLock:
    """The lock that holds nothing (PostgreSQL's: see :class:`StoreLock`)."""
    return _NO_LOCK


def _pg(db: Connected) -> PgConnection | None:
    conn = db.conn
    if type(conn) is sqlite3.Connection or getattr(conn, "dialect", "") != "postgresql":
        return None
    return conn  # type: ignore[return-value]


def write_later(conn: Conn, sql: str, params: Sequence[object]) -> None:
    """A write inside a transaction whose result nobody reads. SQLite runs it at once;
    PostgreSQL sends it with the transaction's next statement or its COMMIT (one round trip
    fewer; see ``PgConnection.defer``)."""
    defer = None if type(conn) is sqlite3.Connection else getattr(conn, "defer", None)
    if defer is None:
        conn.execute(sql, params)
    else:
        defer(sql, params)


def write_many_later(conn: Conn, sql: str, rows: Sequence[Sequence[object]]) -> None:
    """:func:`write_later` for one statement over several rows."""
    defer_many = None if type(conn) is sqlite3.Connection else getattr(conn, "defer_many", None)
    if defer_many is None:
        conn.executemany(sql, rows)
    else:
        defer_many(sql, rows)


def dialect(conn: object) -> str:
    """``"sqlite"`` or ``"postgresql"``: which SQL ``conn`` speaks, for the few statements
    that differ."""
    return "sqlite" if type(conn) is sqlite3.Connection else str(getattr(conn, "dialect",
                                                                          "sqlite"))


_LOCKS: weakref.WeakKeyDictionary[Connected, StoreLock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def connection_lock(db: Connected) -> StoreLock:
    """The re-entrant lock every store takes before using ``db``'s connection."""
    if _pg(db) is not None:
        return _NO_LOCK
    with _LOCKS_GUARD:
        lock = _LOCKS.get(db)
        if lock is None:
            lock = _LOCKS[db] = threading.RLock()
        return lock


def is_utf8(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8, as SQLite stores text (every string but one
    holding a lone surrogate, which a decoder with ``surrogateescape`` can produce)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# The failures of binding a caller's value to a statement: an int beyond 64 bits, text that
# is not UTF-8, a type SQLite has no column for (sqlite3 says "Error binding parameter").
_UNBINDABLE = (OverflowError, UnicodeEncodeError)


def unstorable(action: str, exc: BaseException) -> UsageError | None:
    """The UsageError for a value SQLite cannot take (see ``_UNBINDABLE``), else None.

    Every store checks its arguments and names the bad one; this is the net under those checks,
    so a value one of them missed is still a typed error saying what failed, never an
    ``OverflowError`` from deep inside sqlite3.
    """
    if isinstance(exc, _UNBINDABLE) or (isinstance(exc, sqlite3.ProgrammingError)
                                        and "binding parameter" in str(exc)):
        return UsageError(f"Cannot {action}: a value given cannot be stored in the database "
                          f"({exc}). Check the arguments: ids and counts are integers up to "
                          "2**63 - 1, text must be valid UTF-8.")
    return None


def query(conn: Conn | sqlite3.Connection, sql: str, params: Sequence[object] = ()) -> list[Any]:
    """Rows whose columns are read by name (``row["status"]``), on the shared connection.

    The row factory is set on this cursor only: sqlite-utils, which shares the connection,
    keeps its plain tuples. A parameter SQLite cannot take is a UsageError (``unstorable``).
    """
    cursor = conn.cursor()  # type: ignore[union-attr]
    cursor.row_factory = sqlite3.Row
    try:
        rows: list[Any] = cursor.execute(sql, params).fetchall()
        return rows
    except (*_UNBINDABLE, sqlite3.ProgrammingError) as exc:
        raise unstorable("read the database", exc) or exc from None


def query_one(conn: Conn | sqlite3.Connection, sql: str,
              params: Sequence[object] = ()) -> Any:
    """The first row of :func:`query`, or None."""
    cursor = conn.cursor()  # type: ignore[union-attr]
    cursor.row_factory = sqlite3.Row
    try:
        row = cursor.execute(sql, params).fetchone()
    except (*_UNBINDABLE, sqlite3.ProgrammingError) as exc:
        raise unstorable("read the database", exc) or exc from None
    return row


def share_lock(source: Connected, other: Connected) -> None:
    """Make ``other`` (another wrapper of the same connection) use ``source``'s lock."""
    lock = connection_lock(source)
    with _LOCKS_GUARD:
        _LOCKS[other] = lock


def db_label(db: Connected) -> str:
    """The file behind ``db`` (or ``:memory:``, or the PostgreSQL URL without its password),
    for error messages that name it."""
    pg = _pg(db)
    if pg is not None:
        return pg.label
    try:
        for row in db.conn.execute("PRAGMA database_list").fetchall():
            if row[1] == "main":
                return str(row[2]) or ":memory:"
    except sqlite3.Error:
        pass
    return "database"


def _database_error(label: str, action: str, exc: sqlite3.Error) -> DatabaseError:
    return DatabaseError(
        f"Cannot {action} in the database {label}: {exc}. If another process holds the "
        "database for longer than the busy timeout, retry; if the file is damaged, restore "
        "it or point DATAMACHINE_DB elsewhere."
    )


@contextmanager
def sqlite_errors(label: str, action: str) -> Iterator[None]:
    """Turn a raw ``sqlite3`` failure into a :class:`DatabaseError` naming the file."""
    try:
        yield
    except sqlite3.Error as exc:
        raise _database_error(label, action, exc) from exc


class immediate:
    """Run the block as one write transaction, holding ``lock``.

    Outside a transaction this is ``BEGIN IMMEDIATE`` … ``COMMIT`` (``ROLLBACK`` on any error). If
    the caller already opened one (for example with ``db.atomic()``), the block becomes a savepoint
    inside it, so the caller still decides whether everything commits together. A ``sqlite3``
    failure anywhere in it surfaces as a :class:`DatabaseError` naming the file.

    ``keys`` name what the block writes (``"session:<id>"``, ``"job:<id>"``): on PostgreSQL
    only blocks sharing a key (or naming none) wait for each other; SQLite runs every write
    transaction alone anyway.

    A class rather than a ``@contextmanager`` generator: every turn of a persisted run opens one,
    and the generator machinery cost more than the rest of the bookkeeping around the SQL.
    """

    __slots__ = ("_action", "_conn", "_db", "_keys", "_label", "_lock", "_pg", "_savepoint")

    _conn: Any

    def __init__(self, db: Connected, lock: StoreLock, label: str, action: str,
                 keys: Sequence[str] = ()) -> None:
        self._db = db
        self._lock = lock
        self._label = label
        self._action = action
        self._keys = keys
        self._savepoint: str | None = None
        self._pg = _pg(db)

    def __enter__(self) -> Conn:
        if self._pg is not None:
            return self._enter_pg(self._pg)
        self._lock.acquire()
        try:
            conn = self._conn = self._db.conn
            if conn.in_transaction:
                self._savepoint = f"dm_{secrets.token_hex(8)}"
                conn.execute(f"SAVEPOINT {self._savepoint}")
            else:
                conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            self._lock.release()
            raise _database_error(self._label, self._action, exc) from exc
        except BaseException:
            self._lock.release()
            raise
        return conn

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: object) -> None:
        if self._pg is not None:
            self._exit_pg(self._pg, exc)
            return
        conn, savepoint = self._conn, self._savepoint
        try:
            if exc_type is None:
                if savepoint is not None:
                    conn.execute(f"RELEASE SAVEPOINT {savepoint}")
                    return
                try:
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                return
            if conn.in_transaction:
                if savepoint is None:
                    conn.execute("ROLLBACK")
                else:
                    conn.execute(f"ROLLBACK TO SAVEPOINT {savepoint}")
                    conn.execute(f"RELEASE SAVEPOINT {savepoint}")
        except sqlite3.Error as failure:
            raise _database_error(self._label, self._action, failure) from failure
        finally:
            self._lock.release()
        if exc is not None:
            refused = unstorable(self._action, exc)
            if refused is not None:
                raise refused from None  # rolled back: the value reached nothing
        if isinstance(exc, sqlite3.Error):
            raise _database_error(self._label, self._action, exc) from exc

    def _enter_pg(self, pg: PgConnection) -> PgConnection:
        if not pg.begin(self._keys, action=self._action):
            self._savepoint = f"dm_{secrets.token_hex(8)}"
            pg.savepoint(self._savepoint, "SAVEPOINT")
        return pg

    def _exit_pg(self, pg: PgConnection, exc: BaseException | None) -> None:
        savepoint = self._savepoint
        if savepoint is not None:
            if exc is None:
                pg.savepoint(savepoint, "RELEASE SAVEPOINT")
            else:
                pg.savepoint(savepoint, "ROLLBACK TO SAVEPOINT")
                pg.savepoint(savepoint, "RELEASE SAVEPOINT")
        else:
            pg.end(commit=exc is None, action=self._action)
        if exc is not None:
            refused = unstorable(self._action, exc)
            if refused is not None:
                raise refused from None


@contextmanager
def snapshot(db: Connected, lock: StoreLock, label: str) -> Iterator[Any]:
    """Run several reads against one consistent snapshot (a read transaction), holding ``lock``.

    Without it, another process could commit between two SELECTs, and a transcript's row would
    disagree with its messages. Inside a caller's transaction the reads simply join it.
    """
    pg = _pg(db)
    if pg is not None:
        opened = pg.begin((), read_only=True, action="read")
        try:
            yield pg
        finally:
            if opened:
                pg.end(commit=True, action="read")
        return
    with lock, sqlite_errors(label, "read"):
        conn = db.conn
        assert isinstance(conn, sqlite3.Connection)
        if conn.in_transaction:
            yield conn
            return
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")
