"""Chat sessions with turn limits (DESIGN.md section 6): one run on a stored session.

The run takes the session's transcript lock *before* it reads the session or its stored
history, so two requests on one session can never both start from the same history: the second
gets ``transcript_lock_contention`` without running. Each provider turn counts toward the
session's limit, and the count is written in the same transaction as the turn it counts.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

from agents_api import IterationBudget, LockLost, Message
from agents_api.drive import Steps, drive_sync
from agents_api.results import terminal_payload
from datamachine.budgets_builtin import CHAT_TURNS
from datamachine.conversation.conversation_run import ConversationRun
from datamachine.conversation.events import emit_outside_run
from datamachine.conversation.pausing import (
    PausedRun,
    confirmation_mode,
    kept_payload,
    paused_runs,
    pending_warning,
    stored_pending,
)
from datamachine.conversation.payload import split_payload
from datamachine.conversation.result import ConversationResult
from datamachine.conversation.spec import normalize_tools
from datamachine.errors import (
    ChatSessionNotFound,
    SessionAwaitingConfirmation,
    TranscriptNotFound,
    UsageError,
)
from datamachine.payload_keys import RuntimeOptions
from datamachine.services import Services
from datamachine.storage.chat_sessions import (
    ChatSession,
    MaxTurns,
    record_limit_answer,
    record_turn,
)
from datamachine.storage.transcript_writer import TranscriptWriter

__all__ = ["ChatTurnGate", "abort_before_run", "chat_message", "chat_steps", "chat_turns_on",
           "contention_result", "failed_before_run", "pause_before_run", "refuse_if_paused",
           "settle_without_run"]


def _notice(session_id: str, max_turns: MaxTurns) -> str:
    return (f"Chat session {session_id!r} reached its turn limit ({max_turns}) and was not "
            "continued; it is now aborted.")


def _confirmed(services: Services, session_id: str, count: int, max_turns: MaxTurns) -> bool:
    ceiling = max_turns if isinstance(max_turns, int) else max(1, count)
    answer = services.first("confirm_continuation",
                            budget=IterationBudget(CHAT_TURNS, ceiling, count),
                            context={"kind": "chat_turn_limit", "session_id": session_id,
                                     "turn_count": count, "max_turns": max_turns})
    return answer is True


class ChatTurnGate:
    """A chat session's turn limit during one run (the turn runner's ``turn_gate``).

    Called after every provider answer: counts the turn and, at the limit, asks
    ``confirm_continuation`` (True: the count starts again; otherwise the session is aborted and
    the run stops). :meth:`write` records that in the turn's own transaction.
    """

    def __init__(self, services: Services, session: ChatSession, *, create: bool,
                 pause: bool = False, token_name: str | None = None) -> None:
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
        self.notice = _notice(session.id, session.max_turns)
        self._reset = False

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
            confirmed = _confirmed(self.services, self.session_id, self.count, self.max_turns)
        except Exception as exc:
            raise HookFailed(str(exc)) from exc
        writer.write("answer a chat session's turn limit",
                     lambda conn, now: record_limit_answer(conn, self.session_id,
                                                           confirmed=confirmed, now=now))
        if confirmed:
            self.count = 0
        return confirmed

    def __call__(self, turn: int) -> bool:
        self.count += 1
        self._reset = False
        if self.max_turns == "unlimited" or self.count < self.max_turns:
            return True
        if self.pause:
            self.pending = {"kind": "chat_turn_limit", "budget": CHAT_TURNS, "tool_call": None}
            return True
        if _confirmed(self.services, self.session_id, self.count, self.max_turns):
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


def contention_result(services: Services, session_id: str, mode: str, provider: str | None,
                      model: str | None, payload: Mapping[str, Any] | None) -> ConversationResult:
    """What a run on a session another run holds returns (it did not run), with the events a
    run emits: ``transcript_lock_contention`` and the terminal ``completed``."""
    emit_outside_run(services, payload, "transcript_lock_contention",
                     {"mode": mode, "session_id": session_id})
    try:
        earlier = services.transcripts.summary(session_id).cumulative_turn_count
    except TranscriptNotFound:
        earlier = 0
    result = ConversationResult(
        status="transcript_lock_contention", completed=False,
        error=f"Session {session_id!r} is busy with another run; retry when it ends.",
        error_code="transcript_lock_contention", transcript_session_id=session_id,
        cumulative_turn_count=earlier, mode=mode, provider=provider or "", model=model or "")
    emit_outside_run(services, payload, "completed", _terminal(result, mode))
    return result


class HookFailed(Exception):
    """``confirm_continuation`` raised while a session at its limit was asked before a run."""

    code = "budget_hook_failed"


def failed_before_run(services: Services, session_id: str, exc: Exception, mode: Any,
                      provider: str | None, model: str | None,
                      payload: Mapping[str, Any] | None) -> ConversationResult:
    """What a run returns when it failed before its loop started (its lock lost while a person
    answered the limit's question, or the question's hook raised), with its terminal event."""
    label = mode if isinstance(mode, str) else ",".join(mode)
    cause = exc.__cause__ if isinstance(exc, HookFailed) and exc.__cause__ else exc
    result = ConversationResult(
        status="error", completed=False, error=str(cause) or type(cause).__name__,
        error_code=str(getattr(exc, "code", "error")), transcript_session_id=session_id,
        mode=label, provider=provider or "", model=model or "")
    emit_outside_run(services, payload, "failed", {**_terminal(result, label),
                                                   "session_id": session_id})
    return result


def chat_message(message: Any) -> list[dict[str, Any]]:
    """``message`` as the one user message a chat run adds (a non-empty string)."""
    if not isinstance(message, str) or not message.strip():
        raise UsageError("message must be a non-empty string.")
    return [{"role": "user", "content": message}]


def check_session_payload(payload: Mapping[str, Any] | None) -> RuntimeOptions:
    """The run's runtime options; a chat session is stored by the host, never by the payload's
    store."""
    _, runtime = split_payload(payload)
    if runtime.transcript_persister is not None or runtime.transcript_lock is not None:
        raise UsageError("A chat session is stored by the host: leave transcript_persister "
                         "and transcript_lock out of a chat run's payload.")
    return runtime


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
    turn) and SessionAborted; returns a ``transcript_lock_contention`` result, without running,
    when another run holds the session.
    """
    runtime = check_session_payload(payload)
    ttl = runtime.transcript_lock_ttl
    existing = _exists(services, session_id, create)
    store = services.transcripts
    token = store.acquire(session_id, ttl)
    if token is None:
        label = mode if isinstance(mode, str) else ",".join(mode)
        return contention_result(services, session_id, label, provider, model, payload)
    try:
        session = _session_under_lock(services, session_id, existing)
    except BaseException:  # aborted meanwhile (SessionAborted): give the lock back
        store.release(session_id, token)
        raise
    gate = ChatTurnGate(services, session, create=not existing,
                        pause=confirmation_mode(services, runtime) == "pause",
                        token_name=runtime.token_name)
    writer = store.open_writer(session_id, token, ttl, on_turn=gate.write)
    try:
        if gate.pause and gate.at_limit:
            return pause_before_run(services, gate, writer, new_messages, tools,
                                    services.default_provider(provider),
                                    services.default_model(model), mode, payload)
        if not gate.open(writer):
            return abort_before_run(services, session, writer, payload)
        run = ConversationRun.create(
            services, [*writer.history(), *new_messages], tools,
            services.default_provider(provider), services.default_model(model), mode,
            {**(payload or {}), "transcript_session_id": session_id}, max_turns, False,
            writer=writer, turn_gate=gate, cumulative_base=writer.stored_turns(),
            on_text=on_text)
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


