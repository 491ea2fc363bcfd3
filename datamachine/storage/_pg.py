"""PostgreSQL under the stores: the handle, and a connection that speaks what they speak.

The stores are written once, against the small part of ``sqlite3`` they use: ``execute`` and
``executemany`` with ``?`` placeholders, ``fetchone``/``fetchall``, ``rowcount``, rows read by
name or position, ``in_transaction``. :class:`PgConnection` offers exactly that over a psycopg 3
pool, so every store keeps one code path and one set of tests for both backends; the few
statements that differ ask :func:`datamachine.storage._tx.dialect`.

Why a thread-bound connection and no process-wide lock: a SQLite host shares one connection and
serializes its threads on it. Here each thread borrows its own connection from the pool for a
transaction (or for one statement outside one), so threads and processes run side by side and
PostgreSQL arbitrates.

Why advisory locks instead of ``SERIALIZABLE``: SQLite's ``BEGIN IMMEDIATE`` makes every write
transaction run alone, and the stores rely on it (read a count, then write it). A transaction
here takes a transaction-level advisory lock on each key it names (a session, a job, a spend
window) and a shared lock on the whole database, or that whole-database lock exclusively when it
names none. Writers of different sessions run concurrently; writers of one session, and any
write nobody keyed, run one at a time exactly as on SQLite, and nothing has to be retried.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool, PoolTimeout

from datamachine.errors import DatabaseError, UsageError

__all__ = ["SCHEMA", "PgConnection", "PgHandle", "PgRow", "conninfo", "lock_key", "translate"]

# Every datamachine table lives in this PostgreSQL schema (procrastinate's queue tables too), so
# a database shared with an application never mixes their tables.
SCHEMA = "datamachine"
_WHOLE_DATABASE = "datamachine:database"
POOL_TIMEOUT_S = 30.0
# Rows one multi-row INSERT carries at most (PostgreSQL takes 65,535 parameters a statement);
# a longer batch goes through executemany, in one pipeline.
MULTI_ROW_CHUNK = 1000
# How long a write waits for another's lock before it is a DatabaseError (SQLite's busy
# timeout), and how long a transaction may sit idle before the server ends it, releasing its
# locks (a client that hung mid-transaction must not stop every writer).
LOCK_TIMEOUT_MS = 30_000
IDLE_IN_TRANSACTION_TIMEOUT_MS = 60_000
CONNECT_TIMEOUT_S = 10


def lock_key(name: str) -> int:
    """The 64-bit advisory lock number of ``name`` (a collision only serializes two keys)."""
    return int.from_bytes(hashlib.blake2b(name.encode("utf-8", "surrogatepass"),
                                          digest_size=8).digest(), "big", signed=True)


_WHOLE_KEY = lock_key(_WHOLE_DATABASE)


def hide_password(url: str) -> str:
    """``url`` with its password replaced (in the user part and a ``password=`` parameter),
    for messages and labels."""
    from datamachine.setting_spec import MASK, hide_url_password

    hidden = str(hide_url_password(url))
    try:
        parts = urlsplit(hidden)
    except ValueError:
        return MASK
    if "password" not in parts.query:
        return hidden
    query = [(key, MASK if key == "password" else value)
             for key, value in parse_qsl(parts.query, keep_blank_values=True)]
    return urlunsplit(parts._replace(query=urlencode(query, safe="*", quote_via=quote)))


def _secrets_of(url: str) -> list[str]:
    """The password text of ``url`` as it may appear in a libpq message (raw and decoded)."""
    from urllib.parse import unquote

    found: list[str] = []
    try:
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        if ":" in userinfo:
            found.append(userinfo.split(":", 1)[1])
        found += [value for key, value in parse_qsl(parts.query) if key == "password"]
    except ValueError:
        found.append(url)
    return [text for raw in found for text in {raw, unquote(raw)} if len(text) >= 2]


def scrub(text: str, url: str) -> str:
    """``text`` (a server's or libpq's message) with ``url``'s password cut out."""
    from datamachine.setting_spec import MASK

    for secret in sorted(_secrets_of(url), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


class _UntypedInt(Dumper):
    """Python ints sent with no declared type, as SQLite takes them: PostgreSQL reads each from
    its place in the statement (a ``bigint`` column, a ``LIMIT``, text compared with text), so
    ``max_turns`` holds ``5`` or ``'unlimited'`` through the same statement on both backends."""

    oid = 0

    def dump(self, obj: int) -> bytes:
        return str(obj).encode()


class PgRow:
    """A row read by column name or position, like ``sqlite3.Row``."""

    __slots__ = ("_index", "_values")

    def __init__(self, values: Sequence[Any], index: dict[str, int]) -> None:
        self._values = values
        self._index = index

    def __getitem__(self, key: int | str) -> Any:
        return self._values[self._index[key] if isinstance(key, str) else key]

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def keys(self) -> list[str]:
        return list(self._index)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PgRow):
            return tuple(self._values) == tuple(other._values)
        if isinstance(other, tuple):
            return tuple(self._values) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PgRow({dict(zip(self._index, self._values, strict=True))!r})"


