"""The default transcript persister and lock: :class:`TranscriptStore`.

A transcript is one ``transcripts`` row per session plus its messages, in order, in
``transcript_messages``. The loop writes it in three steps, each one transaction:

- ``begin(session_id, messages, request)`` (optional): the run's starting messages that are not
  stored yet (a new prompt, a new chat message) and status ``running``;
- ``append_turn(session_id, turn, messages)`` after every turn: that turn's messages (the
  row's counts at most once a second; readers add the turns written since);
- ``persist(messages, request, result)`` once at the end: anything not yet written, the final
  status, usage, budgets and a result summary.

So a process killed mid-run leaves every finished turn and never half a turn. Its row stays
``running``; with no live lock behind it, reading it back reports ``interrupted``.

A run on an existing session must start from that session's stored messages (continuation and
chat do): the store writes only the messages beyond the stored count, it never rewrites history.
"""

from __future__ import annotations

import builtins
import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from agents_api import clock
from agents_api.jsontext import json_encoder
from agents_api.message import Message, normalize_message
from datamachine.errors import TranscriptNotFound, UsageError
from datamachine.storage._tx import Connected, connection_lock, db_label, immediate, snapshot
from datamachine.storage.locks import TranscriptLocks, check_session_id

__all__ = ["Transcript", "TranscriptStatus", "TranscriptStore", "TranscriptSummary"]

logger = logging.getLogger("datamachine.storage")

TranscriptStatus = Literal[
    "running", "interrupted", "completed", "incomplete", "budget_exceeded", "aborted", "error"
]
MessageLike = Message | Mapping[str, Any]

_SUMMARY_FIELDS = ("status", "completed", "final_content", "budget", "flags", "warning", "error",
                   "error_code", "warnings", "turn_count", "cumulative_turn_count", "blocker")
_COLUMNS = ("t.id, t.status, t.provider, t.model, t.mode, t.created_at, t.updated_at, "
            "t.turn_count, t.cumulative_turn_count, t.message_count, t.usage, t.budgets, "
            "t.result, l.expires_at")
_LIVE_LOCK_JOIN = "LEFT JOIN transcript_locks l ON l.session_id = t.id AND l.expires_at > ?"


