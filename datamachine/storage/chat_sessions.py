"""Chat sessions and their turn limits (DESIGN.md section 6): :class:`ChatSessionStore`.

This module is the storage half of the turn-limit rules: the count, the ``active`` ->
``aborted`` status (terminal), and the limit (an integer or ``"unlimited"``). The limit is the
budget ``chat_turns``, resolved by the host's budget registry when the session is made (the
caller's ``max_turns``, else the setting ``chat_max_turns``, else 25; then the registered clamp,
reported), and stored with the session. Switching the limit from ``"unlimited"`` to an integer
resets the count, because turns counted without a limit were never offered a confirmation. The
run-time half (asking ``confirm_continuation`` when the count reaches the limit, then
``reset_turns`` or ``abort``) belongs to ``host.chat``. A session's messages live in the
transcript with the same id.
"""

from __future__ import annotations

import builtins
import uuid
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agents_api import clock
from agents_api.errors import brief_repr
from datamachine.budgets_builtin import CHAT_TURNS
from datamachine.errors import (
    ChatSessionExists,
    ChatSessionNotFound,
    SessionAborted,
    UsageError,
)
from datamachine.registry import MAX_BUDGET_VALUE
from datamachine.storage._prefix import resolve_prefix
from datamachine.storage._tx import (
    Conn,
    Connected,
    connection_lock,
    db_label,
    immediate,
    query,
    query_one,
)
from datamachine.storage.locks import check_session_id

if TYPE_CHECKING:
    from datamachine.registry import IterationBudgetRegistry
    from datamachine.storage.transcripts import TranscriptStore

__all__ = ["ChatSession", "ChatSessionStore", "MaxTurns", "record_limit_answer", "record_turn"]

MaxTurns = int | Literal["unlimited"]
_COLUMNS = "id, turn_count, status, max_turns, created_at, updated_at, token_name"


class ChatSession(BaseModel):
    """One chat session: ``turn_count`` provider turns since the last reset, ``status``
    (``active`` or ``aborted``) and ``max_turns`` (an integer or ``"unlimited"``).

    ``token_name`` is the ``/chat`` token that created it, the only one that may continue it
    over HTTP (None: created through the Python API, which no remote caller may continue).
    ``warnings``: what :meth:`ChatSessionStore.create` or ``set_limit`` reports about the
    limit it was given (a value outside the ``chat_turns`` clamp, and what was kept); never
    stored, empty when the session is read back.
    """

    model_config = ConfigDict(defer_build=True, frozen=True)

    id: str
    turn_count: int
    status: Literal["active", "aborted"]
    max_turns: MaxTurns
    created_at: float
    updated_at: float
    token_name: str | None = None
    warnings: list[str] = Field(default_factory=list, exclude=True)

    @property
    def limit_reached(self) -> bool:
        """True when the count is at or past an integer limit (never when unlimited)."""
        return self.max_turns != "unlimited" and self.turn_count >= self.max_turns

    @property
    def aborted(self) -> bool:
        """True once the session refused to continue; it stays so."""
        return self.status == "aborted"


def record_turn(conn: Conn, session_id: str, *, reset: bool, abort: bool,
                max_turns: MaxTurns, now: float, create: bool = False,
                token_name: str | None = None) -> None:
    """Inside a turn's transaction: count the turn (``reset``: the user confirmed at the limit,
    the count starts again from 0; ``abort``: declined, the session is aborted for good).

    ``create``: the session's first stored turn (a ``/chat`` request that opened it), so a
    request refused before running leaves no session behind; it belongs to ``token_name``.
    Aborted stays aborted.
    """
    if create:
        conn.execute(
            "INSERT INTO chat_sessions (id, turn_count, status, max_turns, created_at, "
            "updated_at, token_name) VALUES (?, 0, 'active', ?, ?, ?, ?) "
            "ON CONFLICT (id) DO NOTHING",
            [session_id, max_turns, now, now, token_name])
    conn.execute(
        "UPDATE chat_sessions SET turn_count = CASE WHEN ? THEN 0 ELSE turn_count + 1 END, "
        "status = CASE WHEN ? THEN 'aborted' ELSE status END, updated_at = ? WHERE id = ?",
        [reset, abort, now, session_id])


