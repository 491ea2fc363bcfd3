"""The default transcript persister and lock: :class:`TranscriptStore`.

A transcript is one ``transcripts`` row per session plus its messages, in order, in
``transcript_messages``. A run writes it through its own
:class:`~datamachine.storage.transcript_writer.TranscriptWriter` (``open_writer``), in three
kinds of step, each one transaction that also proves the run still holds the session's lock:

- ``begin``: the run's starting messages that are not stored yet (a new prompt, a new chat
  message) and status ``running``;
- ``append_turn`` after every turn: that turn's messages and the row's exact counts;
- ``persist`` once at the end: anything not yet written, the final status, usage, budgets and a
  result summary, and the lock's release.

So a process killed mid-run leaves every finished turn and never half a turn. Its row stays
``running``; with no live lock behind it, reading it back reports ``interrupted``.

A run on an existing session starts from that session's stored messages (continuation and chat
read them under the lock): the store writes only the messages beyond the stored count, it never
rewrites history. The store's own ``begin``/``append_turn``/``persist`` do the same writes for
callers that manage a session by hand (optionally proving a lock ``token``).
"""

from __future__ import annotations

import builtins
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from agents_api import clock
from datamachine.errors import TranscriptNotFound, UsageError
from datamachine.storage import transcript_rows as rows
from datamachine.storage._tx import (
    Connected,
    connection_lock,
    db_label,
    immediate,
    query,
    query_one,
    snapshot,
)
from datamachine.storage.locks import TranscriptLocks, check_session_id, prove
from datamachine.storage.transcript_writer import TranscriptWriter, TurnHook

__all__ = ["Transcript", "TranscriptStatus", "TranscriptStore", "TranscriptSummary"]

TranscriptStatus = Literal[
    "running", "interrupted", "completed", "incomplete", "budget_exceeded", "aborted", "error",
    "awaiting_confirmation",
]
MessageLike = rows.MessageLike

_COLUMNS = ("t.id, t.status, t.provider, t.model, t.mode, t.created_at, t.updated_at, "
            "t.turn_count, t.cumulative_turn_count, t.message_count, t.usage, t.budgets, "
            "t.result, t.token_name, l.expires_at AS locked_until")
_LIVE_LOCK_JOIN = "LEFT JOIN transcript_locks l ON l.session_id = t.id AND l.expires_at > ?"


class TranscriptSummary(BaseModel):
    """A stored transcript's metadata, as ``list()`` returns it.

    ``status`` is the stored status, except that a ``running`` transcript with no live lock is
    reported as ``interrupted`` (its process died). ``updated_at`` is the last write.
    ``turn_count`` is the last run's finished turns; ``cumulative_turn_count`` counts every run
    of the session (both exact, also mid-run). ``locked_until`` is the expiry of a live lock,
    else None. ``token_name`` is the ``/chat`` token whose run wrote it (None: not over HTTP).
    """

    model_config = ConfigDict(defer_build=True, frozen=True)

    id: str
    status: TranscriptStatus
    provider: str | None
    model: str | None
    mode: str | None
    created_at: float
    updated_at: float
    turn_count: int
    cumulative_turn_count: int
    message_count: int
    usage: dict[str, Any]
    budgets: dict[str, Any]
    result: dict[str, Any]
    locked_until: float | None
    token_name: str | None = None


class Transcript(TranscriptSummary):
    """A transcript with its messages (envelope dicts, in order)."""

    messages: list[dict[str, Any]]


