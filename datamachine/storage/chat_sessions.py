"""Chat sessions and their turn limits (DESIGN.md section 6): :class:`ChatSessionStore`.

This module is the storage half of the turn-limit rules: the count, the ``active`` ->
``aborted`` status (terminal), and the limit (an integer or ``"unlimited"``, default from the
setting ``chat_max_turns``). Switching the limit from ``"unlimited"`` to an integer resets the
count, because turns counted without a limit were never offered a confirmation. The run-time half
(asking ``confirm_continuation`` when the count reaches the limit, then ``reset_turns`` or
``abort``) belongs to ``host.chat``. A session's messages live in the transcript with the same id.
"""

from __future__ import annotations

import builtins
import uuid
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from agents_api import clock
from agents_api.errors import brief_repr
from datamachine.errors import (
    ChatSessionExists,
    ChatSessionNotFound,
    InvalidBudgetValue,
    SessionAborted,
    UsageError,
)
from datamachine.registry import MAX_BUDGET_VALUE, validate_budget_value
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
    from datamachine.settings import Settings
    from datamachine.storage.transcripts import TranscriptStore

__all__ = ["DEFAULT_CHAT_MAX_TURNS", "ChatSession", "ChatSessionStore", "MaxTurns",
           "record_limit_answer", "record_turn", "validate_max_turns"]

MaxTurns = int | Literal["unlimited"]
DEFAULT_CHAT_MAX_TURNS = 25
CHAT_MAX_TURNS_SETTING = "chat_max_turns"
_COLUMNS = "id, turn_count, status, max_turns, created_at, updated_at, token_name"


class ChatSession(BaseModel):
    """One chat session: ``turn_count`` provider turns since the last reset, ``status``
    (``active`` or ``aborted``) and ``max_turns`` (an integer or ``"unlimited"``).

    ``token_name`` is the ``/chat`` token that created it, the only one that may continue it
    over HTTP (None: created through the Python API, which no remote caller may continue).
    """

    model_config = ConfigDict(defer_build=True, frozen=True)

    id: str
    turn_count: int
    status: Literal["active", "aborted"]
    max_turns: MaxTurns
    created_at: float
    updated_at: float
    token_name: str | None = None

    @property
    def limit_reached(self) -> bool:
        """True when the count is at or past an integer limit (never when unlimited)."""
        return self.max_turns != "unlimited" and self.turn_count >= self.max_turns

    @property
    def aborted(self) -> bool:
        """True once the session refused to continue; it stays so."""
        return self.status == "aborted"


def validate_max_turns(value: object, knob: str = "max_turns") -> MaxTurns:
    """Return ``value`` if it is ``"unlimited"`` or an integer in [1, 10,000]; else raise
    :class:`InvalidBudgetValue` naming ``knob``. Nothing is coerced (``"10"`` is refused)."""
    if value == "unlimited":
        return "unlimited"
    try:
        return validate_budget_value(knob, value)
    except InvalidBudgetValue as exc:
        raise InvalidBudgetValue(f'{exc} Use "unlimited" for no limit.') from None


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

    def __init__(self, db: Connected, *, settings: Settings | None = None,
                 transcripts: TranscriptStore | None = None) -> None:
        self._db = db
        self._lock = connection_lock(db)
        self._label = db_label(db)
        self._settings = settings
        self._transcripts = transcripts

    def default_max_turns(self) -> MaxTurns:
        """The setting ``chat_max_turns`` (validated), else 25."""
        if self._settings is None:
            return DEFAULT_CHAT_MAX_TURNS
        value = self._settings.get(CHAT_MAX_TURNS_SETTING, DEFAULT_CHAT_MAX_TURNS)
        return validate_max_turns(value, f"setting {CHAT_MAX_TURNS_SETTING!r}")

    def create(self, max_turns: MaxTurns | None = None, *,
               session_id: str | None = None) -> ChatSession:
        """A new ``active`` session with ``turn_count`` 0.

        ``max_turns``: an integer in [1, 10,000] or ``"unlimited"``; None takes the setting
        ``chat_max_turns`` (default 25). ``session_id``: a chosen id (else a new one); an id
        already taken raises :class:`ChatSessionExists`.
        """
        limit = (self.default_max_turns() if max_turns is None
                 else validate_max_turns(max_turns))
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
            return self.get(sid)

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
        """Change the limit; from ``"unlimited"`` to an integer also resets the count to 0."""
        limit = validate_max_turns(max_turns)
        return self._update(
            session_id,
            "max_turns = ?, turn_count = CASE WHEN max_turns = 'unlimited' AND ? != 'unlimited' "
            "THEN 0 ELSE turn_count END",
            [limit, limit],
            active_only=False,
        )

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