def _row_factory(cursor: Any) -> Any:
    description = cursor.description
    if description is None:
        return tuple
    index = {column.name: i for i, column in enumerate(description)}
    return lambda values: PgRow(values, index)


@lru_cache(maxsize=1024)
def translate(sql: str) -> str:
    """A statement written for ``sqlite3`` in psycopg's terms: ``?`` becomes ``%s`` and a
    literal ``%`` is doubled (outside quoted text and identifiers, where both stay as they
    are)."""
    out: list[str] = []
    quote: str | None = None
    for ch in sql:
        if quote is not None:
            out.append("%%" if ch == "%" else ch)
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
            out.append(ch)
        elif ch == "?":
            out.append("%s")
        elif ch == "%":
            out.append("%%")
        else:
            out.append(ch)
    return "".join(out)


@lru_cache(maxsize=256)
def _multi_row(sql: str, rows: int) -> str | None:
    """``INSERT ... VALUES (?, ...)`` for ``rows`` rows at once, translated; None for any other
    statement (an upsert could meet its own row twice in one statement)."""
    head, found, tail = sql.partition(" VALUES (")
    if not found or rows < 2 or "ON CONFLICT" in sql.upper() or not tail.rstrip().endswith(")") \
            or not head.lstrip().upper().startswith("INSERT"):
        return None
    values = "(" + tail.rstrip()
    return translate(f"{head} VALUES {', '.join([values] * rows)}")


class _Result:
    """What a statement returned, read off the server at once (the connection goes back to the
    pool, or on to the transaction's next statement)."""

    __slots__ = ("_rows", "rowcount")

    lastrowid = None

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self._rows = rows
        self.rowcount = rowcount

    def fetchone(self) -> Any:
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[Any]:
        return self._rows

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)


def _run(conn: psycopg.Connection[Any], sql: str, params: Sequence[Any] | None) -> _Result:
    return _result(conn.execute(translate(sql), params if params is not None else ()))


def _result(cursor: psycopg.Cursor[Any]) -> _Result:
    rows = cursor.fetchall() if cursor.description is not None else []
    return _Result(rows, cursor.rowcount)


class _Cursor:
    """``conn.cursor()``: the stores set ``row_factory`` on it (rows here always read both
    ways) and call ``execute``."""

    __slots__ = ("_conn", "row_factory")

    def __init__(self, conn: PgConnection) -> None:
        self._conn = conn
        self.row_factory: Any = None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Result:
        return self._conn.execute(sql, params)


Statement = tuple[str, Sequence[Any] | None]  # translated SQL and its parameters


class _ThreadState(threading.local):
    """A thread's transaction: its connection, what it does (for errors), whether its BEGIN
    went out, and the statements waiting to go out with the next one (the BEGIN and locks, and
    writes nobody reads the result of: see :meth:`PgConnection.defer`)."""

    conn: psycopg.Connection[Any] | None = None
    action: str = "write"
    started: bool = False
    pending: list[Statement] = []
    deferred: bool = False


