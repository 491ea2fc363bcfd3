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
import logging
import math
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, ValidationError

from agents_api import InvalidMessage, Message, clock, normalize_messages
from agents_api.errors import brief_repr
from agents_api.jsontext import compact_json
from datamachine.errors import DatabaseError, TranscriptNotFound, UsageError, first_field_error
from datamachine.storage import transcript_rows as rows
from datamachine.storage._prefix import resolve_prefix
from datamachine.storage._tx import (
    Connected,
    connection_lock,
    db_label,
    dialect,
    immediate,
    is_utf8,
    query,
    query_one,
    snapshot,
)
from datamachine.storage.locks import TranscriptLocks, check_session_id, prove
from datamachine.storage.tool_intents import Intent, unsettled
from datamachine.storage.transcript_writer import TranscriptWriter, TurnHook

__all__ = ["MAX_PAGE", "MAX_TURN", "TRANSCRIPT_STATUSES", "Transcript", "TranscriptPage",
           "TranscriptStatus", "TranscriptStore", "TranscriptSummary"]

logger = logging.getLogger("datamachine.storage")

TranscriptStatus = Literal[
    "running", "interrupted", "completed", "incomplete", "budget_exceeded", "aborted", "error",
    "awaiting_confirmation",
]
TRANSCRIPT_STATUSES: tuple[str, ...] = get_args(TranscriptStatus)
# The largest turn number a by-hand append takes: a run's turns are bounded by its
# conversation_turns budget (at most 10,000), and every count stays far inside SQLite's integers.
MAX_TURN = 1_000_000
_MAX_SQL_INT = 2**63 - 1
# The most transcripts one page() returns.
MAX_PAGE = 500
MessageLike = rows.MessageLike

_COLUMNS = ("t.id, t.status, t.provider, t.model, t.mode, t.created_at, t.updated_at, "
            "t.turn_count, t.cumulative_turn_count, t.message_count, t.usage, t.budgets, "
            "t.result, t.token_name, t.title, l.expires_at AS locked_until")
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
    title: str | None = None


