"""Chat sessions with turn limits (DESIGN.md section 6): one run on a stored session.

The run takes the session's transcript lock *before* it reads the session or its stored
history, so two requests on one session can never both start from the same history: the second
gets ``transcript_lock_contention`` without running. Each provider turn counts toward the
session's limit, and the count is written in the same transaction as the turn it counts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agents_api import IterationBudget, LockLost
from agents_api.drive import Steps, drive_sync
from datamachine.budgets_builtin import CHAT_TURNS
from datamachine.conversation.conversation_run import ConversationRun
from datamachine.conversation.inputs import check_on_text
from datamachine.conversation.pausing import (
    confirmation_mode,
)
from datamachine.conversation.result import ConversationResult
from datamachine.conversation.sessions import (
    HookFailed,
    abort_before_run,
    check_session_payload,
    contention_result,
    failed_before_run,
    limit_notice,
    pause_before_run,
    refuse_if_paused,
    unsettled_plan,
)
from datamachine.errors import (
    ChatSessionNotFound,
    UsageError,
)
from datamachine.storage.chat_sessions import (
    ChatSession,
    record_limit_answer,
    record_turn,
)
from datamachine.storage.transcript_writer import TranscriptWriter

if TYPE_CHECKING:
    from datamachine.host import Services

__all__ = ["ChatTurnGate", "chat_gate", "chat_message", "chat_steps", "chat_turns_on"]


class ChatTurnGate:
    """A chat session's turn limit during one run (the turn runner's ``turn_gate``).

    Called after every provider answer: counts the turn and, at the limit, asks
    ``confirm_continuation`` (True: the count starts again; otherwise the session is aborted and
    the run stops). :meth:`write` records that in the turn's own transaction. The limit is the
    one stored with the session (the budget ``chat_turns``, resolved when it was made);
    ``warnings``: what resolving it reported, for the run's result (a session this run makes).
    """

    def __init__(self, services: Services, session: ChatSession, *, create: bool,
                 pause: bool = False, token_name: str | None = None,
                 warnings: list[str] | None = None) -> None:
        self.services = services
        # The /chat token a session created by this run belongs to.
        self.token_name = token_name
        # confirmation="pause": at the limit the run stops awaiting_confirmation instead of
        # asking; ``pending`` says so to the run.
        self.pause = pause
        self.pending: dict[str, Any] | None = None
        self.session = session
        self.session_id = session.id
        self.max_turns = session.max_turns
        self.count = session.turn_count
        self.create = create
        self.aborted = False
        self.notice = limit_notice(session.id, session.max_turns)
        self.warnings = list(warnings or [])
        self._reset = False

    def budget(self) -> IterationBudget:
        """The session's turns as the budget ``chat_turns``: its count against its limit (what
        ``confirm_continuation`` is asked with, and what a result the limit stopped reports)."""
        limit = self.max_turns
        return IterationBudget(CHAT_TURNS, limit if isinstance(limit, int) else max(1, self.count),
                               self.count)

    def _confirmed(self) -> bool:
        answer = self.services.first(
            "confirm_continuation", budget=self.budget(),
            context={"kind": "chat_turn_limit", "session_id": self.session_id,
                     "turn_count": self.count, "max_turns": self.max_turns})
        return answer is True

    @property
    def at_limit(self) -> bool:
        """The session's count is at (or past) an integer limit."""
        return self.max_turns != "unlimited" and self.count >= self.max_turns

    def open(self, writer: TranscriptWriter) -> bool:
        """Before the run, holding the lock: a session already at its limit is asked first;
        the answer is written through ``writer`` (proving the lock). False: declined, the
        session is aborted and the run does not start."""
        if self.max_turns == "unlimited" or self.count < self.max_turns:
            return True
        try:
            confirmed = self._confirmed()
        except Exception as exc:
            raise HookFailed(str(exc)) from exc
        writer.write("answer a chat session's turn limit",
                     lambda conn, now: record_limit_answer(conn, self.session_id,
                                                           confirmed=confirmed, now=now))
        if confirmed:
            self.count = 0
        return confirmed

    def answered(self, approve: bool) -> None:
        """A person answered the limit of a paused run (``resume``): the count starts again,
        or the session is aborted."""
        if approve:
            self.count = 0
        else:
            self.aborted = True

    def __call__(self, turn: int) -> bool:
        self.count += 1
        self._reset = False
        if self.max_turns == "unlimited" or self.count < self.max_turns:
            return True
        if self.pause:
            self.pending = {"kind": "chat_turn_limit", "budget": CHAT_TURNS, "tool_call": None}
            return True
        if self._confirmed():
            self.count, self._reset = 0, True
            return True
        self.aborted = True
        return False

    def write(self, conn: Any, turn: int, now: float) -> None:
        """The writer's ``on_turn``: the count (and an abort) move with the turn."""
        record_turn(conn, self.session_id, reset=self._reset, abort=self.aborted,
                    max_turns=self.max_turns, now=now, create=self.create,
                    token_name=self.token_name)
        self.create = False