class PgConnection:
    """The stores' connection on PostgreSQL (see the module docstring)."""

    dialect = "postgresql"

    def __init__(self, pool: ConnectionPool[Any], label: str) -> None:
        self._pool = pool
        self.label = label
        self._local = _ThreadState()

    # -- statements ------------------------------------------------------------------------
    @property
    def in_transaction(self) -> bool:
        """Whether this thread has a transaction open on this database."""
        return getattr(self._local, "conn", None) is not None

    def execute(self, sql: str, params: Sequence[Any] | None = ()) -> _Result:
        """Run one statement: in this thread's transaction, else on its own (autocommit)."""
        current = self._local.conn
        with self._errors(self._local.action if current is not None else "read"):
            if current is not None:
                if self._local.pending:  # what waits travels with this statement
                    return self._send(current, (translate(sql), params))
                return _run(current, sql, params)
            with self._borrow() as conn:
                try:
                    return _run(conn, sql, params)
                except psycopg.OperationalError:
                    # A pooled connection the server dropped (a restart, an idle cut): a read
                    # is asked again once on a fresh one; a write may have run, so it is not.
                    if not conn.broken or not sql.lstrip()[:6].upper() == "SELECT":
                        raise
            with self._borrow() as conn:
                return _run(conn, sql, params)

    def _send(self, current: psycopg.Connection[Any], last: Statement | None) -> _Result:
        """The waiting statements and ``last`` in one pipeline (one round trip); ``last``'s
        result. Before the BEGIN went out, a connection the server dropped while it sat in the
        pool is replaced and the same sent again once: nothing of the transaction had run."""
        statements = [*self._local.pending, *([last] if last is not None else [])]
        self._local.pending = []
        for attempt in (1, 2):
            try:
                with current.pipeline():
                    cursors = [current.execute(sql, params if params is not None else ())
                               for sql, params in statements]
                self._local.started = True
                return _result(cursors[-1]) if last is not None else _Result([], 0)
            except psycopg.OperationalError:
                if attempt == 2 or self._local.started or not current.broken:
                    raise
                self._putconn(current)  # the pool discards a broken connection
                current = self._local.conn = self._getconn()
        raise AssertionError("unreachable")

    def defer(self, sql: str, params: Sequence[Any] | None = ()) -> None:
        """A write whose result nobody reads: inside a transaction it goes out with the next
        statement or the COMMIT (a turn's messages, its counts and its COMMIT are one round
        trip); outside one, at once. A failure surfaces there, naming the transaction."""
        if self._local.conn is None:
            self.execute(sql, params)
            return
        self._local.pending = [*self._local.pending, (translate(sql), params)]
        self._local.deferred = True

    def defer_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """:meth:`defer` for one statement over several rows (as one multi-row INSERT)."""
        multi = _multi_row(sql, len(rows)) if 1 < len(rows) <= MULTI_ROW_CHUNK else None
        if multi is None or self._local.conn is None:
            if len(rows) == 1:
                self.defer(sql, rows[0])
            elif rows:
                self.executemany(sql, rows)
            return
        self._local.pending = [*self._local.pending,
                               (multi, [value for row in rows for value in row])]
        self._local.deferred = True

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> _Result:
        """Run one statement per row of parameters (in one round trip)."""
        batch = list(rows)
        self._open_now()
        current = getattr(self._local, "conn", None)
        with self._errors(self._local.action if current is not None else "write"):
            if current is not None:
                return self._many(current, sql, batch)
            with self._borrow() as conn, conn.transaction():
                return self._many(conn, sql, batch)

    @staticmethod
    def _many(conn: psycopg.Connection[Any], sql: str, batch: list[Sequence[Any]]) -> _Result:
        if not batch:
            return _Result([], 0)
        if len(batch) <= MULTI_ROW_CHUNK:
            multi = _multi_row(sql, len(batch))
            if multi is not None:  # one statement, one round trip (a turn's messages)
                cursor = conn.execute(multi, [value for row in batch for value in row])
                return _Result([], cursor.rowcount)
        with conn.cursor() as cursor:
            cursor.executemany(translate(sql), batch)
            return _Result([], cursor.rowcount)

    def cursor(self) -> _Cursor:
        return _Cursor(self)

    def close(self) -> None:
        """Close the pool: every connection of this host."""
        self._pool.close()

    # -- transactions ----------------------------------------------------------------------
    def begin(self, keys: Sequence[str], *, read_only: bool = False,
              action: str = "write") -> bool:
        """Open this thread's transaction holding the advisory locks of ``keys`` (see the
        module docstring); inside an open one, take those locks too and report ``False`` (the
        caller makes a savepoint). ``read_only``: one consistent snapshot for several reads."""
        current = getattr(self._local, "conn", None)
        if current is not None:
            if keys and not read_only:
                self._open_now()
                with self._errors(action):
                    current.execute(self._lock_sql(keys))
            return False
        # Nothing is sent yet: BEGIN and the locks go out in one pipeline with the first
        # statement (one round trip fewer per transaction; every turn of a run opens one).
        self._local.conn = self._getconn()
        self._local.action = action
        self._local.started = False
        self._local.deferred = False
        self._local.pending = (
            [("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", None)] if read_only
            else [("BEGIN", None), (self._lock_sql(keys), None)])
        return True

    def _open_now(self) -> None:
        """Send what waits on its own (before a statement that cannot carry it)."""
        conn = self._local.conn
        if self._local.pending and conn is not None:
            with self._errors(self._local.action):
                self._send(conn, None)

    def end(self, commit: bool, action: str) -> None:
        """Commit (or roll back) this thread's transaction and return its connection; a
        failed commit is a DatabaseError naming ``action`` (nothing of it was stored)."""
        conn = self._local.conn
        assert conn is not None, "end() without begin()"
        if not self._local.started and not (commit and self._local.deferred):
            self._local.conn = None  # nothing was sent: nothing to end
            self._local.pending = []
            self._putconn(conn)
            return
        if not commit:
            self._local.pending = []  # never sent: nothing to undo
        try:
            if commit and self._local.pending:  # the waiting writes go out with the COMMIT
                with self._errors(action):
                    self._send(conn, ("COMMIT", None))
                return
            if commit and conn.info.transaction_status == TransactionStatus.INERROR:
                # A statement failed and its error was caught inside the block: PostgreSQL
                # would turn COMMIT into a silent rollback. SQLite would have kept the rest;
                # say that nothing was stored instead.
                conn.execute("ROLLBACK")
                raise DatabaseError(
                    f"Cannot {action} in the database {self.label}: a statement of the "
                    "transaction failed, so PostgreSQL stored none of it. Let the error "
                    "propagate, or use a savepoint (a nested write block) around the statement "
                    "that may fail.")
            conn.execute("COMMIT" if commit else "ROLLBACK")
        except psycopg.Error as exc:
            if commit:
                raise self._database_error(action, exc) from exc
        finally:
            self._local.conn = None
            self._local.pending = []
            self._putconn(conn)

    def savepoint(self, name: str, action: str) -> None:
        """``action``: ``SAVEPOINT``, ``RELEASE SAVEPOINT`` or ``ROLLBACK TO SAVEPOINT``."""
        assert self._local.conn is not None, "a savepoint outside a transaction"
        self.execute(f"{action} {name}", None)

    @staticmethod
    def _lock_sql(keys: Sequence[str]) -> str:
        if not keys:
            return f"SELECT pg_advisory_xact_lock({_WHOLE_KEY})"
        numbers = sorted({lock_key(key) for key in keys})  # one order everywhere: no deadlock
        return (f"SELECT pg_advisory_xact_lock_shared({_WHOLE_KEY}), "
                + ", ".join(f"pg_advisory_xact_lock({n})" for n in numbers))

    # -- the pool --------------------------------------------------------------------------
    def _getconn(self) -> psycopg.Connection[Any]:
        try:
            conn: psycopg.Connection[Any] = self._pool.getconn(timeout=POOL_TIMEOUT_S)
            return conn
        except PoolTimeout as exc:
            raise DatabaseError(
                f"No connection to the database {self.label} within {POOL_TIMEOUT_S:g} s "
                f"({exc}). Check that the server is up and reachable, or raise its "
                "max_connections / DATAMACHINE_DB_POOL_SIZE.") from None

    def _putconn(self, conn: psycopg.Connection[Any]) -> None:
        # The pool would roll back a connection returned mid-transaction too, with a warning;
        # after a failed COMMIT that is expected, so it is done here quietly.
        if not conn.broken and conn.info.transaction_status != TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")
        self._pool.putconn(conn)

    def _borrow(self) -> _Borrowed:
        return _Borrowed(self)

    def _errors(self, action: str) -> _Errors:
        return _Errors(self, action)

    def _database_error(self, action: str, exc: psycopg.Error) -> DatabaseError:
        text = str(exc).strip()
        hint = ("" if isinstance(exc, psycopg.IntegrityError | psycopg.errors.RaiseException)
                else " If the server restarted or the network dropped, retry; check "
                "DATAMACHINE_DB otherwise.")
        return DatabaseError(f"Cannot {action} in the database {self.label}: "
                             f"{text.splitlines()[0] if text else type(exc).__name__}.{hint}")