class TranscriptSummary(BaseModel):
    """A stored transcript's metadata, as ``list()`` returns it.

    ``status`` is the stored status, except that a ``running`` transcript with no live lock is
    reported as ``interrupted`` (its process died). ``updated_at`` is the last write (while a
    run is going it may lag its latest turn by up to a second). ``turn_count`` is the last run's
    finished turns; ``cumulative_turn_count`` counts every run of the session (both exact, also
    mid-run: see ``_reconcile``). ``locked_until`` is the expiry of a live lock, else None.
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


class Transcript(TranscriptSummary):
    """A transcript with its messages (envelope dicts, in order)."""

    messages: list[dict[str, Any]]


@dataclass(slots=True)
class _Run:
    """What this process wrote for the run currently holding a session (in memory only).

    ``persist`` uses it to find which of its messages are already stored: when ``begin`` was not
    called, the run's starting messages were never written and go in front of its turns.
    """

    base_count: int
    base_cumulative: int
    initial_written: bool
    # (message_count, cumulative_turn_count) of the row after this run's last write: while the
    # run holds the session's lock nobody else writes it, so the next turn need not read them.
    stored: tuple[int, int] | None = None
    # When this run last wrote the row's indexed ``updated_at`` (None: not yet).
    touched: float | None = None
    turns: int = 0
    appended: int = 0
    first_appended: object = None


# A held lock is extended at most this often by a run's turn writes (seconds).
RENEW_INTERVAL = 1.0

_value_json = json_encoder(ensure_ascii=False, default=str)


def _encode(item: MessageLike) -> str:
    # Message.to_json writes str() for values JSON cannot hold (datetimes, paths): storing
    # their text beats failing the run's persistence.
    return (item if isinstance(item, Message) else normalize_message(item)).to_json()


def _dump(value: Any) -> str:
    return _value_json(value if value is not None else {})


def _request_field(request: Mapping[str, Any], key: str) -> str | None:
    value = request.get(key)
    if isinstance(value, list | tuple):  # a list of modes is accepted; store them joined
        value = ",".join(str(v) for v in value)
    return None if value is None else str(value)


class TranscriptStore:
    """SQLite transcripts: the host's default ``transcript_persister`` and ``transcript_lock``.

    Thread-safe: every use of the shared connection holds the connection's lock. Safe across
    processes: every write is one ``BEGIN IMMEDIATE`` transaction, and the lock table keeps two
    runs off one session.
    """

    def __init__(self, db: Connected) -> None:
        self._db = db
        self._lock = connection_lock(db)
        self._label = db_label(db)
        self.locks = TranscriptLocks(db)
        self._runs: dict[str, _Run] = {}
        # Locks this store handed out (token, ttl), and the renewal a turn's write already did.
        self._held: dict[str, tuple[str, float]] = {}
        self._renewed: dict[str, tuple[str, bool]] = {}
        self._renewed_at: dict[str, float] = {}  # when each held lock was last extended
        # Locks persist() freed in its commit: (token, whether it still held the lock).
        self._released: dict[str, tuple[str, bool]] = {}

    # -- the lock protocol -----------------------------------------------------------------
    def acquire(self, session_id: str, ttl: float) -> str | None:
        """Take the session's lock for ``ttl`` seconds; None at once if it is held."""
        now = clock.now()
        token = self.locks.acquire(session_id, ttl)
        if token is not None:
            with self._lock:
                self._held[session_id] = (token, ttl)
                self._released.pop(session_id, None)  # an earlier run's, never asked for
                self._renewed_at[session_id] = now
        return token

    def renew(self, session_id: str, token: str, ttl: float) -> bool:
        """Extend the lock ``token`` holds to ``now + ttl``; False if it was taken over.

        Right after ``append_turn`` this costs nothing: the turn's transaction already renewed
        the lock (one write per turn instead of two), and its answer is returned. A lock this
        store extended less than a second ago is not written again (see ``_renew_in``).
        """
        now = clock.now()
        with self._lock:
            renewed = self._renewed.pop(session_id, None)
            if renewed is None and self._fresh(session_id, token, now):
                return True
        if renewed is not None and renewed[0] == token:
            return renewed[1]
        ok = self.locks.renew(session_id, token, ttl)
        if ok:
            with self._lock:
                self._renewed_at[session_id] = now
        return ok

    def release(self, session_id: str, token: str) -> bool:
        """Release the lock if ``token`` holds it; a stale token releases nothing.

        After ``persist``, which frees the run's lock in its own commit, this only reports
        whether that freed it.
        """
        with self._lock:
            done = self._released.pop(session_id, None)
            if done is not None and done[0] == token:
                return done[1]
            if self._held.get(session_id, ("",))[0] == token:
                del self._held[session_id]
                self._renewed_at.pop(session_id, None)
            self._renewed.pop(session_id, None)
        return self.locks.release(session_id, token)

    # -- the persister protocol ------------------------------------------------------------
    def begin(
        self, session_id: str, messages: Sequence[MessageLike],
        request: Mapping[str, Any] | None = None,
    ) -> None:
        """Store a run's starting messages (those beyond the stored ones) before its first turn.

        Call it while holding the session's lock. Optional: without it, ``persist`` writes the
        starting messages at the end, but a run killed before then loses them.
        """
        sid = check_session_id(session_id)
        info = dict(request or {})
        now = clock.now()
        with self._lock:
            nested = self._db.conn.in_transaction
            with immediate(self._db, self._lock, self._label, "start a transcript") as conn:
                row = conn.execute(
                    "SELECT status, message_count, turn_count, cumulative_turn_count "
                    "FROM transcripts WHERE id = ?", [sid],
                ).fetchone()
                if row is None:
                    # A new transcript: its row is written whole, in one statement.
                    count = cumulative = 0
                    new = [_encode(m) for m in messages]
                    conn.execute(
                        "INSERT INTO transcripts (id, status, provider, model, mode, "
                        "message_count, created_at, updated_at) "
                        "VALUES (?, 'running', ?, ?, ?, ?, ?, ?)",
                        [sid, _request_field(info, "provider"), _request_field(info, "model"),
                         _request_field(info, "mode"), len(new), now, now],
                    )
                    self._insert(conn, sid, 0, 0, new, now)
                    added = len(new)
                else:
                    _, count, _, cumulative = _reconcile(conn, sid, *row)
                    added = self._start_existing(conn, sid, messages, info, count,
                                                 cumulative, now)
            # Recorded only once the write committed (and only when it was not part of a
            # caller's transaction, which may still roll back): a failed begin leaves nothing
            # that claims the messages are stored.
            self._runs[sid] = _Run(base_count=count, base_cumulative=cumulative,
                                   initial_written=True,
                                   stored=None if nested else (count + added, cumulative),
                                   touched=None if nested else now)

    def _start_existing(self, conn: Any, sid: str, messages: Sequence[MessageLike],
                        info: Mapping[str, Any], count: int, cumulative: int,
                        now: float) -> int:
        """``begin`` on a transcript that already has a row (a continued conversation): store
        the messages beyond the stored ones; how many that was.

        The row gets the reconciled counts (a previous run may have died before writing its
        last turns to it) and ``turn_count`` 0: the counts of the run that starts now.
        """
        if len(messages) < count:
            logger.warning(
                "transcript %r holds %d messages but the run starts from %d; new "
                "messages are appended after the stored ones", sid, count, len(messages))
        new = [_encode(m) for m in messages[count:]]
        self._insert(conn, sid, count, 0, new, now)
        conn.execute(
            "UPDATE transcripts SET status = 'running', provider = COALESCE(?, provider), "
            "model = COALESCE(?, model), mode = COALESCE(?, mode), message_count = ?, "
            "turn_count = 0, cumulative_turn_count = ?, updated_at = ? WHERE id = ?",
            [_request_field(info, "provider"), _request_field(info, "model"),
             _request_field(info, "mode"), count + len(new), cumulative, now, sid],
        )
        return len(new)

    def append_turn(self, session_id: str, turn: int, messages: Sequence[MessageLike]) -> None:
        """Append one finished turn's messages in one transaction (creating the row if needed)."""
        sid = check_session_id(session_id)
        encoded = [_encode(m) for m in messages]  # serialized before taking the write lock
        now = clock.now()
        with self._lock:
            run = self._runs.get(sid)
            if run is not None and turn == 1 and run.turns > 0:
                run = None  # a new run on this session
            held = self._held.get(sid)
            nested = self._db.conn.in_transaction  # a caller's transaction may still roll back
            with immediate(self._db, self._lock, self._label, "append a turn") as conn:
                renewed: bool | None = None
                extended = False
                if held is not None:
                    renewed, extended = self._renew_in(conn, sid, held, now)
                stored = run.stored if run is not None and held is not None and renewed else None
                cached = stored is not None
                if stored is not None:
                    count, cumulative = stored
                else:
                    count, cumulative = self._ensure_row(conn, sid, now)
                if run is None:
                    # A run that did not call begin() (or a new run on this session).
                    run = _Run(base_count=count, base_cumulative=cumulative,
                               initial_written=False)
                self._insert(conn, sid, count, turn, encoded, now)
                # The row (counts and the indexed updated_at) is rewritten on a run's first
                # turn, then at most once a second: each rewrite is one more page in the
                # commit. In between, the counts the row lags behind are read off the newest
                # message (see _ensure_row and _reconcile), so no reader ever sees them stale.
                # A turn with no messages leaves nothing to count it by: it writes the row.
                touch = (run.touched is None or not cached or not encoded
                         or not 0 <= now - run.touched < RENEW_INTERVAL)
                if touch:
                    conn.execute(
                        "UPDATE transcripts SET status = 'running', turn_count = ?, "
                        "cumulative_turn_count = ?, message_count = ?, updated_at = ? "
                        "WHERE id = ?",
                        [turn, cumulative + 1, count + len(encoded), now, sid],
                    )
            # Updated only once the turn committed, so a failed write leaves the record as it was.
            if held is not None and renewed is not None:
                self._renewed[sid] = (held[0], renewed)
                if extended and not nested:
                    self._renewed_at[sid] = now
            if run.first_appended is None and messages:
                run.first_appended = messages[0]
            run.turns += 1
            run.appended += len(encoded)
            run.stored = None if nested else (count + len(encoded), cumulative + 1)
            if touch and not nested:
                run.touched = now
            self._runs[sid] = run

    def _fresh(self, sid: str, token: str, now: float) -> bool:
        """Whether ``token`` holds ``sid``'s lock and this store extended it under a second ago
        (a tenth of its TTL when that is shorter): nobody can have taken it since."""
        held = self._held.get(sid)
        last = self._renewed_at.get(sid)
        return (held is not None and held[0] == token and last is not None
                and 0 <= now - last < min(RENEW_INTERVAL, held[1] / 10))

    def _unexpired(self, sid: str, now: float) -> bool:
        """Whether this store holds ``sid``'s lock and it has not expired, so no other run can
        have written the session since this store's last write."""
        held = self._held.get(sid)
        last = self._renewed_at.get(sid)
        return held is not None and last is not None and 0 <= now - last < held[1]

    def _renew_in(self, conn: Any, sid: str, held: tuple[str, float], now: float
                  ) -> tuple[bool, bool]:
        """Extend the run's lock inside the turn's transaction: (still held, extended now).

        The loop's ``renew()`` after the turn then only reads the answer. A lock extended less
        than a second ago (a tenth of its TTL when that is shorter) is left as it is: it still
        has nearly its whole TTL, and nobody can have taken an unexpired lock, so a fast run
        does not rewrite the lock row on every turn.
        """
        token, ttl = held
        if self._fresh(sid, token, now):
            return True, False
        cursor = conn.execute(
            "UPDATE transcript_locks SET expires_at = ? WHERE session_id = ? AND token = ?",
            [now + float(ttl), sid, token],
        )
        still_held = cursor.rowcount == 1
        return still_held, still_held

    def persist(self, messages: Sequence[MessageLike], request: Mapping[str, Any],
                result: Any) -> str:
        """Finish the run: write what is not stored yet, its status, usage and budgets.

        ``result`` is a ``LoopResult`` (or any object with its attributes); ``request`` may hold
        ``provider``, ``model`` and ``mode``. Returns the session id.
        """
        session_id = getattr(result, "transcript_session_id", None) or uuid.uuid4().hex
        sid = check_session_id(session_id)
        status = str(getattr(result, "status", "completed"))
        if status == "transcript_lock_contention":
            # Another run holds this session; writing here would interleave with it.
            return sid
        info = dict(request or {})
        turn_count = int(getattr(result, "turn_count", 0) or 0)
        summary = {key: getattr(result, key) for key in _SUMMARY_FIELDS if hasattr(result, key)}
        # Product diagnostics a stop handler settled (a blocker, completion state).
        summary.update(getattr(result, "metadata", None) or {})
        now = clock.now()
        with self._lock:
            run = self._runs.pop(sid, None)
            held = self._held.get(sid)
            nested = self._db.conn.in_transaction  # a caller's transaction may still roll back
            released: bool | None = None
            with immediate(self._db, self._lock, self._label, "store a transcript") as conn:
                if run is not None and run.stored is not None and self._unexpired(sid, now):
                    count, cumulative = run.stored  # the run's own last write; nobody else's
                else:
                    count, cumulative = self._ensure_row(conn, sid, now)
                if run is not None and not run.initial_written and run.appended:
                    count = self._place_starting_messages(conn, sid, messages, run, count, now)
                new = [_encode(m) for m in messages[count:]]
                self._insert(conn, sid, count, turn_count, new, now)
                base = run.base_cumulative if run is not None else cumulative
                summary.setdefault("cumulative_turn_count", base + turn_count)
                conn.execute(
                    "UPDATE transcripts SET status = ?, provider = COALESCE(?, provider), "
                    "model = COALESCE(?, model), mode = COALESCE(?, mode), updated_at = ?, "
                    "turn_count = ?, cumulative_turn_count = ?, message_count = ?, usage = ?, "
                    "budgets = ?, result = ? WHERE id = ?",
                    [status, _request_field(info, "provider"), _request_field(info, "model"),
                     _request_field(info, "mode"), now, turn_count, base + turn_count,
                     count + len(new), _dump(getattr(result, "usage", {})),
                     _dump(getattr(result, "budgets", {})), _dump(summary), sid],
                )
                if held is not None and not nested:
                    # The run's last write: its lock goes in the same commit (one commit fewer
                    # per run); the loop's release() right after answers from memory.
                    released = conn.execute(
                        "DELETE FROM transcript_locks WHERE session_id = ? AND token = ?",
                        [sid, held[0]],
                    ).rowcount == 1
            if held is not None and released is not None:  # committed
                self._released[sid] = (held[0], released)
                del self._held[sid]
                self._renewed_at.pop(sid, None)
                self._renewed.pop(sid, None)
        return sid

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

    def get(self, session_id: str) -> list[dict[str, Any]]:
        """The stored messages (envelope dicts), in order; TranscriptNotFound if unknown."""
        with self._lock:
            rows = self._db.conn.execute(
                "SELECT envelope FROM transcript_messages WHERE session_id = ? ORDER BY position",
                [session_id],
            ).fetchall()
            if not rows and not self.exists(session_id):
                raise self._not_found(session_id)
        return [json.loads(row[0]) for row in rows]

    def get_transcript(self, session_id: str) -> Transcript:
        """Metadata and messages of one transcript; TranscriptNotFound if unknown."""
        with snapshot(self._db, self._lock, self._label) as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM transcripts t {_LIVE_LOCK_JOIN} WHERE t.id = ?",
                [clock.now(), session_id],
            ).fetchone()
            if row is None:
                raise self._not_found(session_id)
            fields = _summary_fields(conn, row)
            messages = self.get(session_id)
        return Transcript(**fields, messages=messages)

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
            found = [_summary_fields(conn, row) for row in conn.execute(sql, params).fetchall()]
        return [TranscriptSummary(**fields) for fields in found]

    # -- internals -------------------------------------------------------------------------
    def _not_found(self, session_id: str) -> TranscriptNotFound:
        return TranscriptNotFound(
            f"No transcript is stored under session id {session_id!r} in {self._label}; "
            "list them with host.transcripts.list() or `datamachine transcripts list`."
        )

    @staticmethod
    def _ensure_row(conn: Any, sid: str, now: float) -> tuple[int, int]:
        """The stored (message_count, cumulative_turn_count), creating the row if needed."""
        row = conn.execute(
            "SELECT status, message_count, turn_count, cumulative_turn_count "
            "FROM transcripts WHERE id = ?", [sid]
        ).fetchone()
        if row is not None:
            _, count, _, cumulative = _reconcile(conn, sid, *row)
            return count, cumulative
        conn.execute(
            "INSERT INTO transcripts (id, status, created_at, updated_at) "
            "VALUES (?, 'running', ?, ?)",
            [sid, now, now],
        )
        return 0, 0

    @staticmethod
    def _insert(conn: Any, sid: str, start: int, turn: int, encoded: Sequence[str],
                now: float) -> None:
        if encoded:
            conn.executemany(
                "INSERT INTO transcript_messages (session_id, position, turn, envelope, "
                "created_at) VALUES (?, ?, ?, ?, ?)",
                [(sid, start + i, turn, text, now) for i, text in enumerate(encoded)],
            )

    def _place_starting_messages(self, conn: Any, sid: str, messages: Sequence[MessageLike],
                                 run: _Run, count: int, now: float) -> int:
        """Insert the run's unwritten starting messages in front of its turns; new count."""
        start = run.base_count
        first_turn = _locate(messages, run.first_appended, start)
        if first_turn is None:
            first_turn = max(start, len(messages) - run.appended)
        missing = [_encode(m) for m in messages[start:first_turn]]
        if not missing:
            return count
        shift = len(missing)
        # Two steps through negative positions keep (session_id, position) unique mid-update.
        conn.execute(
            "UPDATE transcript_messages SET position = -(position + ?) - 1 "
            "WHERE session_id = ? AND position >= ?",
            [shift, sid, start],
        )
        conn.execute(
            "UPDATE transcript_messages SET position = -position - 1 "
            "WHERE session_id = ? AND position < 0",
            [sid],
        )
        self._insert(conn, sid, start, 0, missing, now)
        return count + shift