class TranscriptPage(BaseModel):
    """One page of :meth:`TranscriptStore.page`: ``items`` newest first, and ``next``, the
    cursor of the page after it (None: this is the last)."""

    model_config = ConfigDict(defer_build=True, frozen=True)

    items: list[TranscriptSummary]
    next: str | None


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
        """Release the lock if ``token`` holds it; a stale token releases nothing. A token that
        is not one (None: an ``acquire`` that found the lock held gave none) is a UsageError,
        not a quiet False."""
        if not isinstance(token, str) or not token:
            raise UsageError(f"token must be the lock token acquire() returned, got "
                             f"{brief_repr(token)}; acquire() returns None when another run "
                             "holds the lock, and then there is nothing to release.")
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
        turn; with ``token``, only while that token holds the session's lock. Bad arguments
        raise UsageError naming them, before anything is written."""
        checked = _checked_messages(messages)
        if request is not None and not isinstance(request, Mapping):
            raise UsageError(f"request must be a dict (provider, model, mode), got "
                             f"{type(request).__name__}.")
        self._write(session_id, _checked_token(token), "start a transcript",
                    lambda conn, sid, now: rows.start(conn, sid, checked, dict(request or {}),
                                                      now))

    def append_turn(self, session_id: str, turn: int, messages: Sequence[MessageLike], *,
                    token: str | None = None) -> None:
        """Append one finished turn's messages and the row's counts in one transaction
        (creating the row if needed); with ``token``, also proving and extending its lock.

        Every argument is checked before anything is written (UsageError naming it): a turn
        number that is not an integer from 1 to 1,000,000 used to be stored as the row's
        count and broke ``list()`` for the whole database.
        """
        if isinstance(turn, bool) or not isinstance(turn, int) or not 1 <= turn <= MAX_TURN:
            raise UsageError(f"turn must be the turn's number, an integer from 1 to "
                             f"{MAX_TURN:,}, got {brief_repr(turn)}.")
        checked = _checked_messages(messages)
        self._write(session_id, _checked_token(token), "append a turn",
                    lambda conn, sid, now: rows.append(conn, sid, turn, checked, now))

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
        with self._lock, immediate(self._db, self._lock, self._label, action,
                                   (f"session:{sid}",)) as conn:
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
        if status not in TRANSCRIPT_STATUSES:
            raise UsageError(f"status must be one of {', '.join(TRANSCRIPT_STATUSES)}, got "
                             f"{brief_repr(status)}.")
        with self._lock, immediate(self._db, self._lock, self._label, "update a transcript",
                                   (f"session:{sid}",)) as conn:
            row = query_one(conn, "SELECT result FROM transcripts WHERE id = ?", [sid])
            if row is None:
                return
            try:
                result = json.loads(row["result"])
            except ValueError:
                result = None
            if isinstance(result, dict):
                result["status"] = status
            conn.execute(
                "UPDATE transcripts SET status = ?, result = COALESCE(?, result), updated_at = ? "
                "WHERE id = ?",
                [status, compact_json(result) if isinstance(result, dict) else None,
                 clock.now(), sid],
            )

    def exists(self, session_id: str) -> bool:
        """True if a transcript is stored under ``session_id``."""
        check_session_id(session_id)
        with self._lock:
            row = self._db.conn.execute(
                "SELECT 1 FROM transcripts WHERE id = ?", [session_id]
            ).fetchone()
        return row is not None

    def resolve(self, prefix: str) -> str:
        """The stored session id that ``prefix`` names: a whole id, or the first characters of
        exactly one (any length; what a person types from a listing).

        :class:`TranscriptNotFound` if no id starts with it; :class:`AmbiguousIdPrefix` (a
        ``UsageError``) naming the candidates if several do; ``UsageError`` for a value that
        cannot be a session id.
        """
        with self._lock:
            return resolve_prefix(
                self._db.conn, "transcripts", prefix, "transcript",
                lambda text: TranscriptNotFound(
                    f"No transcript id starts with {text!r} in {self._label}; list them with "
                    "host.transcripts.list() or `datamachine transcripts list`."))

    def get(self, session_id: str) -> list[dict[str, Any]]:
        """The stored messages (envelope dicts), in order; TranscriptNotFound if unknown."""
        check_session_id(session_id)
        with snapshot(self._db, self._lock, self._label) as conn:
            found = conn.execute(
                "SELECT envelope FROM transcript_messages WHERE session_id = ? ORDER BY position",
                [session_id]).fetchall()
            if not found and not self.exists(session_id):
                raise self._not_found(session_id)
        return [json.loads(row[0]) for row in found]

    def numbered(self, session_id: str, *, limit: int | None = None
                 ) -> builtins.list[tuple[int | None, int, dict[str, Any]]]:
        """The stored messages with the run and turn that wrote each, ``(run_base, turn,
        envelope)`` in order: ``run_base`` is the session's turns before that run (None for
        messages stored before migration m010), ``turn`` counts from 1 in every run (0:
        a run's starting messages). At most ``limit`` of them. TranscriptNotFound if
        unknown."""
        check_session_id(session_id)
        sql = ("SELECT run_base, turn, envelope FROM transcript_messages WHERE session_id = ? "
               "ORDER BY position")
        params: builtins.list[Any] = [session_id]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        with snapshot(self._db, self._lock, self._label) as conn:
            found = conn.execute(sql, params).fetchall()
            if not found and not self.exists(session_id):
                raise self._not_found(session_id)
        return [(None if row[0] is None else int(row[0]), int(row[1]), _envelope(row[2]))
                for row in found]

    def timeline(self, session_id: str) -> builtins.list[dict[str, Any]]:
        """The rare events every run of the session recorded (budget pressure, extensions,
        stops, final summaries, nudges, blockers), in order; see docs/viewer.md.
        TranscriptNotFound if unknown."""
        return [entry for entry in self._recorded(session_id)
                if entry.get("event") != "request"]

    def requests(self, session_id: str) -> builtins.list[dict[str, Any]]:
        """One record per provider request of every run of the session, in order: ``turn``,
        ``run_base``, ``ms`` (latency), ``ok``, and when there were any ``usage``, ``options``
        (the model options sent), ``attempts`` (``{"status", "error", "waited"}`` of each
        attempt that failed and was retried before it), ``error``, ``summary`` (the final
        summary request); see docs/viewer.md. TranscriptNotFound if unknown."""
        return [entry for entry in self._recorded(session_id)
                if entry.get("event") == "request"]

    def compactions(self, session_id: str) -> builtins.list[dict[str, Any]]:
        """Each time a run of the session sent a smaller view of its history (DESIGN.md 21),
        in order: ``seq``, ``run_base``, ``turn``, ``strategy``, ``tokens_before``,
        ``tokens_after``, ``messages_removed``, ``upto``, ``context_window`` (the
        window it fit, when known) and ``summary`` (the view itself is
        :meth:`latest_compaction`'s). TranscriptNotFound if unknown."""
        check_session_id(session_id)
        with snapshot(self._db, self._lock, self._label) as conn:
            found = query(conn, "SELECT seq, run_base, turn, strategy, tokens_before, "
                                "tokens_after, messages_removed, upto, context_window, summary "
                                "FROM transcript_compactions WHERE session_id = ? ORDER BY seq",
                          [session_id])
            if not found and not self.exists(session_id):
                raise self._not_found(session_id)
        return [dict(row) for row in found]

    def latest_compaction(self, session_id: str) -> dict[str, Any] | None:
        """The latest compacted view of the session: ``upto`` (how many of its messages the
        view stands for), ``view`` (its messages, JSON envelopes) and the record's other
        fields; None when no run of it compacted, or its view cannot be read."""
        check_session_id(session_id)
        with snapshot(self._db, self._lock, self._label) as conn:
            row = query_one(conn, "SELECT seq, turn, strategy, upto, context_window, summary, view "
                                  "FROM transcript_compactions WHERE session_id = ? "
                                  "AND view IS NOT NULL ORDER BY seq DESC LIMIT 1",
                            [session_id])
        if row is None:
            return None
        try:
            view = json.loads(row["view"])
        except ValueError:
            return None
        if not isinstance(view, builtins.list):
            return None
        return {**dict(row), "view": view}

    def _recorded(self, session_id: str) -> builtins.list[dict[str, Any]]:
        check_session_id(session_id)
        with self._lock:
            row = query_one(self._db.conn, "SELECT timeline FROM transcripts WHERE id = ?",
                            [session_id])
        if row is None:
            raise self._not_found(session_id)
        try:
            found = json.loads(row["timeline"]) if row["timeline"] is not None else []
        except ValueError:
            return []
        return [entry for entry in found if isinstance(entry, dict)] \
            if isinstance(found, list) else []

    def summary(self, session_id: str) -> TranscriptSummary:
        """Metadata of one transcript, without its messages; TranscriptNotFound if unknown,
        DatabaseError naming it if its row is damaged."""
        check_session_id(session_id)
        with snapshot(self._db, self._lock, self._label) as conn:
            return self._summary(self._row(conn, session_id))

    def unsettled_intents(self, session_id: str) -> list[Intent]:
        """The session's calls whose outcome is in doubt or about to be settled: intents
        stored before an effectful call ran whose result was never stored (a run died
        between the two, or is running the call now), oldest first (DESIGN.md 24)."""
        check_session_id(session_id)
        with snapshot(self._db, self._lock, self._label) as conn:
            return unsettled(conn, session_id)

    def get_transcript(self, session_id: str) -> Transcript:
        """Metadata and messages of one transcript; TranscriptNotFound if unknown."""
        check_session_id(session_id)
        with snapshot(self._db, self._lock, self._label) as conn:  # one consistent read
            summary = self._summary(self._row(conn, session_id))
            return Transcript(**summary.model_dump(), messages=self.get(session_id))

    def _row(self, conn: Any, session_id: str) -> Any:
        row = query_one(conn, f"SELECT {_COLUMNS} FROM transcripts t {_LIVE_LOCK_JOIN} "
                              "WHERE t.id = ?", [clock.now(), session_id])
        if row is None:
            raise self._not_found(session_id)
        return row

    def _summary(self, row: Any) -> TranscriptSummary:
        """The summary of one stored row; a row this version cannot read (written by hand, by
        an older bug) is a DatabaseError naming the session and the field."""
        try:
            return TranscriptSummary(**_summary_fields(row))
        except (ValidationError, ValueError, TypeError) as exc:  # ValueError: bad JSON
            where = first_field_error(exc)[0] if isinstance(exc, ValidationError) else ""
            raise DatabaseError(
                f"The transcript row {row['id']!r} in {self._label} is damaged"
                f"{f' ({where})' if where else ''}: {_problem(exc)}. Delete it, or correct "
                "the row by hand.") from None

    def list(self, *, limit: int = 50, status: TranscriptStatus | None = None,
             search: str | None = None,
             mode: str | None = None) -> builtins.list[TranscriptSummary]:
        """The most recently updated transcripts first, optionally only those in ``status``,
        those with a message whose text content holds ``search`` (case-insensitive for ASCII
        letters, as SQLite's ``LIKE``; ``%`` and ``_`` are literal) and those run in ``mode``
        (one of a run's modes).

        A damaged row (one this version cannot read) never costs the whole listing: it is left
        out and logged as a warning naming the session, so ``summary(id)`` can explain it.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise UsageError(f"limit must be a positive integer, got {brief_repr(limit)}.")
        limit = min(limit, _MAX_SQL_INT)  # more than SQLite can count is all of them
        where, params = self._filters(status=status, mode=mode, search=search)
        sql = f"SELECT {_COLUMNS} FROM transcripts t {_LIVE_LOCK_JOIN}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY t.updated_at DESC, t.id LIMIT ?"
        params.append(limit)
        with snapshot(self._db, self._lock, self._label) as conn:
            found = query(conn, sql, params)
        return self._readable(found)

    def page(self, *, limit: int = 50, status: TranscriptStatus | None = None,
             mode: str | None = None, text: str | None = None,
             after: str | None = None) -> TranscriptPage:
        """One page of transcripts, most recently updated first (ties by id), for browsing all
        of them (the run viewer's list): ``limit`` (1 to 500) per page, the page after the one
        whose ``next`` cursor is ``after``.

        Filters: ``status`` (as :meth:`list`), ``mode`` (one of a run's modes), ``text`` (held
        by the title, the final answer, the warning or the error, or the model or provider
        name, or the start of the id; case-insensitive as :meth:`list`'s ``search``). Paging is
        by key, not by offset: every page costs the same however deep it is, and a run that
        finishes while someone pages moves to the top instead of shifting every page.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise UsageError(f"limit must be a whole number from 1 to {MAX_PAGE}, got "
                             f"{brief_repr(limit)}.")
        where, params = self._filters(status=status, mode=mode, text=text)
        if after is not None:
            updated_at, last_id = _parse_cursor(after)
            # A row value: both SQLite and PostgreSQL walk the (updated_at, id) index from it.
            where.append("(t.updated_at, t.id) < (?, ?)")
            params += [updated_at, last_id]
        sql = f"SELECT {_COLUMNS} FROM transcripts t {_LIVE_LOCK_JOIN}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY t.updated_at DESC, t.id DESC LIMIT ?"
        params.append(limit + 1)  # one more: is there a next page?
        with snapshot(self._db, self._lock, self._label) as conn:
            found = query(conn, sql, params)
        more = len(found) > limit
        found = found[:limit]
        cursor = (f"{float(found[-1]['updated_at'])!r}:{found[-1]['id']}"
                  if more and found else None)
        return TranscriptPage(items=self._readable(found), next=cursor)

    def _filters(self, *, status: object = None, mode: object = None, search: object = None,
                 text: object = None) -> tuple[builtins.list[str], builtins.list[Any]]:
        """The WHERE terms and parameters (after the lock join's ``now``) of the filters given;
        UsageError naming a bad one."""
        if status is not None and status not in TRANSCRIPT_STATUSES:
            raise UsageError(f"status must be one of {', '.join(TRANSCRIPT_STATUSES)}, got "
                             f"{brief_repr(status)}.")
        for name, value in (("search", search), ("mode", mode), ("text", text)):
            if value is not None and not (isinstance(value, str) and value and is_utf8(value)):
                raise UsageError(f"{name} must be a non-empty string, got {brief_repr(value)}.")
        where: builtins.list[str] = []
        params: builtins.list[Any] = [clock.now()]
        if status in ("running", "interrupted"):
            # A running row is interrupted when no live lock stands behind it.
            where.append("t.status = 'running' AND l.expires_at IS "
                         f"{'NOT ' if status == 'running' else ''}NULL")
        elif status is not None:
            where.append("t.status = ?")  # the stored status is the reported one
            params.append(status)
        pg = dialect(self._db.conn) == "postgresql"
        like = "ILIKE" if pg else "LIKE"
        if mode is not None:
            # A run given several modes stores them joined by commas: match any one of them.
            where.append(f"{'strpos' if pg else 'instr'}(',' || t.mode || ',', ',' || ? || ',') "
                         "> 0")
            params.append(mode)
        if search is not None:
            # Every message's JSON is read: a scan of the listed sessions' messages, newest
            # session first, stopping once ``limit`` sessions matched.
            # A damaged envelope (not JSON) matches nothing instead of failing the listing.
            content = ("datamachine_json_field(m.envelope, 'content') ILIKE" if pg else
                       "CASE WHEN json_valid(m.envelope) THEN json_extract(m.envelope, "
                       "'$.content') END LIKE")
            where.append("EXISTS (SELECT 1 FROM transcript_messages m WHERE m.session_id = t.id "
                         f"AND {content} ? ESCAPE '\\')")
            params.append(_like_anywhere(str(search)))
        if text is not None:
            # The row's own columns only (no message is read): a scan of the transcripts at
            # most, with each backend's fastest case-insensitive substring test (SQLite's LIKE;
            # PostgreSQL's strpos on lower(), which beats its ILIKE by a third). The answer,
            # warning and error live in ``result`` (JSON): the whole text picks the candidates
            # cheaply, the field reads then decide (the JSON also holds keys and tool names a
            # search must not match).
            def holds(column: str) -> str:
                if pg:
                    return f"strpos(lower({column}), lower(?)) > 0"
                return f"{column} LIKE ? ESCAPE '\\'"

            fields = [holds(_json_field(pg, "t.result", key))
                      for key in ("final_content", "warning", "error")]
            in_result = "(" + " OR ".join(fields) + ")"
            needle = str(text)
            if not any(c in needle for c in '"\\') and needle.isprintable():
                # JSON escapes none of its characters: the stored text holds it as typed.
                in_result = f"({holds('t.result')} AND {in_result})"
            term = ("(" + " OR ".join([f"t.id {like} ? ESCAPE '\\'", holds("t.title"),
                                       holds("t.model"), holds("t.provider"), in_result])
                    + ")")
            where.append(term)
            # The id's prefix pattern, then the text (a LIKE pattern on SQLite) for the others.
            params += [_like_start(needle)] + [needle if pg else _like_anywhere(needle)] * (
                term.count("?") - 1)
        return where, params

    def _readable(self, found: Sequence[Any]) -> builtins.list[TranscriptSummary]:
        listed: builtins.list[TranscriptSummary] = []
        for row in found:
            try:
                listed.append(self._summary(row))
            except DatabaseError as exc:
                logger.warning("datamachine: %s Left out of the listing.", exc)
        return listed

    def _not_found(self, session_id: str) -> TranscriptNotFound:
        return TranscriptNotFound(
            f"No transcript is stored under session id {session_id!r} in {self._label}; "
            "list them with host.transcripts.list() or `datamachine transcripts list`."
        )


def _checked_messages(messages: object) -> builtins.list[Message]:
    """A by-hand write's messages as envelopes, every one checked before anything is written
    (UsageError naming the first bad one)."""
    if not isinstance(messages, list | tuple):
        raise UsageError(f"messages must be a list of messages, got {type(messages).__name__}.")
    try:
        return normalize_messages(messages)
    except InvalidMessage as exc:
        raise UsageError(f"messages: {exc}") from None


def _like_anywhere(text: str) -> str:
    """The ``LIKE`` pattern (escape character ``\\``) of text containing ``text`` literally."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _json_field(pg: bool, column: str, key: str) -> str:
    """SQL for the text of ``column``'s JSON field ``key`` (NULL when it is not JSON)."""
    if pg:
        return f"datamachine_json_field({column}, '{key}')"
    return f"CASE WHEN json_valid({column}) THEN json_extract({column}, '$.{key}') END"


def _envelope(text: str) -> dict[str, Any]:
    """A stored envelope; a damaged one (not JSON) as a text message saying so."""
    try:
        found = json.loads(text)
    except ValueError:
        found = None
    if isinstance(found, dict):
        return found
    return {"type": "text", "role": "?", "content": f"(a damaged message: {text[:200]!r})"}


def _like_start(text: str) -> str:
    """The ``LIKE`` pattern (escape character ``\\``) of text starting with ``text``."""
    return _like_anywhere(text)[1:]


def _parse_cursor(cursor: object) -> tuple[float, str]:
    """A ``next`` cursor of :meth:`TranscriptStore.page` as (updated_at, id)."""
    if isinstance(cursor, str):
        stamp, sep, last_id = cursor.partition(":")
        try:
            updated_at = float(stamp)
        except ValueError:
            updated_at = math.nan
        if sep and last_id and math.isfinite(updated_at) and is_utf8(last_id):
            return updated_at, last_id
    raise UsageError(f"after must be the 'next' cursor of an earlier page, got "
                     f"{brief_repr(cursor)}.")


def _checked_token(token: object) -> str | None:
    if token is not None and not (isinstance(token, str) and token and is_utf8(token)):
        raise UsageError(f"token must be the lock token acquire() returned, got "
                         f"{brief_repr(token)}.")
    return token


def _problem(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return first_field_error(exc)[1]
    return str(exc)


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
        "title": row["title"],
    }
