"""Transcript locks with a TTL: one writer per session, across threads and processes.

A lock is a row in ``transcript_locks``. Taking it is a single upsert that succeeds only when no
row exists or the existing one has expired, run inside ``BEGIN IMMEDIATE``; SQLite serializes
writers across processes, so two processes can never both see "free" and both win. Nothing here
waits for a lock to free up: a held lock answers ``None`` at once and the caller decides.
Expiry is read from ``agents_api.clock.now()``, so freezegun moves it in tests.
"""

from __future__ import annotations

import os
import secrets
import socket

from pydantic import BaseModel, ConfigDict

from agents_api import clock
from agents_api.errors import LockLost, brief_repr
from datamachine.errors import UsageError
from datamachine.storage._tx import (
    Conn,
    Connected,
    connection_lock,
    db_label,
    immediate,
    is_utf8,
    query,
    query_one,
)

__all__ = ["MAX_TTL", "RENEW_INTERVAL", "LockInfo", "TranscriptLocks", "check_session_id",
           "check_ttl", "prove"]

# The longest a lock may be taken for (seconds): a run renews its lock after every turn, so a
# longer one would only keep a crashed run's session blocked longer.
MAX_TTL = 86_400
# A held lock is extended by a turn's write at most this often (seconds; a tenth of the TTL
# when that is shorter): each extension is one more page in the turn's commit.
RENEW_INTERVAL = 1.0

_HOLDER = f"{socket.gethostname()}:{os.getpid()}"


class LockInfo(BaseModel):
    """Who holds a session's lock and until when (the token itself is never shown)."""

    model_config = ConfigDict(defer_build=True, frozen=True)

    session_id: str
    acquired_at: float
    expires_at: float
    holder: str


def check_session_id(session_id: object) -> str:
    """Return ``session_id`` if it is a non-empty string of at most 200 characters that
    SQLite can store (UTF-8: a lone surrogate raised UnicodeEncodeError at the query)."""
    if not isinstance(session_id, str) or not session_id.strip() or len(session_id) > 200 \
            or not (session_id.isascii() or is_utf8(session_id)):
        raise UsageError(
            f"A session id must be a non-empty string of at most 200 characters, "
            f"got {brief_repr(session_id)}."
        )
    return session_id



def _could_be_token(token: object) -> bool:
    # acquire() hands out hex strings; anything SQLite cannot even compare (a lone surrogate
    # raised UnicodeEncodeError) holds no lock.
    return not isinstance(token, str) or token.isascii() or is_utf8(token)


def check_ttl(ttl: object) -> float:
    """``ttl`` as seconds if it is a finite number in (0, 86400]; else a UsageError."""
    seconds = clock.duration(ttl)
    if seconds is None or seconds > MAX_TTL:
        raise UsageError(f"A lock ttl must be a number of seconds above 0 and at most {MAX_TTL}, "
                         f"got {brief_repr(ttl)}.")
    return seconds


def prove(conn: Conn, session_id: str, token: str, ttl: float,
          now: float, *, extend: bool = True) -> None:
    """Inside a write transaction: raise :class:`LockLost` unless ``token`` holds the session's
    lock, and (``extend``) extend it to ``now + ttl`` when that is due (``RENEW_INTERVAL``).

    The transaction holds SQLite's write lock, so nobody can take the session between this
    proof and the commit of whatever the caller writes next. A lock that expired but that
    nobody took over is still this token's, and is extended.
    """
    row = query_one(conn, "SELECT expires_at FROM transcript_locks "
                          "WHERE session_id = ? AND token = ?", [session_id, token])
    if row is None:
        raise LockLost(
            f"The transcript lock of session {session_id!r} was taken over by another run "
            "(it expired); this run writes nothing more. Raise transcript_lock_ttl if one turn "
            "can take longer than it.")
    if extend and row["expires_at"] - now < ttl - min(RENEW_INTERVAL, ttl / 10):
        conn.execute("UPDATE transcript_locks SET expires_at = ? WHERE session_id = ? "
                     "AND token = ?", [now + ttl, session_id, token])


class TranscriptLocks:
    """``acquire`` / ``renew`` / ``release`` over the ``transcript_locks`` table."""

    def __init__(self, db: Connected) -> None:
        self._db = db
        self._lock = connection_lock(db)
        self._label = db_label(db)

    def acquire(self, session_id: str, ttl: float) -> str | None:
        """Take the lock for ``ttl`` seconds and return its token; None if another holder has an
        unexpired lock. Never waits (beyond SQLite's own brief write serialization)."""
        sid = check_session_id(session_id)
        seconds = check_ttl(ttl)
        token = secrets.token_hex(16)
        now = clock.now()
        with immediate(self._db, self._lock, self._label, "take a transcript lock",
                       (f"session:{sid}",)) as conn:
            cursor = conn.execute(
                "INSERT INTO transcript_locks (session_id, token, expires_at, acquired_at, holder) "
                "VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (session_id) DO UPDATE SET token = excluded.token, "
                "expires_at = excluded.expires_at, acquired_at = excluded.acquired_at, "
                "holder = excluded.holder "
                "WHERE transcript_locks.expires_at <= ?",
                [sid, token, now + seconds, now, _HOLDER, now],
            )
            won = cursor.rowcount == 1
        return token if won else None

    def renew(self, session_id: str, token: str, ttl: float) -> bool:
        """Push the expiry to ``now + ttl`` if ``token`` still holds the lock.

        An expired lock that nobody took over is still ours and is renewed; once another run
        acquired it, the old token is refused.
        """
        sid = check_session_id(session_id)
        seconds = check_ttl(ttl)
        if not _could_be_token(token):
            return False
        now = clock.now()
        with immediate(self._db, self._lock, self._label, "renew a transcript lock",
                       (f"session:{sid}",)) as conn:
            cursor = conn.execute(
                "UPDATE transcript_locks SET expires_at = ? WHERE session_id = ? AND token = ?",
                [now + seconds, sid, str(token)],
            )
            return cursor.rowcount == 1

    def release(self, session_id: str, token: str) -> bool:
        """Release the lock if ``token`` still holds it; a stale token releases nothing."""
        sid = check_session_id(session_id)
        if not _could_be_token(token):
            return False  # no lock was ever given such a token: nothing to release
        with immediate(self._db, self._lock, self._label, "release a transcript lock",
                       (f"session:{sid}",)) as conn:
            cursor = conn.execute(
                "DELETE FROM transcript_locks WHERE session_id = ? AND token = ?",
                [sid, str(token)],
            )
            return cursor.rowcount == 1

    def info(self, session_id: str) -> LockInfo | None:
        """The live (unexpired) lock on ``session_id``, or None."""
        check_session_id(session_id)
        with self._lock:
            row = query_one(
                self._db.conn,
                "SELECT session_id, acquired_at, expires_at, holder FROM transcript_locks "
                "WHERE session_id = ? AND expires_at > ?", [session_id, clock.now()])
        return None if row is None else LockInfo(**dict(row))

    def held(self) -> list[LockInfo]:
        """Every live lock, oldest first (for diagnostics and tests)."""
        with self._lock:
            rows = query(
                self._db.conn,
                "SELECT session_id, acquired_at, expires_at, holder FROM transcript_locks "
                "WHERE expires_at > ? ORDER BY acquired_at, session_id", [clock.now()])
        return [LockInfo(**dict(row)) for row in rows]
