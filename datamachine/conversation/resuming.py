"""Going on from a stored transcript: ``continue_conversation`` and ``resume``.

**Continue** (headless "+N turns", DESIGN.md section 10) runs on the stored transcript of a
session, so the model keeps its full context, and reports the run's own ``turn_count`` next to
the session's ``cumulative_turn_count``. On a chat session its turns count toward the session's
limit, exactly as a chat's do.

**Resume** is a person's answer to a paused run (DESIGN.md 16). A run with
``confirmation="pause"`` stopped ``awaiting_confirmation`` and stored what it waits for
(``pending``) with its transcript; it holds no lock. Resuming reads the transcript and its
``pending`` under the lock (so of two resumes at once one runs and the other gets
``transcript_lock_contention``, and a session answered already is refused with
:class:`~datamachine.errors.SessionNotPaused`), and continues the same transcript with the same
counts:

- a spent budget: approved, it is extended (``extend_by``, else what the run would have added)
  and the run goes on; declined, the run stops ``budget_exceeded`` (with its final summary);
- a chat session's turn limit: approved, the count starts again; declined, the session is
  aborted and the calls that waited are stored as refused;
- a tool that ``requires_approval``: approved, it runs (exactly once) and the run goes on;
  declined, the model reads that it was declined and the run goes on.

Both take the session's lock before they read it (:mod:`.sessions`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from agents_api import LockLost, Message
from agents_api.drive import Steps
from agents_api.jsontext import plain_json, unreadable
from datamachine.conversation.chat import ChatTurnGate, chat_gate
from datamachine.conversation.conversation_run import ConversationRun
from datamachine.conversation.pausing import (
    CONFIRMATION_SETTING,
    Resumption,
    paused_runs,
    stored_pending,
)
from datamachine.conversation.result import ConversationResult
from datamachine.conversation.sessions import (
    HookFailed,
    abort_before_run,
    check_session_payload,
    contention_result,
    failed_before_run,
    limit_stop,
    pause_before_run,
    refuse_if_paused,
    settle_without_run,
    unsettled_plan,
)
from datamachine.conversation.spec import normalize_tools
from datamachine.errors import CallNotInDoubt, SessionNotPaused, UsageError
from datamachine.payload_keys import DEFAULT_LOCK_TTL
from datamachine.registry import MAX_METERED_VALUE, validate_budget_value
from datamachine.storage.chat_sessions import record_limit_answer
from datamachine.storage.transcript_writer import TranscriptWriter
from datamachine.storage.transcripts import Transcript
from datamachine.tools import Tool
from datamachine.tools.in_doubt import InDoubt, in_doubt_failure, waiting_calls
from datamachine.tools.results import REJECTED

if TYPE_CHECKING:
    from datamachine.host import Services

__all__ = ["TranscriptFinished", "check_recorded_modes", "continuation_steps", "resolve_steps",
           "resume_steps"]


class TranscriptFinished(Exception):
    """The transcript to continue was finished by another run (see ``unfinished_only``)."""

    def __init__(self, record: Any) -> None:
        super().__init__(f"transcript {getattr(record, 'id', '?')} is finished")
        self.record = record


def continuation_steps(
    services: Services,
    session_id: str,
    extend_by: int,
    tools: Any = None,
    provider: str | None = None,
    model: str | None = None,
    *,
    output_type: Any = None,
    payload: Mapping[str, Any] | None = None,
    lock_ttl: int = DEFAULT_LOCK_TTL,
    unfinished_only: Callable[[Any], bool] | None = None,
) -> Steps[ConversationResult]:
    """Run at most ``extend_by`` more provider turns on a stored transcript (as steps).

    Provider, model and mode default to those recorded with the transcript. ``tools=None``
    runs with no tools; pass them again to keep them. A transcript left interrupted by a crash
    continues the same way. Another run on the session: ``transcript_lock_contention``; a
    paused one: :class:`~datamachine.errors.SessionAwaitingConfirmation` (answer it with
    ``resume``). ``payload``: more of the run's payload (a queued job's ``job_id`` and
    options); ``lock_ttl``: the transcript lock's TTL for this run. ``unfinished_only``: a test
    of the stored transcript (read under the lock); when it fails, nothing runs and
    :class:`TranscriptFinished` carries the stored record (a queued job's transcript that
    another attempt finished meanwhile).
    """
    validate_budget_value("extend_by", extend_by)
    store = services.transcripts
    known = store.summary(session_id)  # an unknown id fails before any write
    token = store.acquire(session_id, lock_ttl)
    if token is None:
        return contention_result(services, session_id, known.mode or "pipeline", provider,
                                 model, None)
    try:
        refuse_if_paused(services, session_id)
        gate = chat_gate(services, session_id,
                         pause=services.settings.get(CONFIRMATION_SETTING) == "pause")
    except BaseException:  # aborted or paused: give the lock back
        store.release(session_id, token)
        raise
    writer = store.open_writer(session_id, token, lock_ttl,
                               on_turn=gate.write if gate is not None else None)
    try:
        record = store.get_transcript(session_id)  # read now that nothing can change it
        if unfinished_only is not None and not unfinished_only(record):
            raise TranscriptFinished(record)
        if gate is not None and gate.pause and gate.at_limit:
            return pause_before_run(services, gate, writer, [], tools,
                                    provider or record.provider or services.default_provider(None),
                                    model if model is not None else (record.model or ""),
                                    record.mode or "chat", None)
        if gate is not None and not gate.open(writer):
            return abort_before_run(services, gate, writer, None)
        check_recorded_modes(record.mode, services.modes)
        run = ConversationRun.create(
            services, record.messages, tools,
            provider or record.provider or services.default_provider(None),
            model if model is not None else (record.model or ""), record.mode or "pipeline",
            {**(payload or {}), "transcript_session_id": session_id,
             **({"output_type": output_type} if output_type is not None else {})},
            extend_by, writer=writer, turn_gate=gate,
            cumulative_base=record.cumulative_turn_count,
            in_doubt=unsettled_plan(services, writer))
        return (yield from run.steps())
    except (LockLost, HookFailed) as exc:  # at the limit's question, before the run
        return failed_before_run(services, session_id, exc, known.mode or "pipeline", provider,
                                 model, None)
    finally:
        writer.release()  # the run frees the lock itself; this covers the paths before it


def check_recorded_modes(recorded: str | None, known: Mapping[str, str]) -> None:
    """A transcript recorded in a mode no plugin declares now (its plugin was removed) cannot
    go on as it was: say that it is the *recorded* mode, and what to do."""
    missing = [mode for mode in (recorded or "").split(",") if mode and mode not in known]
    if missing:
        raise UsageError(
            f"This transcript was recorded in mode {recorded!r}, and no loaded plugin declares "
            f"{', '.join(map(repr, missing))} now (known modes: {', '.join(sorted(known))}). "
            "Install the plugin that declares it (or check DATAMACHINE_LOAD_PLUGINS) to continue "
            "the run.")


def resume_steps(services: Services, session_id: str, approve: bool,
                 extend_by: int | None = None, tools: Any = None,
                 payload: dict[str, Any] | None = None, *,
                 pause_id: str | None = None) -> Steps[ConversationResult]:
    """Answer the paused run of ``session_id`` and continue it (as steps; see the module).

    ``tools=None``: the paused run's tools, by name (those this process still holds, else the
    host's registered tools). ``payload``: runtime options for the resumed run (an
    ``event_sink``, a ``script``) over those the paused run kept in this process.
    ``pause_id``: answer only that pause (read under the lock), else SessionNotPaused.
    """
    _check_arguments(session_id, approve, extend_by)
    if pause_id is not None and not isinstance(pause_id, str):
        raise UsageError(f"pause_id must be the pause's id (result.pending['pause_id']), got "
                         f"{type(pause_id).__name__}.")

    def read(record: Transcript) -> dict[str, Any]:
        pending = _pending(record)
        if pause_id is not None and pending.get("pause_id") != pause_id:
            raise SessionNotPaused(
                f"Session {session_id!r} is waiting for the answer to "
                + (f"pause {pending['pause_id']!r}" if pending.get("pause_id")
                   else "a pause stored without an id (answer it without pause_id)")
                + f", not {pause_id!r}: that one was answered and paused again, or the id is "
                "wrong. Read its pending question again (result.pending['pause_id']) before "
                "answering.",
                session_id=session_id, status=record.status)
        return pending

    def answer(record: Transcript, pending: dict[str, Any] | None, gate: ChatTurnGate | None,
               writer: TranscriptWriter) -> Steps[ConversationResult]:
        assert pending is not None
        kept = paused_runs(services).get(session_id, pending.get("pause_id"))
        offered = _tools(services, pending, tools, kept.tools if kept is not None else None)
        run_payload = {**(kept.payload if kept is not None else {}), "confirmation": "pause",
                       **(payload or {}), "transcript_session_id": session_id}
        in_doubt = unsettled_plan(services, writer)
        resumption = _answer(writer, record, pending, gate, approve, extend_by,
                             in_doubt if in_doubt is not None
                             and _answered_already(pending, in_doubt) else None)
        if resumption is None:  # declined at a chat limit: the session is aborted
            assert gate is not None
            return _declined_limit(services, writer, record, pending, gate, run_payload,
                                   in_doubt)
        run = _going_on(services, record, offered, run_payload, writer, gate, resumption,
                        in_doubt)
        return (yield from run.steps())

    return (yield from _answering(services, session_id, payload, read, answer))


def resolve_steps(services: Services, session_id: str, call_id: str, result: Any,
                  tools: Any = None, payload: dict[str, Any] | None = None
                  ) -> Steps[ConversationResult]:
    """Record what an in-doubt call did (``result``, as the tool would have returned it) and go
    on like ``resume`` (as steps): the call is settled without running, the session's other
    unsettled calls are handled as a run that goes on handles them, then the model reads the
    result. The session may be paused on the call (``pending.kind == "tool_in_doubt"``) or
    only left unsettled by a run that died. ``tools=None``: the paused run's tools by name
    (none for a session that is not paused). Raises :class:`CallNotInDoubt` when the call's
    outcome is not in doubt.
    """
    _check_resolve(session_id, call_id, result)

    def read(record: Transcript) -> dict[str, Any] | None:
        return stored_pending(record.status, record.result)

    def record_it(record: Transcript, pending: dict[str, Any] | None,
                  gate: ChatTurnGate | None,
                  writer: TranscriptWriter) -> Steps[ConversationResult]:
        in_doubt = unsettled_plan(services, writer)
        if in_doubt is None or not in_doubt.waits(call_id):
            found = in_doubt.call_ids() if in_doubt is not None else []
            raise CallNotInDoubt(
                f"Call {call_id!r} of session {session_id!r} is not in doubt: its result is "
                "stored, or it never stored an intent. "
                + (f"Calls in doubt there: {', '.join(found)}." if found
                   else "No call of that session is in doubt."),
                session_id=session_id, call_id=call_id, in_doubt=found)
        in_doubt.resolved[call_id] = result
        kept = (paused_runs(services).get(session_id, pending.get("pause_id"))
                if pending is not None else None)
        offered = (_tools(services, pending, tools, kept.tools if kept is not None else None)
                   if pending is not None else normalize_tools(tools))
        run_payload = {**(kept.payload if kept is not None else {}), "confirmation": "pause",
                       **(payload or {}), "transcript_session_id": session_id}
        # The resolved call first: another call that pauses again must not leave the
        # answer unused.
        first = [intent for intent in in_doubt.intents if intent.call_id == call_id][:1]
        calls = waiting_calls([*first, *(i for i in in_doubt.intents if i not in first)],
                              tuple(dict(call) for call in (pending or {}).get("tool_calls")
                                    or ()))
        resumption = Resumption(budgets=record.budgets if pending is not None else {},
                                pending_calls=calls)
        run = _going_on(services, record, offered, run_payload, writer, gate, resumption,
                        in_doubt)
        return (yield from run.steps())

    return (yield from _answering(services, session_id, payload, read, record_it))


PendingT = TypeVar("PendingT", bound="dict[str, Any] | None")


def _answering(services: Services, session_id: str, payload: dict[str, Any] | None,
               read: Callable[[Transcript], PendingT],
               go_on: Callable[[Transcript, PendingT, ChatTurnGate | None, TranscriptWriter],
                               Steps[ConversationResult]]) -> Steps[ConversationResult]:
    """A person's answer to a session, under its lock: take the lock (contention: a result,
    nothing run), ``read`` the stored record (it may refuse: the lock is given back), open the
    writer, and ``go_on``; a lock lost while the answer is written ends it as a failed run."""
    ttl = check_session_payload(payload).transcript_lock_ttl
    store = services.transcripts
    known = store.summary(session_id)  # an unknown id fails before any write
    token = store.acquire(session_id, ttl)
    if token is None:
        return contention_result(services, session_id, known.mode or "pipeline", None, None,
                                 payload)
    try:
        record = store.get_transcript(session_id)  # read now that nothing can change it
        found = read(record)
        gate = chat_gate(services, session_id, pause=True)
    except BaseException:  # not paused, or an aborted chat session: give the lock back
        store.release(session_id, token)
        raise
    writer = store.open_writer(session_id, token, ttl,
                               on_turn=gate.write if gate is not None else None)
    try:
        return (yield from go_on(record, found, gate, writer))
    except (LockLost, HookFailed) as exc:  # the lock was lost while the answer was written
        return failed_before_run(services, session_id, exc, record.mode or "pipeline",
                                 record.provider, record.model, payload)
    finally:
        writer.release()  # the run frees the lock itself; this covers the paths before it


def _going_on(services: Services, record: Transcript, tools: dict[str, Tool],
              payload: dict[str, Any], writer: TranscriptWriter, gate: ChatTurnGate | None,
              resumption: Resumption, in_doubt: InDoubt | None) -> ConversationRun:
    """The run that goes on from the answered session, as it was recorded (without the tools
    its paused run's loop guard took away)."""
    hidden = (stored_pending(record.status, record.result) or {}).get("hidden_tools")
    if isinstance(hidden, list) and hidden:
        resumption = replace(resumption, hidden_tools=tuple(str(name) for name in hidden))
    run = ConversationRun.create(
        services, record.messages, tools, record.provider or services.default_provider(None),
        record.model or "", record.mode or "pipeline", payload, None, False, writer=writer,
        turn_gate=gate, cumulative_base=record.cumulative_turn_count, resumption=resumption,
        in_doubt=in_doubt)
    paused_runs(services).forget(record.id)
    return run


def _check_resolve(session_id: object, call_id: object, result: object) -> None:
    if not isinstance(session_id, str) or not session_id.strip():
        raise UsageError("session_id must be the id of the session whose call is in doubt "
                         "(a non-empty string).")
    if not isinstance(call_id, str) or not call_id:
        raise UsageError("call_id must be the id of the call in doubt (a non-empty string: "
                         "result.pending['tool_call']['id']).")
    if result is None:
        raise UsageError("result must say what the call did (what the tool would have "
                         "returned: a string or a dict), not None.")
    # It is stored as the call's result and read back by every later run: plain JSON data.
    try:
        plain_json(result)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"result must be JSON data (a string, a number, a list or a dict); "
                         f"it cannot be written as JSON: {exc}.") from None
    problem = unreadable(result)
    if problem is not None:
        raise UsageError(f"result{problem[0]}: {problem[1]}; store what the call did as "
                         "plain JSON data.")