def chat_message(message: Any) -> list[dict[str, Any]]:
    """``message`` as the one user message a chat run adds (a non-empty string)."""
    if not isinstance(message, str) or not message.strip():
        raise UsageError("message must be a non-empty string.")
    return [{"role": "user", "content": message}]


def chat_turns_on(services: Services, session_id: str, new_messages: list[dict[str, Any]],
                  tools: Any = None, provider: str | None = None, model: str | None = None,
                  payload: dict[str, Any] | None = None, *, mode: Any = "chat",
                  max_turns: int | None = None, create: bool = False,
                  on_text: Callable[[str], None] | None = None) -> ConversationResult:
    """One run on a stored chat session, synchronously (see :func:`chat_steps`)."""
    return drive_sync(chat_steps(services, session_id, new_messages, tools, provider, model,
                                 payload, mode=mode, max_turns=max_turns, create=create,
                                 on_text=on_text))


def chat_steps(services: Services, session_id: str, new_messages: list[dict[str, Any]],
               tools: Any = None, provider: str | None = None, model: str | None = None,
               payload: dict[str, Any] | None = None, *, mode: Any = "chat",
               max_turns: int | None = None, create: bool = False,
               on_text: Callable[[str], None] | None = None) -> Steps[ConversationResult]:
    """One run on a stored chat session: its messages plus ``new_messages``, as steps (the
    sync and async entry points drive the same ones).

    Raises ChatSessionNotFound (unless ``create``: a new session is stored with its first
    turn, its limit the budget ``chat_turns`` resolved now: payload ``budget_ceilings``, else
    the setting, else the default, clamped and reported in the result's ``warnings``) and
    SessionAborted; returns a ``transcript_lock_contention`` result, without running, when
    another run holds the session.
    """
    check_on_text(on_text)
    runtime = check_session_payload(payload)
    ttl = runtime.transcript_lock_ttl
    existing = _exists(services, session_id, create)
    store = services.transcripts
    token = store.acquire(session_id, ttl)
    if token is None:
        label = mode if isinstance(mode, str) else ",".join(mode)
        return contention_result(services, session_id, label, provider, model, payload)
    notices: list[str] = []
    try:
        session = _session_under_lock(services, session_id, existing,
                                      runtime.budget_ceilings.get(CHAT_TURNS), notices)
    except BaseException:  # aborted meanwhile (SessionAborted): give the lock back
        store.release(session_id, token)
        raise
    gate = ChatTurnGate(services, session, create=not existing,
                        pause=confirmation_mode(services.settings.get, runtime) == "pause",
                        token_name=runtime.token_name, warnings=notices)
    writer = store.open_writer(session_id, token, ttl, on_turn=gate.write)
    try:
        if gate.pause and gate.at_limit:
            return pause_before_run(services, gate, writer, new_messages, tools,
                                    services.default_provider(provider),
                                    services.default_model(model), mode, payload)
        if not gate.open(writer):
            return abort_before_run(services, gate, writer, payload)
        run = ConversationRun.create(
            services, [*writer.history(), *new_messages], tools,
            provider, model, mode,
            {**(payload or {}), "transcript_session_id": session_id}, max_turns, False,
            writer=writer, turn_gate=gate, cumulative_base=writer.stored_turns(),
            on_text=on_text, in_doubt=unsettled_plan(services, writer))
        return (yield from run.steps())
    except (LockLost, HookFailed) as exc:  # at the limit's question, before the run
        return failed_before_run(services, session_id, exc, mode, provider, model, payload)
    finally:
        writer.release()  # the run frees the lock itself; this covers the paths before it


def _exists(services: Services, session_id: str, create: bool) -> bool:
    try:
        services.chat_sessions.get(session_id)  # an unknown id fails before any write
    except ChatSessionNotFound:
        if not create:
            raise
        return False
    return True


def _session_under_lock(services: Services, session_id: str, existing: bool,
                        override: int | None, notices: list[str]) -> ChatSession:
    """The session a chat run goes on with: the stored one, or the one it makes (stored with
    its first turn), whose limit is resolved here (``override``: payload
    ``budget_ceilings["chat_turns"]``); what resolving reported goes into ``notices``."""
    if existing:
        session = services.chat_sessions.require_active(session_id)
        refuse_if_paused(services, session_id)
        if override is not None:  # a session keeps the limit it was made with
            notices.append(
                f"payload['budget_ceilings'][{CHAT_TURNS!r}] applies to a session this run "
                f"makes; session {session_id!r} keeps its limit ({session.max_turns}); "
                "chat_sessions.set_limit() changes it.")
        return session
    limit = services.chat_sessions.new_limit(
        override, knob=f"payload['budget_ceilings'][{CHAT_TURNS!r}]", warnings=notices)
    return ChatSession(id=session_id, turn_count=0, status="active", max_turns=limit,
                       created_at=0.0, updated_at=0.0)


def chat_gate(services: Services, session_id: str, *, pause: bool) -> ChatTurnGate | None:
    """On a chat session (read under its lock): its turn gate; otherwise None. Raises
    SessionAborted for an aborted one."""
    try:
        session = services.chat_sessions.require_active(session_id)
    except ChatSessionNotFound:
        return None
    return ChatTurnGate(services, session, create=False, pause=pause)