def record_limit_answer(conn: Conn, session_id: str, *, confirmed: bool,
                        now: float) -> None:
    """Inside a run's transaction: the answer at a session already at its limit before the run
    (confirmed: the count starts again from 0; declined: the session is aborted for good)."""
    assignment = "turn_count = 0" if confirmed else "status = 'aborted'"
    conn.execute(f"UPDATE chat_sessions SET {assignment}, updated_at = ? WHERE id = ?",
                 [now, session_id])


def _session(row: Any) -> ChatSession:
    fields = dict(row)
    limit = fields["max_turns"]
    if isinstance(limit, str) and limit.isdigit():  # PostgreSQL keeps the column as text
        fields["max_turns"] = int(limit)
    return ChatSession(**fields)


class ChatSessionStore:
    """Create, read and update chat sessions; every change is one transaction."""

    def __init__(self, db: Connected, *, budgets: IterationBudgetRegistry,
                 transcripts: TranscriptStore | None = None) -> None:
        self._db = db
        self._lock = connection_lock(db)
        self._label = db_label(db)
        # Where a session's limit is decided: the budget chat_turns, as every budget is.
        self._budgets = budgets
        self._transcripts = transcripts

    def new_limit(self, max_turns: MaxTurns | None = None, *, knob: str = "max_turns",
                  warnings: list[str] | None = None) -> MaxTurns:
        """The limit a session gets: the budget ``chat_turns`` resolved by the host's registry.

        ``max_turns`` (the caller's override; None: the setting ``chat_max_turns``, else the
        registered default, 25) must be an integer from 1 to 10,000, or ``"unlimited"`` where
        the registered budget allows it, else :class:`InvalidBudgetValue` naming ``knob``. The
        value is then clamped to the registered ``[min, max]``; a clamp is appended to
        ``warnings`` (requested and kept values), never applied silently.
        """
        if max_turns is not None:
            self._budgets.check_ceiling(CHAT_TURNS, knob, max_turns)
        resolved = self._budgets.resolve(CHAT_TURNS, max_turns)
        if resolved.clamped and warnings is not None:
            warnings.append(str(resolved.warning()))
        # None: a chat_turns registered without a default and not set: nothing limits it.
        return resolved.limit if isinstance(resolved.limit, int) else "unlimited"

    def create(self, max_turns: MaxTurns | None = None, *,
               session_id: str | None = None) -> ChatSession:
        """A new ``active`` session with ``turn_count`` 0.

        ``max_turns``: an integer in [1, 10,000] or ``"unlimited"``; None takes the setting
        ``chat_max_turns`` (default 25). Its clamp is the registered ``chat_turns`` budget's:
        a value outside it is clamped and reported in the session's ``warnings`` (see
        :meth:`new_limit`). ``session_id``: a chosen id (else a new one); an id already taken
        raises :class:`ChatSessionExists`.
        """
        notices: list[str] = []
        limit = self.new_limit(max_turns, warnings=notices)
        sid = uuid.uuid4().hex if session_id is None else check_session_id(session_id)
        now = clock.now()
        with self._lock:
            with immediate(self._db, self._lock, self._label, "create a chat session",
                           (f"session:{sid}",)) as conn:
                cursor = conn.execute(
                    "INSERT INTO chat_sessions (id, turn_count, status, max_turns, created_at, "
                    "updated_at) VALUES (?, 0, 'active', ?, ?, ?) ON CONFLICT (id) DO NOTHING",
                    [sid, limit, now, now],
                )
                if cursor.rowcount != 1:
                    raise ChatSessionExists(
                        f"A chat session with id {sid!r} already exists; use "
                        "chat_sessions.get() to read it or pick another id."
                    )
            return self._noting(self.get(sid), notices)

    def get(self, session_id: str) -> ChatSession:
        """The session; ChatSessionNotFound if there is none (UsageError for a value that
        cannot be a session id)."""
        check_session_id(session_id)
        with self._lock:
            row = query_one(self._db.conn, f"SELECT {_COLUMNS} FROM chat_sessions WHERE id = ?",
                            [session_id])
        if row is None:
            raise self._not_found(session_id)
        return _session(row)

    def resolve(self, prefix: str) -> str:
        """The chat session id that ``prefix`` names: a whole id, or the first characters of
        exactly one (any length). :class:`ChatSessionNotFound` if no id starts with it;
        :class:`AmbiguousIdPrefix` (a ``UsageError``) naming the candidates if several do."""
        with self._lock:
            return resolve_prefix(
                self._db.conn, "chat_sessions", prefix, "chat session",
                lambda text: ChatSessionNotFound(
                    f"No chat session id starts with {text!r} in {self._label}; list them "
                    "with host.chat_sessions.list() or `datamachine sessions list`."))

    def list(self, limit: int = 50) -> builtins.list[ChatSession]:
        """Sessions, most recently updated first."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise UsageError(f"limit must be a positive integer, got {brief_repr(limit)}.")
        with self._lock:
            rows = query(self._db.conn,
                         f"SELECT {_COLUMNS} FROM chat_sessions ORDER BY updated_at DESC, id "
                         "LIMIT ?", [min(limit, 2**63 - 1)])  # more than SQLite counts: all
        return [_session(row) for row in rows]

    def require_active(self, session_id: str) -> ChatSession:
        """The session if it is active; :class:`SessionAborted` if it was aborted."""
        session = self.get(session_id)
        if session.aborted:
            raise self._aborted(session)
        return session

    def set_limit(self, session_id: str, max_turns: MaxTurns) -> ChatSession:
        """Change the limit; from ``"unlimited"`` to an integer also resets the count to 0.
        ``max_turns`` is checked and clamped as for :meth:`create` (a clamp is in the returned
        session's ``warnings``)."""
        if max_turns is None:  # None would mean "the default" to the registry: not a limit
            self._budgets.check_ceiling(CHAT_TURNS, "max_turns", max_turns)
        notices: list[str] = []
        limit = self.new_limit(max_turns, warnings=notices)
        return self._noting(self._update(
            session_id,
            "max_turns = ?, turn_count = CASE WHEN max_turns = 'unlimited' AND ? != 'unlimited' "
            "THEN 0 ELSE turn_count END",
            [limit, limit],
            active_only=False,
        ), notices)

    def add_turns(self, session_id: str, n: int = 1) -> ChatSession:
        """Count ``n`` more provider turns (also when unlimited). Refused once aborted."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_BUDGET_VALUE:
            # More than any turn limit at once is a mistake (and 2**63 overflowed SQLite).
            raise UsageError(f"add_turns needs an integer from 0 to {MAX_BUDGET_VALUE:,}, got "
                             f"{brief_repr(n)}.")
        return self._update(session_id, "turn_count = turn_count + ?", [n], active_only=True)

    def reset_turns(self, session_id: str) -> ChatSession:
        """The user confirmed at the limit: the count starts again from 0."""
        return self._update(session_id, "turn_count = 0", [], active_only=True)

    def abort(self, session_id: str) -> ChatSession:
        """The user declined (or no UI answered): the session is aborted, for good."""
        return self._update(session_id, "status = 'aborted'", [], active_only=False)

    def messages(self, session_id: str) -> builtins.list[dict[str, Any]]:
        """The session's stored messages (its transcript), ``[]`` before its first run."""
        self.get(session_id)
        if self._transcripts is None or not self._transcripts.exists(session_id):
            return []
        return self._transcripts.get(session_id)

    def _update(self, session_id: str, assignments: str, params: builtins.list[Any], *,
                active_only: bool) -> ChatSession:
        check_session_id(session_id)
        with self._lock:
            with immediate(self._db, self._lock, self._label, "update a chat session",
                           (f"session:{session_id}",)) as conn:
                row = query_one(conn, f"SELECT {_COLUMNS} FROM chat_sessions WHERE id = ?",
                                [session_id])
                if row is None:
                    raise self._not_found(session_id)
                if active_only and row["status"] == "aborted":
                    raise self._aborted(_session(row))
                conn.execute(
                    f"UPDATE chat_sessions SET {assignments}, updated_at = ? WHERE id = ?",
                    [*params, clock.now(), session_id],
                )
            return self.get(session_id)

    @staticmethod
    def _noting(session: ChatSession, notices: builtins.list[str]) -> ChatSession:
        """``session`` as returned to whoever set its limit: with what the limit's
        resolution reported."""
        return session.model_copy(update={"warnings": notices}) if notices else session

    def _not_found(self, session_id: str) -> ChatSessionNotFound:
        return ChatSessionNotFound(
            f"No chat session has id {session_id!r} in {self._label}; create one with "
            "host.chat_sessions.create()."
        )

    @staticmethod
    def _aborted(session: ChatSession) -> SessionAborted:
        return SessionAborted(
            f"Chat session {session.id!r} was aborted at its turn limit ({session.max_turns}) "
            "and accepts no more messages; start a new session."
        )