def _check_arguments(session_id: object, approve: object, extend_by: object) -> None:
    if not isinstance(session_id, str) or not session_id.strip():
        raise UsageError("session_id must be the id of a paused session (a non-empty string).")
    if not isinstance(approve, bool):
        raise UsageError(f"approve must be True (go on) or False (stop), got {approve!r}.")
    if extend_by is not None:  # up to 10^12: the paused budget may count tokens or money
        validate_budget_value("extend_by", extend_by, maximum=MAX_METERED_VALUE)


def _pending(record: Transcript) -> dict[str, Any]:
    pending = stored_pending(record.status, record.result)
    if pending is None:
        raise SessionNotPaused(
            f"Session {record.id!r} is not waiting for an answer (its status is "
            f"{record.status!r}); send it a new message, or continue it with "
            "continue_conversation.", session_id=record.id, status=record.status)
    return pending


def _tools(services: Services, pending: Mapping[str, Any], given: Any,
           held: dict[str, Tool] | None) -> dict[str, Tool]:
    """The resumed run's tools: ``given``, else the paused run's (by name)."""
    if given is not None:
        return normalize_tools(given)
    names = [str(name) for name in pending.get("tools") or ()]
    registered = services.tools.tools()
    found: dict[str, Tool] = {}
    for name in names:
        tool = (held or {}).get(name) or registered.get(name)
        if tool is not None:
            found[name] = tool
    missing = [name for name in names if name not in found]
    if missing:
        raise UsageError(
            f"The paused run offered tools this process does not have: {', '.join(missing)}; "
            "pass them again with resume(..., tools=...).")
    return found


