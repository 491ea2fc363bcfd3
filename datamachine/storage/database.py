"""Opening a host's database, and migrating it: the one SQLite file (or the PostgreSQL
database of a ``postgresql://`` URL, through :mod:`datamachine.storage._pg`) its stores share.

Every SQLite connection gets WAL mode and a busy timeout, so readers never block the writer and
a briefly locked database waits instead of surfacing ``database is locked``. Failures name the
path and say what to do; a foreign or corrupt file is refused before anything is written to it.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from datamachine.errors import DatabaseError
from datamachine.storage._tx import connection_lock, share_lock

if TYPE_CHECKING:
    from sqlite_utils import Database

__all__ = ["BUSY_TIMEOUT_MS", "DatabaseHandle", "default_db_path", "default_db_target",
           "is_postgres_url", "open_database", "open_handle", "open_postgres"]

T = TypeVar("T")

BUSY_TIMEOUT_MS = 30_000
DB_ENV = "DATAMACHINE_DB"
# Connections a PostgreSQL host keeps open at most (one per thread writing at once).
POOL_SIZE_ENV = "DATAMACHINE_DB_POOL_SIZE"
DEFAULT_POOL_SIZE = 10
# The schema's migrations (datamachine.storage.sqlite_migrations) as sqlite-utils records
# them: read here without importing sqlite-utils, so a boot on a current database does not
# load it at all.
# tests/storage/test_database.py checks they match the migrations themselves.
MIGRATIONS_TABLE = "_sqlite_migrations"
MIGRATION_SET = "datamachine"
MIGRATION_NAMES = ("m001_settings", "m002_transcripts", "m003_transcript_locks",
                   "m004_chat_sessions", "m005_jobs", "m006_api_tokens", "m007_spend",
                   "m008_token_claims", "m009_rejected_mark", "m010_run_viewer",
                   "m011_compactions", "m012_job_outcome", "m013_tool_intents")


class DatabaseHandle:
    """A host's open database: the ``sqlite3`` connection its stores share, and the
    sqlite-utils ``Database`` over that connection, built when first asked for.

    Why a handle and not the ``Database`` itself: the stores only need the connection, and
    importing sqlite-utils is one of the largest parts of a boot (it loads click, dateutil and
    scans the installed packages for its own plugins). A host booted on a database whose schema
    is current never imports it, until ``host.db`` is read.
    """

    __slots__ = ("__weakref__", "_database", "conn", "label")

    def __init__(self, conn: sqlite3.Connection, label: str) -> None:
        self.conn = conn
        self.label = label
        self._database: Database | None = None

    @property
    def database(self) -> Database:
        """The sqlite-utils ``Database`` on this connection (it shares the stores' lock)."""
        # Under the connection's lock: building it runs statements on the shared connection,
        # which must not land inside another thread's transaction.
        with connection_lock(self):
            if self._database is None:
                from sqlite_utils import Database

                database = Database(self.conn)
                share_lock(self, database)
                self._database = database
            return self._database

    @property
    def migrated(self) -> bool:
        """Whether every migration of the schema is recorded as applied."""
        return _schema_is_current(self.conn)


def default_db_path() -> Path:
    """``$DATAMACHINE_DB``, else ``datamachine.db`` in the user data directory (a PostgreSQL
    URL there is :func:`default_db_target`'s business)."""
    configured = os.environ.get(DB_ENV)
    if configured and not is_postgres_url(configured):
        return Path(configured).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("datamachine", appauthor=False)) / "datamachine.db"


def default_db_target() -> Path | str:
    """``$DATAMACHINE_DB`` as a PostgreSQL URL when it is one, else :func:`default_db_path`."""
    configured = os.environ.get(DB_ENV, "")
    return configured if is_postgres_url(configured) else default_db_path()


def is_postgres_url(target: object) -> bool:
    """Whether ``target`` names a PostgreSQL database (``postgresql://`` or ``postgres://``,
    the scheme in any case, surrounding blanks ignored)."""
    return isinstance(target, str) and target.strip().lower().startswith(
        ("postgresql://", "postgres://"))


_URL_LIKE = re.compile(r"^\s*[A-Za-z][A-Za-z0-9+.\-]*:/")


def _postgres_url(target: str) -> str:
    text = target.strip()
    scheme, _, rest = text.partition("://")
    return f"{scheme.lower()}://{rest}"


