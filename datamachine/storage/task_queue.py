"""What the task queue (procrastinate, DESIGN.md 18) needs of the host's database:
:class:`TaskQueueStore`.

The queue lives in the host's own PostgreSQL database (its ``procrastinate_*`` tables beside
ours, in the schema ``datamachine``); this store says where that is, creates the tables once per
database, and gives a worker a lock that one process at a time holds. It imports neither the
queue nor procrastinate: the queue (``datamachine.job_queue``) hands it what to run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from datamachine.storage._tx import Connected, connection_lock, db_label, dialect, immediate

__all__ = ["TaskQueueStore"]


class TaskQueueStore:
    """The database side of the task queue: its address, its tables, its locks."""

    def __init__(self, db: Connected) -> None:
        self._db = db

    @property
    def postgres_url(self) -> str | None:
        """The PostgreSQL URL of the host's database (with its password), or None on SQLite,
        where there is no queue."""
        url = getattr(self._db, "url", None)
        if dialect(self._db.conn) != "postgresql" or not isinstance(url, str):
            return None
        return url

    @staticmethod
    def conninfo(url: str) -> str:
        """The connection string for a connection of the queue's own to ``url``: our schema
        first on the search path, as the stores' connections have it."""
        from datamachine.storage._pg import conninfo

        return conninfo(url)

    def create_tables_once(self, apply: Callable[[], None]) -> None:
        """Run ``apply`` (which creates the queue's tables) unless they exist, holding the
        whole-database lock, so hosts starting together take turns and it runs once."""
        with immediate(self._db, connection_lock(self._db), db_label(self._db),
                       "create the job queue's tables") as conn:
            exists = conn.execute(
                "SELECT to_regclass('datamachine.procrastinate_jobs')").fetchone()
            if exists is None or exists[0] is None:
                apply()

    @staticmethod
    @asynccontextmanager
    async def alone(url: str, name: str) -> AsyncIterator[bool]:
        """Whether this process holds the lock ``name`` (a session advisory lock, on a
        connection of its own to ``url``) for the block: False when another process holds it,
        and the block should do nothing. The lock is freed when the block ends."""
        import psycopg

        from datamachine.storage._pg import conninfo, lock_key

        key = lock_key(name)
        async with await psycopg.AsyncConnection.connect(conninfo(url), autocommit=True) as conn:
            row = await (await conn.execute("SELECT pg_try_advisory_lock(%s)", [key])).fetchone()
            if not row or not row[0]:
                yield False
                return
            try:
                yield True
            finally:
                await conn.execute("SELECT pg_advisory_unlock(%s)", [key])