def _locate(messages: Sequence[MessageLike], target: object, start: int) -> int | None:
    """Index of the first message ``append_turn`` wrote: the same object, else an equal one."""
    if target is None:
        return None
    for index in range(start, len(messages)):
        if messages[index] is target:
            return index
    for index in range(start, len(messages)):
        if messages[index] == target:
            return index
    return None


def _reconcile(conn: Any, sid: str, status: str, count: int, turns: int,
               cumulative: int) -> tuple[str, int, int, int]:
    """A row's (status, message_count, turn_count, cumulative_turn_count), brought up to date.

    While a run is going, ``append_turn`` rewrites the row on the run's first turn and then at
    most once a second, so a ``running`` row may lag its newest turns. Every run rewrites the
    row before its turns (``begin``, or its first ``append_turn``), so the messages past the
    row's ``message_count`` all belong to the run that wrote it last, and the newest of them
    carries that run's turn number: one indexed lookup recovers the exact counts.
    """
    count, turns, cumulative = int(count), int(turns), int(cumulative)
    if status != "running":
        return status, count, turns, cumulative
    newest = conn.execute(
        "SELECT position, turn FROM transcript_messages WHERE session_id = ? "
        "ORDER BY position DESC LIMIT 1", [sid],
    ).fetchone()
    if newest is not None and int(newest[0]) >= count:
        count = int(newest[0]) + 1
        if int(newest[1]) > turns:
            cumulative += int(newest[1]) - turns
            turns = int(newest[1])
    return status, count, turns, cumulative


def _summary_fields(conn: Any, row: Sequence[Any]) -> dict[str, Any]:
    status, count, turns, cumulative = _reconcile(conn, row[0], row[1], row[9], row[7], row[8])
    locked_until = row[13]
    if status == "running" and locked_until is None:
        status = "interrupted"
    return {
        "id": row[0], "status": status, "provider": row[2], "model": row[3], "mode": row[4],
        "created_at": row[5], "updated_at": row[6], "turn_count": turns,
        "cumulative_turn_count": cumulative, "message_count": count, "usage": json.loads(row[10]),
        "budgets": json.loads(row[11]), "result": json.loads(row[12]),
        "locked_until": locked_until,
    }
