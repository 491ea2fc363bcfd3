"""The generic bounded conversation loop: :func:`run_loop` and :func:`arun_loop`.

The loop owns mechanics only: turn sequencing, budgets, tool execution order, events, the
transcript lock and persistence. It knows nothing of providers, jobs or tool policy; those come
in as callables. Both functions validate their arguments, build one :class:`~agents_api.run.
LoopRun` and drive its steps: :func:`run_loop` without an event loop while every callable is
synchronous (no asyncio overhead per turn), :func:`arun_loop` inside the caller's loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from agents_api._tools import ToolExecutor, normalize_tool_result, tool_result_content
from agents_api.budget import IterationBudget
from agents_api.drive import Steps, drive_async, drive_sync
from agents_api.errors import InvalidLoopArgument
from agents_api.events import Emitter, EventSink
from agents_api.message import Message, normalize_messages
from agents_api.results import LoopResult
from agents_api.run import (
    BudgetExhaustedHook,
    LoopRun,
    LoopSettings,
    RequestEstimate,
    ShouldContinue,
    StopHook,
    ToolResultHook,
    TurnRunner,
)
from agents_api.transcript import TranscriptLock, TranscriptPersister, TranscriptWriter

__all__ = ["MAX_LOCK_TTL", "EventSink", "RequestEstimate", "ToolExecutor", "TranscriptLock",
           "TranscriptPersister", "TurnRunner", "arun_loop", "loop_steps",
           "normalize_tool_result", "run_loop", "tool_result_content"]

# A transcript lock lives at most a day: a run renews it after every turn, so a longer TTL
# only keeps a crashed run's session blocked longer.
MAX_LOCK_TTL = 86_400


def run_loop(
    messages: Iterable[Message | Mapping[str, Any]],
    turn_runner: TurnRunner,
    *,
    turn_budget: IterationBudget,
    budgets: Iterable[IterationBudget] = (),
    tool_executor: ToolExecutor | None = None,
    on_event: EventSink | None = None,
    should_continue: ShouldContinue | None = None,
    transcript_persister: Any = None,
    transcript_lock: Any = None,
    transcript_session_id: str | None = None,
    transcript_lock_ttl: int = 300,
    context: Mapping[str, Any] | None = None,
    request: Mapping[str, Any] | None = None,
    on_tool_result: ToolResultHook | None = None,
    on_budget_exhausted: BudgetExhaustedHook | None = None,
    on_stop: StopHook | None = None,
    transcript_writer: TranscriptWriter | None = None,
    pending_tool_calls: Iterable[Mapping[str, Any]] = (),
    estimate_request: RequestEstimate | None = None,
) -> LoopResult:
    """Run a bounded conversation synchronously and return its :class:`LoopResult`.

    Synchronous callables run without an event loop. If a callable returns an awaitable, it is
    awaited on a private event loop; inside a running event loop use :func:`arun_loop`.
    ``transcript_writer``: a writer for a session whose lock the caller already holds (instead
    of ``transcript_persister`` and ``transcript_lock``); see :mod:`agents_api.transcript`.
    ``pending_tool_calls``: the calls a paused run left waiting (its ``pending["tool_calls"]``),
    run before the first turn; see :mod:`agents_api.pause`. ``estimate_request``: what the
    coming request would add to budgets that count what requests spend (tokens, money), asked
    before every turn: a request that would pass a ceiling is not sent (see
    :data:`~agents_api.run.RequestEstimate`).
    """
    run = _prepare(messages, turn_runner, turn_budget, budgets, tool_executor, on_event,
                   should_continue, transcript_persister, transcript_lock,
                   transcript_session_id, transcript_lock_ttl, context, request, on_tool_result,
                   on_budget_exhausted, on_stop, transcript_writer, pending_tool_calls,
                   estimate_request)
    return drive_sync(run.steps())


async def arun_loop(
    messages: Iterable[Message | Mapping[str, Any]],
    turn_runner: TurnRunner,
    *,
    turn_budget: IterationBudget,
    budgets: Iterable[IterationBudget] = (),
    tool_executor: ToolExecutor | None = None,
    on_event: EventSink | None = None,
    should_continue: ShouldContinue | None = None,
    transcript_persister: Any = None,
    transcript_lock: Any = None,
    transcript_session_id: str | None = None,
    transcript_lock_ttl: int = 300,
    context: Mapping[str, Any] | None = None,
    request: Mapping[str, Any] | None = None,
    on_tool_result: ToolResultHook | None = None,
    on_budget_exhausted: BudgetExhaustedHook | None = None,
    on_stop: StopHook | None = None,
    transcript_writer: TranscriptWriter | None = None,
    pending_tool_calls: Iterable[Mapping[str, Any]] = (),
    estimate_request: RequestEstimate | None = None,
) -> LoopResult:
    """Run a bounded conversation inside the running event loop (same arguments as run_loop)."""
    run = _prepare(messages, turn_runner, turn_budget, budgets, tool_executor, on_event,
                   should_continue, transcript_persister, transcript_lock,
                   transcript_session_id, transcript_lock_ttl, context, request, on_tool_result,
                   on_budget_exhausted, on_stop, transcript_writer, pending_tool_calls,
                   estimate_request)
    return await drive_async(run.steps())


def loop_steps(
    messages: Iterable[Message | Mapping[str, Any]],
    turn_runner: TurnRunner,
    **options: Any,
) -> Steps[LoopResult]:
    """The run of :func:`run_loop` (same keyword arguments) as a step generator, for callers
    that drive it inside a larger sequence of their own (``drive_sync`` / ``drive_async``)."""
    run = _prepare(messages, turn_runner, options.pop("turn_budget"),
                   options.pop("budgets", ()), options.pop("tool_executor", None),
                   options.pop("on_event", None), options.pop("should_continue", None),
                   options.pop("transcript_persister", None), options.pop("transcript_lock", None),
                   options.pop("transcript_session_id", None),
                   options.pop("transcript_lock_ttl", 300), options.pop("context", None),
                   options.pop("request", None), options.pop("on_tool_result", None),
                   options.pop("on_budget_exhausted", None), options.pop("on_stop", None),
                   options.pop("transcript_writer", None),
                   options.pop("pending_tool_calls", ()),
                   options.pop("estimate_request", None))
    if options:
        raise TypeError(f"loop_steps() got unexpected arguments: {', '.join(sorted(options))}")
    return run.steps()


def check_lock_ttl(ttl: object, knob: str = "transcript_lock_ttl") -> int:
    """``ttl`` if it is an integer number of seconds in [1, 86400]; else InvalidLoopArgument."""
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= MAX_LOCK_TTL:
        raise InvalidLoopArgument(
            f"{knob} must be an integer number of seconds from 1 to {MAX_LOCK_TTL}, "
            f"got {ttl!r}.")
    return ttl


def _budget_map(turn_budget: object, budgets: Iterable[object]) -> dict[str, IterationBudget]:
    if not isinstance(turn_budget, IterationBudget):
        raise InvalidLoopArgument("turn_budget must be an agents_api.IterationBudget.")
    found: dict[str, IterationBudget] = {turn_budget.name(): turn_budget}
    for extra in budgets:
        if not isinstance(extra, IterationBudget):
            raise InvalidLoopArgument(
                f"budgets must hold agents_api.IterationBudget objects, got {type(extra).__name__}."
            )
        found.setdefault(extra.name(), extra)
    return found


def _check_transcript(persister: Any, lock: Any, writer: Any) -> None:
    if writer is not None and (persister is not None or lock is not None):
        raise InvalidLoopArgument(
            "transcript_writer already holds its session: pass it alone, without "
            "transcript_persister or transcript_lock.")
    if writer is not None and not isinstance(writer, TranscriptWriter):
        raise InvalidLoopArgument(
            "transcript_writer must have session_id and begin, append_turn, renew, persist and "
            "release methods (see agents_api.TranscriptWriter).")


def _check_pending_calls(calls: Iterable[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    """Waiting calls as a paused run stored them: each a mapping naming its tool."""
    if isinstance(calls, str | bytes | Mapping):
        raise InvalidLoopArgument("pending_tool_calls must be a list of tool call dicts.")
    checked = []
    for index, call in enumerate(calls):
        name = call.get("name") if isinstance(call, Mapping) else None
        if not isinstance(name, str) or not name.strip():
            raise InvalidLoopArgument(
                f"pending_tool_calls[{index}] must be a dict with a tool 'name' (as a paused "
                "run's pending['tool_calls'] holds them).")
        turn = call.get("turn", 0)
        if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
            raise InvalidLoopArgument(
                f"pending_tool_calls[{index}]['turn'] must be a turn number, got {turn!r}.")
        checked.append(dict(call))
    return tuple(checked)


def _prepare(messages: Iterable[Message | Mapping[str, Any]], turn_runner: TurnRunner,
             turn_budget: IterationBudget, budgets: Iterable[IterationBudget],
             tool_executor: ToolExecutor | None, on_event: EventSink | None,
             should_continue: ShouldContinue | None, persister: Any, lock: Any,
             session_id: str | None, ttl: int, context: Mapping[str, Any] | None,
             request: Mapping[str, Any] | None, on_tool_result: ToolResultHook | None,
             on_budget_exhausted: BudgetExhaustedHook | None, on_stop: StopHook | None,
             writer: TranscriptWriter | None,
             pending_calls: Iterable[Mapping[str, Any]] = (),
             estimate_request: RequestEstimate | None = None) -> LoopRun:
    """Validate the arguments (every failure names the argument) and build the run."""
    if not callable(turn_runner):
        raise InvalidLoopArgument(
            "turn_runner must be a callable (messages, context) -> TurnResult.")
    budget_map = _budget_map(turn_budget, budgets)
    _check_transcript(persister, lock, writer)
    if estimate_request is not None and not callable(estimate_request):
        raise InvalidLoopArgument(
            "estimate_request must be a callable (messages, context) -> {budget_name: units}.")
    settings = LoopSettings(
        turn_runner=turn_runner, turn_budget=turn_budget, tool_executor=tool_executor,
        should_continue=should_continue, persister=persister, lock=lock, writer=writer,
        session_id=session_id or None, ttl=check_lock_ttl(ttl), context=dict(context or {}),
        request=dict(request or {}), on_tool_result=on_tool_result,
        on_budget_exhausted=on_budget_exhausted, on_stop=on_stop,
        pending_calls=_check_pending_calls(pending_calls) if pending_calls else (),
        estimate_request=estimate_request)
    return LoopRun(settings, normalize_messages(messages), budget_map, Emitter(on_event))