class TranscriptStore:
    """SQLite transcripts: the host's default ``transcript_persister`` and ``transcript_lock``.

    Thread-safe: every use of the shared connection holds the connection's lock. Safe across
    processes: every write is one ``BEGIN IMMEDIATE`` transaction, and the lock table keeps two
    runs off one session. The store keeps no state per session: what one run needs lives on
    that run's writer.
    """

    def __init__(self, db: Connected) -> None:
        self._db = db
        self._lock = connection_lock(db)
        self._label = db_label(db)
        self.locks = TranscriptLocks(db)

    # -- the lock protocol -----------------------------------------------------------------
    def acquire(self, session_id: str, ttl: float) -> str | None:
        """Take the session's lock for ``ttl`` seconds; None at once if it is held."""
        return self.locks.acquire(session_id, ttl)

    def renew(self, session_id: str, token: str, ttl: float) -> bool:
        """Extend the lock ``token`` holds to ``now + ttl``; False if it was taken over."""
        return self.locks.renew(session_id, token, ttl)

    def release(self, session_id: str, token: str) -> bool:
        """Release the lock if ``token`` holds it; a stale token releases nothing."""
        return self.locks.release(session_id, token)

    # -- a run's writer --------------------------------------------------------------------
    def open_writer(self, session_id: str, token: str | None, ttl: float, *,
                    on_turn: TurnHook | None = None) -> TranscriptWriter:
        """The writer of one run on ``session_id`` holding lock ``token`` (see the module
        docstring); the loop opens one for every run this store persists and locks."""
        return TranscriptWriter(self._db, session_id, token, ttl, on_turn=on_turn)

    # -- one-off writes (the persister protocol) -------------------------------------------
    def begin(self, session_id: str, messages: Sequence[MessageLike],
              request: Mapping[str, Any] | None = None, *, token: str | None = None) -> None:
        """Store a run's starting messages (those beyond the stored ones) before its first
        turn; with ``token``, only while that token holds the session's lock."""
        self._write(session_id, token, "start a transcript",
                    lambda conn, sid, now: rows.start(conn, sid, messages, dict(request or {}),
                                                      now))

    def append_turn(self, session_id: str, turn: int, messages: Sequence[MessageLike], *,
                    token: str | None = None) -> None:
        """Append one finished turn's messages and the row's counts in one transaction
        (creating the row if needed); with ``token``, also proving and extending its lock."""
        self._write(session_id, token, "append a turn",
                    lambda conn, sid, now: rows.append(conn, sid, turn, messages, now))

    def persist(self, messages: Sequence[MessageLike], request: Mapping[str, Any],
                result: Any) -> str:
        """Finish a run: write what is not stored yet, its status, usage and budgets.

        ``result`` is a ``LoopResult`` (or any object with its attributes); ``request`` may hold
        ``provider``, ``model`` and ``mode``. Returns the session id.
        """
        session_id = getattr(result, "transcript_session_id", None) or uuid.uuid4().hex
        sid = check_session_id(session_id)
        if str(getattr(result, "status", "")) == "transcript_lock_contention":
            return sid  # another run holds this session: writing would interleave with it
        self._write(sid, None, "store a transcript",
                    lambda conn, sid, now: rows.finish(conn, sid, messages, dict(request or {}),
                                                       result, now))
        return sid

    def _write(self, session_id: str, token: str | None, action: str, body: Any) -> None:
        sid = check_session_id(session_id)
        now = clock.now()
        with self._lock, immediate(self._db, self._lock, self._label, action) as conn:
            if token is not None:
                prove(conn, sid, token, self._ttl_of(conn, sid, token, now), now)
            body(conn, sid, now)

    @staticmethod
    def _ttl_of(conn: Any, sid: str, token: str, now: float) -> float:
        # A by-hand write extends the lock by the span it was taken for.
        row = query_one(conn, "SELECT expires_at - acquired_at AS span FROM transcript_locks "
                              "WHERE session_id = ? AND token = ?", [sid, token])
        return max(1.0, float(row["span"])) if row is not None else 1.0

    # -- reading ---------------------------------------------------------------------------
    def set_status(self, session_id: str, status: TranscriptStatus) -> None:
        """Correct a finished run's stored status (a chat run the session limit aborted)."""
        sid = check_session_id(session_id)
        with self._lock, immediate(self._db, self._lock, self._label,
                                   "update a transcript") as conn:
            conn.execute(
                "UPDATE transcripts SET status = ?, "
                "result = json_set(result, '$.status', ?), updated_at = ? WHERE id = ?",
                [status, status, clock.now(), sid],
            )

    def exists(self, session_id: str) -> bool:
        """True if a transcript is stored under ``session_id``."""
        with self._lock:
            row = self._db.conn.execute(
                "SELECT 1 FROM transcripts WHERE id = ?", [session_id]
            ).fetchone()
        return row is not None

    def resolve(self, prefix: str) -> str:
        """The one stored session id starting with ``prefix`` (a whole id is its own prefix):
        what a person types from a listing. TranscriptNotFound if none, UsageError naming the
        candidates if several."""
        text = prefix.strip() if isinstance(prefix, str) else ""
        if not text or not all(ch.isalnum() or ch in "-_" for ch in text):
            raise UsageError(f"A session id (or its start) is letters, digits, '-' and '_'; "
                             f"got {prefix!r}.")
        if self.exists(text):
            return text
        with self._lock:
            found = [row[0] for row in self._db.conn.execute(
                "SELECT id FROM transcripts WHERE substr(id, 1, ?) = ? ORDER BY id LIMIT 6",
                [len(text), text]).fetchall()]
        if not found:
            raise self._not_found(text)
        if len(found) > 1:
            listed = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
            raise UsageError(f"{text!r} starts more than one session id ({listed}); type more "
                             "of it.")
        return str(found[0])

    def get(self, session_id: str) -> list[dict[str, Any]]:
        """The stored messages (envelope dicts), in order; TranscriptNotFound if unknown."""
        with snapshot(self._db, self._lock, self._label) as conn:
            found = conn.execute(
                "SELECT envelope FROM transcript_messages WHERE session_id = ? ORDER BY position",
                [session_id]).fetchall()
            if not found and not self.exists(session_id):
                raise self._not_found(session_id)
        return [json.loads(row[0]) for row in found]

    def summary(self, session_id: str) -> TranscriptSummary:
        """Metadata of one transcript, without its messages; TranscriptNotFound if unknown."""
        with snapshot(self._db, self._lock, self._label) as conn:
            return TranscriptSummary(**self._fields(conn, session_id))

    def get_transcript(self, session_id: str) -> Transcript:
        """Metadata and messages of one transcript; TranscriptNotFound if unknown."""
        with snapshot(self._db, self._lock, self._label) as conn:  # one consistent read
            fields = self._fields(conn, session_id)
            return Transcript(**fields, messages=self.get(session_id))

    def _fields(self, conn: Any, session_id: str) -> dict[str, Any]:
        row = query_one(conn, f"SELECT {_COLUMNS} FROM transcripts t {_LIVE_LOCK_JOIN} "
                              "WHERE t.id = ?", [clock.now(), session_id])
        if row is None:
            raise self._not_found(session_id)
        return _summary_fields(row)

    def list(self, *, limit: int = 50,
             status: TranscriptStatus | None = None) -> builtins.list[TranscriptSummary]:
        """The most recently updated transcripts first, optionally only those in ``status``."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise UsageError(f"limit must be a positive integer, got {limit!r}.")
        effective = ("CASE WHEN t.status = 'running' AND l.expires_at IS NULL "
                     "THEN 'interrupted' ELSE t.status END")
        sql = f"SELECT {_COLUMNS} FROM transcripts t {_LIVE_LOCK_JOIN}"
        params: builtins.list[Any] = [clock.now()]
        if status is not None:
            sql += f" WHERE {effective} = ?"
            params.append(status)
        sql += " ORDER BY t.updated_at DESC, t.id LIMIT ?"
        params.append(limit)
        with snapshot(self._db, self._lock, self._label) as conn:
            found = query(conn, sql, params)
        return [TranscriptSummary(**_summary_fields(row)) for row in found]

    def _not_found(self, session_id: str) -> TranscriptNotFound:
        return TranscriptNotFound(
            f"No transcript is stored under session id {session_id!r} in {self._label}; "
            "list them with host.transcripts.list() or `datamachine transcripts list`."
        )


def _summary_fields(row: Any) -> dict[str, Any]:
    status = row["status"]
    if status == "running" and row["locked_until"] is None:
        status = "interrupted"  # nobody holds the lock: the run's process died
    return {
        "id": row["id"], "status": status, "provider": row["provider"], "model": row["model"],
        "mode": row["mode"], "created_at": row["created_at"], "updated_at": row["updated_at"],
        "turn_count": row["turn_count"], "cumulative_turn_count": row["cumulative_turn_count"],
        "message_count": row["message_count"], "usage": json.loads(row["usage"]),
        "budgets": json.loads(row["budgets"]), "result": json.loads(row["result"]),
        "locked_until": row["locked_until"], "token_name": row["token_name"],
    }