class _Borrowed:
    __slots__ = ("_conn", "_owner")

    def __init__(self, owner: PgConnection) -> None:
        self._owner = owner

    def __enter__(self) -> psycopg.Connection[Any]:
        self._conn = self._owner._getconn()
        return self._conn

    def __exit__(self, *exc: object) -> None:
        self._owner._putconn(self._conn)


class _Errors:
    """psycopg's failures as the stores' own: a value the server cannot take (out of range, a
    NUL character) is a UsageError naming the fix; anything else a DatabaseError naming the
    database."""

    __slots__ = ("_action", "_owner")

    def __init__(self, owner: PgConnection, action: str) -> None:
        self._owner = owner
        self._action = action

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: object) -> None:
        if exc is None or not isinstance(exc, psycopg.Error | ValueError):
            return
        if isinstance(exc, psycopg.DataError | ValueError):
            # ValueError: psycopg refuses text holding NUL before sending it.
            raise UsageError(
                f"Cannot {self._action} the database: a value given cannot be stored in it "
                f"({str(exc).splitlines()[0]}). Check the arguments: ids and counts are "
                "integers up to 2**63 - 1, text must be valid UTF-8 without NUL "
                "characters.") from None
        raise self._owner._database_error(self._action, exc) from exc


def conninfo(url: str) -> str:
    """``url`` with datamachine's schema first on the search path (and an application name
    that ``pg_stat_activity`` shows)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    extra = (f"-c search_path={SCHEMA} -c lock_timeout={LOCK_TIMEOUT_MS} "
             f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_TIMEOUT_MS}")
    query["options"] = f"{query['options']} {extra}" if "options" in query else extra
    query.setdefault("application_name", "datamachine")
    # A peer that vanished (a dead worker's machine, a cut network) is noticed in about a
    # minute instead of the kernel's two hours.
    for key, value in (("keepalives", "1"), ("keepalives_idle", "30"),
                       ("keepalives_interval", "10"), ("keepalives_count", "3")):
        query.setdefault(key, value)
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


def _configure(conn: psycopg.Connection[Any]) -> None:
    conn.adapters.register_dumper(int, _UntypedInt)
    conn.row_factory = _row_factory


class PgHandle:
    """A host's PostgreSQL database: a psycopg pool behind the stores' :class:`PgConnection`.

    ``database`` (sqlite-utils) does not exist here: it is a SQLite tool.
    """

    __slots__ = ("__weakref__", "conn", "label", "url")

    def __init__(self, url: str, *, max_size: int = 10) -> None:
        self.url = url
        self.label = hide_password(url)
        info = conninfo(url)
        # One connection first, so a wrong address or password fails at once with the
        # server's reason (the pool would keep retrying until its timeout).
        try:
            psycopg.connect(info, connect_timeout=CONNECT_TIMEOUT_S).close()
        except psycopg.Error as exc:
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            reason = scrub(" ".join(lines) if lines else type(exc).__name__, url)
            raise DatabaseError(
                f"Cannot connect to the database {self.label} ({reason}). Check that the "
                "server is running, the address and credentials in DATAMACHINE_DB, and that "
                "the database exists (createdb).") from None
        pool: ConnectionPool[Any] = ConnectionPool(
            info, min_size=1, max_size=max_size, open=False, configure=_configure,
            kwargs={"autocommit": True}, name="datamachine")
        try:
            pool.open(wait=True, timeout=POOL_TIMEOUT_S)
        except PoolTimeout as exc:
            pool.close()
            raise DatabaseError(f"Cannot connect to the database {self.label} "
                                f"({scrub(str(exc), url)}).") from None
        self.conn = PgConnection(pool, self.label)

    @property
    def database(self) -> Any:
        raise DatabaseError(
            f"host.db is the sqlite-utils Database of a SQLite host; this host is on "
            f"PostgreSQL ({self.label}). Use the stores (host.transcripts, host.jobs, ...) or "
            "host.handle.conn.execute(sql, params).")

    @property
    def migrated(self) -> bool:
        from datamachine.storage.pg_migrations import pending

        return not pending(self.conn)
