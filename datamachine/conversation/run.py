"""``run_conversation``: the product adapter over the generic loop (DESIGN.md section 5).

It validates every argument before anything runs, takes the runtime objects out of the payload,
resolves budgets through the registry (reporting clamps), builds the turn runner and the tool
executor, runs ``agents_api``'s loop, and maps the loop's outcome onto one
:class:`ConversationResult`. The loop owns mechanics; this module owns policy.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol, cast

from agents_api import (
    InvalidMessage,
    IterationBudget,
    LoopResult,
    Message,
    TurnResult,
    normalize_messages,
)
from agents_api.construct import assign, construct
from agents_api.loop import arun_loop, run_loop
from datamachine.completion.controller import CompletionRun
from datamachine.conversation.exhaustion import make_final_summary
from datamachine.conversation.modes import normalize_modes
from datamachine.conversation.payload import RuntimeOptions, base_log_context, split_payload
from datamachine.conversation.pressure import PressureTracker, parse_budget_pressure
from datamachine.conversation.result import ConversationResult
from datamachine.conversation.timeouts import resolve_timeouts
from datamachine.conversation.turns import ProviderTurnRunner
from datamachine.errors import UsageError
from datamachine.host import Host
from datamachine.registry import validate_budget_value

__all__ = ["PreparedRun", "arun_conversation_on", "prepare_run", "run_conversation_on"]

logger = logging.getLogger("datamachine.conversation")

TURN_BUDGET = "conversation_turns"
TOOL_BUDGET = "tool_calls"


class PreparedRun:
    """Everything one run needs, validated and resolved before the first provider call."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    host: Host
    messages: list[Message]
    tools: dict[str, Any]
    provider_name: str
    model: str
    mode: str
    modes: list[str]
    payload: dict[str, Any]
    runtime: RuntimeOptions
    turn_budget: IterationBudget
    budgets: list[IterationBudget]
    warnings: list[str]
    runner: ProviderTurnRunner
    executor: Any
    emit: RunEmitter
    session_id: str | None
    persister: Any
    lock: Any
    single_turn: bool
    settle: Callable[[ConversationResult], None] | None = None
    final: ConversationResult | None = None
    completion: CompletionRun


def _normalize_tools(tools: object) -> dict[str, Any]:
    from datamachine.tools import Tool

    if tools is None:
        return {}
    items: list[tuple[str | None, object]]
    if isinstance(tools, Mapping):
        items = list(tools.items())
    elif isinstance(tools, list | tuple):
        items = [(None, t) for t in tools]
    else:
        raise UsageError(
            f"tools must be a dict of name -> Tool or a list of Tool, got {type(tools).__name__}."
        )
    normalized: dict[str, Any] = {}
    for key, candidate in items:
        if not isinstance(candidate, Tool):
            where = f"tools[{key!r}]" if key is not None else "tools"
            raise UsageError(
                f"{where} must be a datamachine.Tool (build one with Tool(...) or "
                f"@datamachine.tool), got {type(candidate).__name__}."
            )
        if key is not None and key != candidate.name:
            raise UsageError(
                f"tools[{key!r}] is a Tool named {candidate.name!r}; use the same name."
            )
        if candidate.name in normalized:
            raise UsageError(f"tools lists {candidate.name!r} twice.")
        normalized[candidate.name] = candidate
    return normalized


class RunEmitter(Protocol):
    """A run's ``emit(event, payload)``: to the payload's sink and the ``on_loop_event`` hook.

    ``active`` is False when neither exists: then nothing is built per event, and the loop is
    given no sink at all.
    """

    active: bool

    def __call__(self, event: str, payload: dict[str, Any]) -> None:
        """Deliver one event (with the run's base log context) to every listener."""