def _refuse_other_urls(target: object) -> None:
    """A value that looks like a URL but is not a PostgreSQL one is a mistake, not a file
    name: say so (with its password masked) instead of trying to create a directory named
    after it."""
    if isinstance(target, str | Path) and _URL_LIKE.match(str(target)) \
            and not is_postgres_url(str(target)) and not str(target).startswith("file:"):
        from datamachine.storage._pg import hide_password

        raise DatabaseError(
            f"The database {hide_password(str(target).strip())} looks like a URL, but only "
            "postgresql:// (or postgres://) URLs name a database; give that, or a file path, "
            "in DATAMACHINE_DB / db_path.")


def open_postgres(url: str) -> Any:
    """A :class:`~datamachine.storage._pg.PgHandle` on ``url``, migrated (psycopg is imported
    only here: a SQLite host never loads it)."""
    try:
        from datamachine.storage._pg import PgHandle
    except ImportError as exc:
        raise DatabaseError(
            f"DATAMACHINE_DB names a PostgreSQL database, but psycopg is not installed ({exc}). "
            "Install the extra: pip install 'datamachine-agents[postgres]'.") from None
    from datamachine.storage.pg_migrations import migrate

    handle = PgHandle(url, max_size=_pool_size())
    try:
        migrate(handle)
    except BaseException:
        handle.conn.close()
        raise
    return handle


def _pool_size() -> int:
    raw = os.environ.get(POOL_SIZE_ENV, "")
    if not raw:
        return DEFAULT_POOL_SIZE
    if not raw.isdigit() or not 1 <= int(raw) <= 1000:
        raise DatabaseError(f"{POOL_SIZE_ENV} must be a whole number from 1 to 1000, got "
                            f"{raw!r}.")
    return int(raw)


def _connect(path: Path | str) -> sqlite3.Connection:
    # check_same_thread=False: the server and async runs touch the host from worker threads;
    # the stores serialize their use of the connection (datamachine.storage._tx).
    conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA foreign_keys = ON")
        # What sqlite-utils' Database sets on a connection it wraps, set here from the start
        # so the connection behaves the same before and after host.db is first read.
        conn.execute("PRAGMA recursive_triggers = ON")
    except BaseException:
        conn.close()
        raise
    return conn


def open_database(path: str | Path | None = None, *, create_parent: bool | None = None) -> Database:
    """Open (creating if needed) and migrate the database at ``path``; its sqlite-utils
    ``Database``.

    ``None`` means :func:`default_db_path` (whose directory is created); ``":memory:"`` gives a
    private in-memory database for tests. A missing directory given explicitly is an error, not
    silently created, so a typo in a path is noticed. Every failure is a :class:`DatabaseError`
    naming the path: a missing or unwritable directory, a file that is not SQLite, a SQLite file
    that belongs to another application, a migration that failed.
    """
    return open_handle(path, create_parent=create_parent).database


def open_handle(path: str | Path | None = None, *,
                create_parent: bool | None = None) -> DatabaseHandle:
    """Like :func:`open_database`, as a :class:`DatabaseHandle`: sqlite-utils is imported only
    if a migration is pending (a new file) or the ``Database`` is asked for.

    A ``postgresql://`` URL (given, or in ``$DATAMACHINE_DB``) opens PostgreSQL instead: a
    ``PgHandle`` with the same ``conn`` the stores use (DESIGN.md 18)."""
    if path is None:
        _refuse_other_urls(os.environ.get(DB_ENV, ""))
        target: Path | str = default_db_target()
        if isinstance(target, str):
            return open_postgres(_postgres_url(target))  # type: ignore[no-any-return]
        create_parent = True if create_parent is None else create_parent
    elif is_postgres_url(path):
        return open_postgres(_postgres_url(str(path)))  # type: ignore[no-any-return]
    else:
        _refuse_other_urls(path)
        target = path if str(path) == ":memory:" else Path(path).expanduser()
    if target == ":memory:" or str(target) == ":memory:":
        handle = DatabaseHandle(_connect(":memory:"), ":memory:")
        _migrate(handle)
        return handle
    assert isinstance(target, Path)
    _check_location(target, create_parent=bool(create_parent))
    try:
        conn = _connect(target)
    except sqlite3.Error as exc:
        raise DatabaseError(_explain(target, exc)) from None
    try:
        _prepare(conn, target)
        handle = DatabaseHandle(conn, str(target))
        if not handle.migrated:
            _migrate(handle)
    except BaseException:
        conn.close()
        raise
    return handle