def _answer(writer: TranscriptWriter, record: Transcript, pending: Mapping[str, Any],
            gate: ChatTurnGate | None, approve: bool, extend_by: int | None,
            spent: InDoubt | None = None) -> Resumption | None:
    """Apply the answer; how the run resumes, or None for a chat limit declined.

    ``spent``: the calls a run this question's earlier answer started left in doubt when it
    died (see :func:`_answered_already`): they come first, and an answer about a call does
    not apply to them (they are asked anew); a budget's or a limit's answer still does."""
    budgets = record.budgets
    waiting = tuple(dict(call) for call in pending.get("tool_calls") or ())
    if spent is not None:
        waiting = waiting_calls(spent.intents, waiting)
    kind = pending.get("kind")
    if kind == "chat_turn_limit" and gate is not None:
        writer.write("answer a chat session's turn limit",
                     lambda conn, now: record_limit_answer(conn, gate.session_id,
                                                           confirmed=approve, now=now))
        gate.answered(approve)
        if not approve:
            return None
        return Resumption(budgets=budgets, pending_calls=waiting)
    if kind in ("tool_approval", "tool_in_doubt") and spent is not None:
        return Resumption(budgets=budgets, pending_calls=waiting)
    if kind in ("tool_approval", "tool_in_doubt"):
        call = pending.get("tool_call") or {}
        call_id = str(call.get("id") or "")
        return Resumption(budgets=budgets, pending_calls=waiting,
                          approved_call=call_id if approve else None,
                          declined_call=None if approve else call_id,
                          approval_id=str(pending.get("pause_id") or "") or None)
    name = str(pending.get("budget") or "")
    if not approve:
        return Resumption(budgets=budgets, declined_budget=name)
    by = extend_by or pending.get("extend_by") or budgets.get(name, {}).get("ceiling") or 1
    return Resumption(budgets=budgets, pending_calls=waiting, extend=(name, int(by)))