def run_emitter(host: Host, runtime: RuntimeOptions, base: dict[str, Any]) -> RunEmitter:
    """The :class:`RunEmitter` of one run.

    A closure rather than an object with ``__call__``: calling an instance looks ``__call__``
    up and binds it on every call, and a run emits several events per turn.
    """
    sink = runtime.event_sink
    if sink is not None and not callable(sink):
        sink = sink.emit
    caller = host.pm.hook.on_loop_event
    hook = caller if caller.get_hookimpls() else None

    def emit(event: str, payload: dict[str, Any]) -> None:
        if sink is None and hook is None:
            return
        data = {**base, **payload}
        if sink is not None:
            try:
                sink(event, data)
            except Exception:
                logger.warning("datamachine: event sink failed on %r", event, exc_info=True)
        if hook is not None:
            try:
                hook(event=event, payload=data)
            except Exception:
                logger.warning("datamachine: on_loop_event hook failed on %r", event,
                               exc_info=True)

    emit.active = sink is not None or hook is not None  # type: ignore[attr-defined]
    emit.never_raises = True  # type: ignore[attr-defined]  # the loop calls it unguarded
    return cast(RunEmitter, emit)


def emit_outside_run(host: Host, payload: Mapping[str, Any] | None, event: str,
                     data: dict[str, Any]) -> None:
    """Emit an event for a run that never reached the loop (the payload's sink and the hook)."""
    _, runtime = split_payload(payload)
    run_emitter(host, runtime, {})(event, data)


def prepare_run(
    host: Host,
    messages: Any,
    tools: Any,
    provider: Any,
    model: Any,
    mode: Any = "pipeline",
    payload: Any = None,
    max_turns: Any = None,
    single_turn: Any = False,
) -> PreparedRun:
    """Validate and resolve a run; every bad argument raises a UsageError naming it."""
    try:
        normalized = normalize_messages(messages)
    except InvalidMessage as exc:
        raise UsageError(f"messages: {exc}") from None
    if not isinstance(provider, str) or not provider.strip():
        raise UsageError(f"provider must be a provider name such as 'scripted', got {provider!r}.")
    if model is None:
        model = ""
    if not isinstance(model, str):
        raise UsageError(f"model must be a string (the provider's model id), got {model!r}.")
    if not isinstance(single_turn, bool):
        raise UsageError(f"single_turn must be True or False, got {single_turn!r}.")
    if max_turns is not None:
        validate_budget_value("max_turns", max_turns)
    modes = normalize_modes(mode)
    clean_payload, runtime = split_payload(payload)
    tool_map = _normalize_tools(tools)
    completion = CompletionRun.prepare(host, modes, clean_payload, runtime, tool_map)
    tool_map = completion.tools  # plus report_blocker when assertions are configured
    provider_obj: Any = host.providers.get(provider)
    start_run = getattr(provider_obj, "start_run", None)
    if callable(start_run):
        provider_obj = start_run(runtime.script) if runtime.script is not None else start_run()
    elif runtime.script is not None:
        raise UsageError(
            f"payload['script'] only applies to the scripted provider, not {provider!r}."
        )

    warnings: list[str] = []
    turn_budget = host.budgets.create(TURN_BUDGET, ceiling_override=max_turns, warnings=warnings)
    budgets = [host.budgets.create(TOOL_BUDGET, warnings=warnings)]
    max_seconds = runtime.max_seconds
    if max_seconds is None:
        setting = host.settings.get("max_run_seconds")
        if setting is not None:
            if isinstance(setting, bool) or not isinstance(setting, int | float) or setting <= 0:
                raise UsageError("setting 'max_run_seconds' must be a positive number of seconds.")
            max_seconds = setting
    if max_seconds is not None:
        # The wall clock is a hard rail: its hard ceiling equals its ceiling, so it is never
        # offered for extension, and its time rail keeps fractions of a second.
        seconds = max(1, math.ceil(max_seconds))
        budgets.append(IterationBudget("wall_clock_seconds", seconds, hard_ceiling=seconds,
                                       max_seconds=float(max_seconds)))

    mode_label = ",".join(modes)
    base = base_log_context(mode_label, clean_payload)
    emit = run_emitter(host, runtime, base)
    timeouts = resolve_timeouts(host, mode_label, provider, model, clean_payload)
    runner = ProviderTurnRunner(
        host, provider=provider_obj, provider_name=provider, model=model, mode=mode_label,
        tools=[t.to_provider_dict() for t in tool_map.values()], payload=clean_payload,
        timeouts=timeouts, emit=emit, single_turn=single_turn,
        pressure=_pressure(host, runtime, emit),
        tools_json="[" + ", ".join(t.provider_json() for t in tool_map.values()) + "]",
    )
    from datamachine.tools import ToolExecutor

    # Built even without tools: a model that calls a tool anyway reads "not found", and bad
    # tool_runtime_rules are refused before the run starts.
    executor = ToolExecutor(
        tool_map, mode=mode_label, payload=clean_payload,
        engine_data=clean_payload.get("engine_data"), registry=host.budgets,
        runtime_rules=runtime.tool_runtime_rules, warnings=warnings, host=host,
    )

    persister = runtime.transcript_persister
    lock = runtime.transcript_lock
    if persister is None and runtime.persist_transcript:
        persister = host.transcripts
        if lock is None:
            lock = host.transcripts
    session_id = runtime.transcript_session_id
    if session_id is None and persister is not None:
        session_id = uuid.uuid4().hex
    return PreparedRun(
        host=host, messages=normalized, tools=tool_map, provider_name=provider, model=model,
        mode=mode_label, modes=modes, payload=clean_payload, runtime=runtime,
        turn_budget=turn_budget, budgets=budgets, warnings=warnings, runner=runner,
        executor=executor, emit=emit, session_id=session_id, persister=persister, lock=lock,
        single_turn=single_turn, completion=completion,
    )


