"""One run's writes to one session: :class:`TranscriptWriter`.

A writer belongs to one run and holds that run's lock token. Every write it makes is one
``BEGIN IMMEDIATE`` transaction that first proves the token still holds the session's lock
(:func:`~datamachine.storage.locks.prove`): a run whose lock expired and was taken over writes
nothing more and gets :class:`~agents_api.errors.LockLost`, so two runs never interleave one
session. A chat session's turn count moves in the same transaction as the turn it counts
(``on_turn``), so a crash never leaves the count ahead of the stored turns.

A writer also holds its run's open tool intents (DESIGN.md 24): ``record_intent`` stores one
before an effectful call runs, and the write that stores the call's result settles it in the
same commit, so an intent is pending exactly while nobody knows whether its call happened.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from agents_api import clock
from datamachine.storage import tool_intents as intents
from datamachine.storage import transcript_rows as rows
from datamachine.storage._tx import Conn, Connected, connection_lock, db_label, immediate, snapshot
from datamachine.storage.locks import (
    RENEW_INTERVAL,
    TranscriptLocks,
    check_session_id,
    check_ttl,
    prove,
)

__all__ = ["TranscriptWriter", "TurnHook"]

T = TypeVar("T")

# Called inside a turn's transaction, after its messages: (connection, turn, now).
TurnHook = Callable[[Conn, int, float], None]


class TranscriptWriter:
    """``agents_api.TranscriptWriter`` for the SQLite store (see the module docstring).

    ``token``: the lock token this run holds (None: no lock, no proof). ``ttl``: how far each
    extension of the lock reaches. Not thread-safe by itself, and need not be: one run writes
    through it, one step at a time.
    """

    def __init__(self, db: Connected, session_id: str, token: str | None, ttl: float, *,
                 on_turn: TurnHook | None = None) -> None:
        self._db = db
        self._lock = connection_lock(db)
        self._label = db_label(db)
        self.session_id = check_session_id(session_id)
        self.token = token
        self.ttl = check_ttl(ttl)
        self._on_turn = on_turn
        self._keys = (f"session:{self.session_id}",)
        # When this writer last proved and extended its lock (a committed write), and what
        # persist() said of the lock it freed in its own commit.
        self._proven_at: float | None = None
        self._released: bool | None = None
        # Call id -> the idempotency keys of this run's pending intents with that id, in the
        # order their calls run (a provider may give one turn's calls one id): each result
        # of that id settles the first.
        self._open: dict[str, list[str]] = {}

    def history(self) -> list[dict[str, Any]]:
        """The session's stored messages (envelope dicts, in order); call it holding the lock,
        so they cannot change before the run starts from them."""
        with snapshot(self._db, self._lock, self._label) as conn:
            found = conn.execute(
                "SELECT envelope FROM transcript_messages WHERE session_id = ? "
                "ORDER BY position", [self.session_id]).fetchall()
        return [json.loads(row[0]) for row in found]

    def stored_turns(self) -> int:
        """Every run's turns stored on the session so far (its ``cumulative_turn_count``)."""
        with snapshot(self._db, self._lock, self._label) as conn:
            counts = rows.read_counts(conn, self.session_id)
        return counts.cumulative_turn_count if counts is not None else 0

    def begin(self, messages: Sequence[rows.MessageLike],
              request: Mapping[str, Any] | None = None) -> None:
        """Store the run's starting messages beyond the stored ones (before its first turn)."""
        def write(conn: Conn, now: float) -> None:
            if self._open:
                self._settle(conn, messages[self._stored_count(conn):], now)
            rows.start(conn, self.session_id, messages, dict(request or {}), now)

        self._write("start a transcript", write)

    def append_turn(self, turn: int, messages: Sequence[rows.MessageLike]) -> None:
        """Store one finished turn and its counts, all or nothing."""
        def write(conn: Conn, now: float) -> None:
            rows.append(conn, self.session_id, turn, messages, now)
            if self._open:
                self._settle(conn, messages, now)
            if self._on_turn is not None:
                self._on_turn(conn, turn, now)

        self._write("append a turn", write)

    def write(self, action: str, body: Callable[[Conn, float], T]) -> T:
        """Run ``body(conn, now)`` as one transaction that first proves the lock: a run's own
        writes beyond its transcript (a chat session's reset before the run) obey the same rule
        as its turns. ``action`` names the write in a DatabaseError."""
        value: T = self._write(action, body)
        return value

    def record_intent(self, intent: intents.Intent) -> None:
        """Store ``intent`` before its call runs (a transaction that proves the lock: a run
        that lost its lock stores nothing and gets LockLost, and must not run the call)."""
        self._write("store a tool call's intent",
                    lambda conn, now: intents.store(conn, self.session_id, intent, now))
        self._queue(intent)

    def unsettled_intents(self) -> list[intents.Intent]:
        """The session's intents whose calls' outcomes were never stored (a run died between
        the intent and its turn), oldest first; call it holding the lock. The result this run
        stores for one of them settles it."""
        with snapshot(self._db, self._lock, self._label) as conn:
            found = intents.unsettled(conn, self.session_id)
        for intent in found:
            self._queue(intent)
        return found

    def _queue(self, intent: intents.Intent) -> None:
        keys = self._open.setdefault(intent.call_id, [])
        if intent.idempotency_key not in keys:  # a call run again is queued once
            keys.append(intent.idempotency_key)

    def _settle(self, conn: Conn, messages: Sequence[rows.MessageLike], now: float) -> None:
        """Settle the intents whose calls' results are among ``messages``; a call the run's
        time limit cut off may still be running, so its intent stays pending (in doubt)."""
        open_intents, keys = self._open, []
        for call_id, cut_off in intents.result_calls(messages):
            queued = open_intents.get(call_id)
            if not queued:
                continue
            key = queued.pop(0)
            if not queued:
                del open_intents[call_id]
            if not cut_off:
                keys.append(key)
        intents.settle(conn, self.session_id, keys, now)

    def _stored_count(self, conn: Conn) -> int:
        counts = rows.read_counts(conn, self.session_id)
        return counts.message_count if counts is not None else 0

    def renew(self) -> None:
        """Extend the lock (LockLost if it was taken over); free right after a turn's write,
        which already proved and extended it."""
        if self.token is None:
            return
        now = clock.now()
        if self._proven_at is not None and 0 <= now - self._proven_at < min(RENEW_INTERVAL,
                                                                           self.ttl / 10):
            return
        self._write("renew a transcript lock", lambda conn, now: None)

    def persist(self, messages: Sequence[rows.MessageLike], request: Mapping[str, Any],
                result: Any) -> str:
        """Store the end of the run; the lock is freed in the same commit. Returns the id."""
        if str(getattr(result, "status", "")) == "transcript_lock_contention":
            return self.session_id  # another run holds the session: write nothing

        def write(conn: Conn, now: float) -> bool | None:
            if self._open:
                self._settle(conn, messages[self._stored_count(conn):], now)
            rows.finish(conn, self.session_id, messages, dict(request or {}), result, now)
            if self.token is None:
                return None
            return conn.execute("DELETE FROM transcript_locks WHERE session_id = ? AND "
                                "token = ?", [self.session_id, self.token]).rowcount == 1

        nested = self._db.conn.in_transaction
        released = self._write("store a transcript", write, extend=False)
        if not nested:  # a caller's transaction may still roll back the release
            self._released = released
        return self.session_id

    def release(self) -> bool:
        """Free the lock; after ``persist`` (which freed it) only report whether that did."""
        if self.token is None:
            return False
        if self._released is not None:
            return self._released
        self._released = TranscriptLocks(self._db).release(self.session_id, self.token)
        return self._released

    def _write(self, action: str, body: Callable[[Conn, float], Any], *,
               extend: bool = True) -> Any:
        now = clock.now()
        nested = self._db.conn.in_transaction
        with self._lock, immediate(self._db, self._lock, self._label, action,
                                   self._keys) as conn:
            if self.token is not None:
                prove(conn, self.session_id, self.token, self.ttl, now, extend=extend)
            value = body(conn, now)
        if self.token is not None and extend and not nested:
            self._proven_at = now
        return value