def _migrate(handle: DatabaseHandle) -> None:
    from datamachine.storage.sqlite_migrations import migrate

    migrate(handle.database, label=handle.label)


def _schema_is_current(conn: sqlite3.Connection) -> bool:
    try:
        rows = conn.execute(
            f"SELECT name FROM [{MIGRATIONS_TABLE}] WHERE migration_set = ?", [MIGRATION_SET]
        ).fetchall()
    except sqlite3.OperationalError:  # no migrations table yet: a new database
        return False
    return set(MIGRATION_NAMES) <= {row[0] for row in rows}


def _check_location(target: Path, *, create_parent: bool) -> None:
    parent = target.parent
    try:
        parent_exists = parent.exists()
        is_dir = target.is_dir()
    except OSError as exc:
        raise DatabaseError(f"Cannot open the database {target}: {exc.strerror}.") from None
    if not parent_exists:
        if create_parent:
            try:
                parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise DatabaseError(
                    f"Cannot create the directory for the database {target}: {exc.strerror}."
                ) from None
        else:
            raise DatabaseError(
                f"Cannot open the database {target}: the directory {parent} does not exist. "
                "Create it, or pass another db_path / set DATAMACHINE_DB."
            )
    if is_dir:
        raise DatabaseError(f"Cannot open the database {target}: it is a directory, not a file.")


def _when_unlocked(action: Callable[[], T]) -> T:
    """``action()``, tried again while SQLite says the database is locked (up to the busy
    timeout).

    While another connection switches a new file to WAL, SQLite answers a read of the schema or
    a ``PRAGMA journal_mode`` with "database is locked" at once, without calling the busy
    handler; processes that open one new file together would fail where they only had to wait.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    pause = 0.001
    while True:
        try:
            return action()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _prepare(conn: sqlite3.Connection, target: Path) -> None:
    """Refuse files that are not ours, then switch to WAL (readers never block the writer)."""
    try:
        # Reading the schema is the first real access: a non-SQLite file fails here, before
        # anything is written to it.
        tables = [row[0] for row in _when_unlocked(lambda: conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        ).fetchall())]
        if tables and not _is_datamachine(conn, tables):
            shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
            raise DatabaseError(
                f"The file {target} is a SQLite database of another application (tables: "
                f"{shown}), not a datamachine database. Point DATAMACHINE_DB / db_path at a new "
                "or datamachine file; this one was left untouched."
            )
        mode = _when_unlocked(lambda: conn.execute("PRAGMA journal_mode = WAL").fetchone())
        if mode is None or str(mode[0]).lower() != "wal":
            raise DatabaseError(
                f"Cannot enable WAL mode on the database {target} (got {mode!r}); "
                "put the database on a local, writable filesystem."
            )
        # NORMAL in WAL mode: a commit is durable against a process crash (the case we test);
        # only an OS crash or power loss may drop the last commits, never corrupt the file.
        conn.execute("PRAGMA synchronous = NORMAL")
    except sqlite3.Error as exc:
        raise DatabaseError(_explain(target, exc)) from None


def _is_datamachine(conn: sqlite3.Connection, tables: list[str]) -> bool:
    if MIGRATIONS_TABLE not in tables:
        return False
    row = conn.execute(
        f"SELECT 1 FROM [{MIGRATIONS_TABLE}] WHERE migration_set = ? LIMIT 1",
        [MIGRATION_SET],
    ).fetchone()
    return row is not None


def _explain(target: Path, exc: sqlite3.Error) -> str:
    text = str(exc)
    if "not a database" in text or "malformed" in text:
        return (
            f"The file {target} is not a datamachine database (SQLite says: {text}). "
            "Point DATAMACHINE_DB / db_path at another file, or move this one away."
        )
    if "readonly" in text or "unable to open" in text:
        return (
            f"Cannot open the database {target} for writing (SQLite says: {text}). "
            "Check that the file and its directory are writable."
        )
    return f"Cannot open the database {target}: {text}."