def _pressure(host: Host, runtime: RuntimeOptions, emit: Any) -> PressureTracker | None:
    rules = parse_budget_pressure(runtime.budget_pressure, host.settings.get("budget_pressure"))
    return None if rules is False else PressureTracker(rules, emit)


def _confirm_extension(run: PreparedRun) -> Any:
    """``on_budget_exhausted``: ask ``confirm_continuation``; extend by the original ceiling."""
    original = {b.name(): b.ceiling() for b in (run.turn_budget, *run.budgets)}

    def on_exhausted(budget: IterationBudget, context: dict[str, Any]) -> bool:
        answer = run.host.first("confirm_continuation", budget=budget, context={
            **context, "kind": "budget_exhausted", "mode": run.mode,
            "session_id": run.session_id, "provider": run.provider_name, "model": run.model,
        })
        if answer is not True:
            return False
        extend_by = run.runtime.extend_by or original.get(budget.name(), budget.ceiling())
        budget.extend(extend_by)
        return True

    return on_exhausted


def _loop_kwargs(run: PreparedRun) -> dict[str, Any]:
    return {
        "turn_budget": run.turn_budget,
        "budgets": run.budgets,
        "tool_executor": run.executor,
        "on_event": run.emit if run.emit.active else None,
        "transcript_persister": run.persister,
        "transcript_lock": run.lock,
        "transcript_session_id": run.session_id,
        "transcript_lock_ttl": run.runtime.transcript_lock_ttl,
        "context": {"mode": run.mode, "payload": run.payload},
        "request": {"provider": run.provider_name, "model": run.model, "mode": run.mode},
        "on_budget_exhausted": _confirm_extension(run),
        "on_tool_result": run.completion.attach(run),
        "on_stop": _on_stop(run),
    }


def _on_stop(run: PreparedRun) -> Any:
    """The loop's stop handler: the final summary, then the verdict, before anything is stored.

    Settling here, under the transcript lock and before the terminal event, is what makes the
    stored transcript, the job, the terminal event and the returned result agree.
    """
    summary = make_final_summary(run.runner.summarize, run.emit,
                                 enabled=run.runtime.final_summary)

    def on_stop(outcome: LoopResult, context: dict[str, Any]) -> Any:
        pending = summary(outcome, context)
        if pending is None:
            _settle(run, outcome)
            return None

        async def then() -> None:
            await pending
            _settle(run, outcome)

        return then()

    return on_stop


def _settle(run: PreparedRun, outcome: LoopResult) -> None:
    final = finish(run, outcome)
    if run.settle is not None:
        run.settle(final)
    run.final = final
    # Write the verdict back into the loop's result: the persister and the terminal event read it.
    assign(outcome, status=final.status, completed=final.completed, warning=final.warning,
           flags=list(final.flags), error=final.error, error_code=final.error_code,
           final_content=final.final_content, usage=dict(final.usage),
           warnings=list(final.warnings))
    outcome.metadata.update({
        key: getattr(final, key) for key in (
            "blocker", "max_turns_reached", "completion_nudge_count",
            "completion_assertions_complete", "completion_assertions_missing",
            "remaining_handlers",
        ) if getattr(final, key, None) not in (None, [], {}, 0, False)
    })