def _session_under_lock(services: Services, session_id: str, existing: bool) -> ChatSession:
    if existing:
        session = services.chat_sessions.require_active(session_id)
        refuse_if_paused(services, session_id)
        return session
    return ChatSession(id=session_id, turn_count=0, status="active",
                       max_turns=services.chat_sessions.default_max_turns(),
                       created_at=0.0, updated_at=0.0)


def refuse_if_paused(services: Services, session_id: str) -> None:
    """A session whose run waits for a person takes nothing new until it is answered (read
    under the session's lock)."""
    try:
        stored = services.transcripts.summary(session_id)
    except TranscriptNotFound:
        return
    pending = stored_pending(stored.status, stored.result)
    if pending is not None:
        raise SessionAwaitingConfirmation(
            f"Session {session_id!r} is paused: {pending_warning(pending)}",
            session_id=session_id, pending=pending)


def settle_without_run(services: Services, writer: TranscriptWriter, messages: list[Message],
                       result: ConversationResult,
                       payload: Mapping[str, Any] | None) -> ConversationResult:
    """Store ``messages`` and ``result`` for a run decided before any turn (paused at a limit,
    declined on resume), and emit its terminal event."""
    request = {"provider": result.provider or None, "model": result.model or None,
               "mode": result.mode}
    writer.begin(messages, request)
    writer.persist(messages, request, result)
    emit_outside_run(services, payload, "completed",
                     {**_terminal(result, result.mode), "session_id": writer.session_id})
    return result


def pause_before_run(services: Services, gate: ChatTurnGate, writer: TranscriptWriter,
                     new_messages: list[dict[str, Any]], tools: Any, provider: str,
                     model: str, mode: Any, payload: Mapping[str, Any] | None
                     ) -> ConversationResult:
    """A message to a session already at its limit, with ``confirmation="pause"``: the
    message is stored and the run waits for ``resume`` before its first turn."""
    label = mode if isinstance(mode, str) else ",".join(mode)
    offered = normalize_tools(tools)
    pause_id = uuid.uuid4().hex
    pending = {"kind": "chat_turn_limit", "budget": CHAT_TURNS, "tool_call": None,
               "tool_calls": [], "tools": sorted(offered), "pause_id": pause_id}
    messages = [*(Message(**m) for m in writer.history()),
                *(Message(**m) for m in new_messages)]
    result = ConversationResult(
        messages=messages, status="awaiting_confirmation", completed=False,
        budget=CHAT_TURNS, warning=pending_warning(pending), pending=pending,
        cumulative_turn_count=writer.stored_turns(), transcript_session_id=gate.session_id,
        mode=label, provider=provider, model=model)
    clean, runtime = split_payload(payload)
    settle_without_run(services, writer, messages, result, payload)
    paused_runs(services).keep(gate.session_id, PausedRun(
        tools=offered, payload=kept_payload(clean, runtime), pause_id=pause_id))
    return result


def abort_before_run(services: Services, session: ChatSession, writer: TranscriptWriter,
                      payload: Mapping[str, Any] | None) -> ConversationResult:
    """The result of a run declined at the limit before it started (the gate aborted it)."""
    result = ConversationResult(
        messages=[Message(**m) for m in writer.history()], status="aborted", completed=False,
        turn_count=0, cumulative_turn_count=writer.stored_turns(),
        warning=_notice(session.id, session.max_turns), transcript_session_id=session.id,
        mode="chat")
    emit_outside_run(services, payload, "completed", {**_terminal(result, "chat"),
                                                      "session_id": session.id})
    return result


def _terminal(result: ConversationResult, mode: str) -> dict[str, Any]:
    return {"mode": mode, **terminal_payload(result)}