def _answered_already(pending: Mapping[str, Any], in_doubt: InDoubt) -> bool:
    """Whether the stored question was answered already and the run that answer started died
    with calls unsettled: every question but an in-doubt one is settled before any call
    runs, and an in-doubt question whose approval an intent carries was used up."""
    if pending.get("kind") != "tool_in_doubt":
        return True
    pause_id = pending.get("pause_id")
    return any(intent.approval == pause_id for intent in in_doubt.intents)


def _declined_limit(services: Services, writer: TranscriptWriter, record: Transcript,
                    pending: Mapping[str, Any], gate: ChatTurnGate,
                    payload: Mapping[str, Any],
                    in_doubt: InDoubt | None = None) -> ConversationResult:
    """The session is aborted; the calls that waited are stored as refused, never run, and
    a call a dead run left in doubt is stored as in doubt (it may have run)."""
    messages = [Message(**m) for m in record.messages]
    refused: list[dict[str, Any]] = []
    waiting = tuple(dict(call) for call in pending.get("tool_calls") or ())
    if in_doubt is not None:
        waiting = waiting_calls(in_doubt.intents, waiting)
    for call in waiting:
        name, call_id = str(call.get("name")), str(call.get("id"))
        parameters, turn = call.get("parameters"), int(call.get("turn") or 0)
        refusal: dict[str, Any] = (
            in_doubt_failure(in_doubt.take(call_id), "the session was aborted at its limit")
            if in_doubt is not None and in_doubt.waits(call_id) else
            {"success": False, "error_type": "session_aborted", REJECTED: True,
             "error": f"Tool '{name}' was not run: {gate.notice}", "tool_name": name,
             "parameters": parameters})
        messages += [Message.tool_call(name, parameters, turn, call_id),
                     Message.tool_result(name, refusal, turn, call_id, refusal["error"])]
        refused.append({"id": call_id, "name": name, "parameters": parameters})
    result = ConversationResult(
        messages=messages, status="aborted", completed=False, warning=gate.notice,
        final_content=gate.notice, last_tool_calls=refused,
        cumulative_turn_count=record.cumulative_turn_count,
        transcript_session_id=record.id, mode=record.mode or "chat",
        provider=record.provider or "", model=record.model or "", **limit_stop(gate))
    paused_runs(services).forget(record.id)
    return settle_without_run(services, writer, messages, result, payload)