def _conclude(run: PreparedRun, outcome: LoopResult) -> ConversationResult:
    """The returned result: settled during the run, or now (a run that never started)."""
    final = run.final if run.final is not None else finish(run, outcome)
    assign(final, transcript_session_id=outcome.transcript_session_id,
           warnings=list(outcome.warnings) if run.final is not None else final.warnings)
    return final


def finish(run: PreparedRun, outcome: LoopResult) -> ConversationResult:
    """Map the loop's outcome onto the product result (DESIGN.md 5.4)."""
    status = outcome.status
    warning = outcome.warning
    max_turns_reached = False
    if status == "budget_exceeded" and outcome.budget == TURN_BUDGET:
        max_turns_reached = True
        warning = (f"Maximum conversation turns ({run.turn_budget.ceiling()}) reached. "
                   "Response may be incomplete.")
    results = [r for r in outcome.tool_execution_results if not r["result"].get("rejected")]
    usage = dict(outcome.usage)
    for key, value in run.runner.summary_usage.items():
        usage[key] = usage.get(key, 0) + value
    result = construct(
        ConversationResult,
        messages=outcome.messages,
        final_content=outcome.final_content,
        turn_count=outcome.turn_count,
        cumulative_turn_count=outcome.turn_count,
        completed=status == "completed",
        status=status,
        budget=outcome.budget,
        flags=list(outcome.flags),
        max_turns_reached=max_turns_reached,
        warning=warning,
        error=outcome.error,
        error_code=outcome.error_code,
        usage=usage,
        tool_execution_results=results,
        last_tool_calls=outcome.last_tool_calls,
        request_metadata=outcome.request_metadata or run.runner.last_request_metadata,
        transcript_session_id=outcome.transcript_session_id,
        budgets=outcome.budgets,
        warnings=[*run.warnings, *outcome.warnings],
        mode=run.mode,
        provider=run.provider_name,
        model=run.model,
    )
    return run.completion.finish(result, run)


def run_conversation_on(host: Host, messages: Any, tools: Any, provider: Any, model: Any,
                        mode: Any = "pipeline", payload: Any = None, max_turns: Any = None,
                        single_turn: Any = False, *,
                        after_turn: Callable[[TurnResult], None] | None = None,
                        settle: Callable[[ConversationResult], None] | None = None,
                        ) -> ConversationResult:
    """Synchronous run on ``host`` (see ``datamachine.run_conversation``).

    ``after_turn`` is called with each provider turn's result (chat session turn counting);
    ``settle`` may adjust the verdict before it is stored and reported (a chat abort).
    """
    with host.settings.batch():  # one consistent read of the settings the set-up uses
        run = prepare_run(host, messages, tools, provider, model, mode, payload, max_turns,
                          single_turn)
    early = run.completion.start(run)  # preflight: may refuse before any provider call
    if early is not None:
        return early
    run.runner.after_turn = after_turn
    run.settle = settle
    outcome = run_loop(run.messages, run.runner, **_loop_kwargs(run))
    return _conclude(run, outcome)


async def arun_conversation_on(host: Host, messages: Any, tools: Any, provider: Any, model: Any,
                               mode: Any = "pipeline", payload: Any = None,
                               max_turns: Any = None,
                               single_turn: Any = False) -> ConversationResult:
    """Asynchronous run on ``host`` (see ``datamachine.arun_conversation``)."""
    with host.settings.batch():  # one consistent read of the settings the set-up uses
        run = prepare_run(host, messages, tools, provider, model, mode, payload, max_turns,
                          single_turn)
    early = run.completion.start(run)  # preflight: may refuse before any provider call
    if early is not None:
        return early
    outcome = await arun_loop(run.messages, run.runner, **_loop_kwargs(run))
    return _conclude(run, outcome)
