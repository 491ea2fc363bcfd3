"""The generic bounded conversation loop: :func:`run_loop` and :func:`arun_loop`.

The loop owns mechanics only: turn sequencing, budgets, tool execution order, events, the
transcript lock and persistence. It knows nothing of providers, jobs or tool policy; those come
in as callables. The loop body is written once, as a generator that yields whatever it must
await; :func:`run_loop` drives it without an event loop when every callable is synchronous (no
asyncio overhead per turn), and :func:`arun_loop` awaits it inside the caller's loop.
"""

from __future__ import annotations

import inspect
import logging
import uuid
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping
from typing import Any, Protocol, TypeAlias, TypeVar, Union, cast, runtime_checkable

from agents_api import clock as _clock
from agents_api._drive import (
    DeadlineReached,
    Steps,
    bounded,
    drive_async,
    drive_sync,
)
from agents_api._drive import awaitable as _awaitable
from agents_api._tools import (
    Emit,
    normalize_tool_call,
    normalize_tool_result,
    run_tool,
    tool_result_content,
)
from agents_api.budget import IterationBudget
from agents_api.construct import construct
from agents_api.errors import InvalidLoopArgument
from agents_api.message import Message, normalize_messages
from agents_api.results import Decision, LoopResult, LoopStatus, TurnResult, coerce_turn_result

__all__ = [
    "DeadlineReached",
    "EventSink",
    "ToolExecutor",
    "TranscriptLock",
    "TranscriptPersister",
    "TurnRunner",
    "arun_loop",
    "drive_async",
    "drive_sync",
    "normalize_tool_result",
    "run_loop",
    "tool_result_content",
]

logger = logging.getLogger("agents_api.loop")

T = TypeVar("T")
MaybeAwaitable: TypeAlias = Union[T, Awaitable[T]]  # noqa: UP007

TurnRunner = Callable[
    [list[Message], dict[str, Any]], MaybeAwaitable[TurnResult | Mapping[str, Any]]
]
ToolExecutor = Callable[[dict[str, Any], dict[str, Any]], MaybeAwaitable[Any]]
EventSink = Callable[[str, dict[str, Any]], object]
ToolResultHook = Callable[
    [dict[str, Any], dict[str, Any], dict[str, Any]], MaybeAwaitable[Decision | None]
]
BudgetExhaustedHook = Callable[[IterationBudget, dict[str, Any]], MaybeAwaitable[bool | None]]
ShouldContinue = Callable[[TurnResult, dict[str, Any]], bool]
# Called once when a run stops, still under the transcript lock and before the transcript is
# persisted and the terminal event is emitted: it may append messages to ``result.messages``
# (the run's transcript), set ``final_content``, and settle the verdict (status, warning, flags,
# metadata) so storage, events and the returned result agree.
StopHook = Callable[[LoopResult, dict[str, Any]], MaybeAwaitable[None]]


@runtime_checkable
class TranscriptPersister(Protocol):
    """Stores a run's transcript once at the end; may also offer ``append_turn`` per turn."""

    def persist(self, messages: list[Message], request: dict[str, Any], result: LoopResult) -> str:
        """Store the whole run and return its session id."""


@runtime_checkable
class TranscriptLock(Protocol):
    """Guarantees one writer per session; ``acquire`` never waits."""

    def acquire(self, session_id: str, ttl: int) -> str | None:
        """Return a token, or None when another holder has an unexpired lock."""

    def release(self, session_id: str, token: str) -> bool:
        """Release the lock if ``token`` still holds it."""


TOOL_BUDGET = "tool_calls"
WALL_CLOCK_BUDGET = "wall_clock_seconds"


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
) -> LoopResult:
    """Run a bounded conversation synchronously and return its :class:`LoopResult`.

    Synchronous callables run without an event loop. If a callable returns an awaitable, it is
    awaited on a private event loop; inside a running event loop use :func:`arun_loop`.
    """
    steps = _loop_steps(
        messages, turn_runner, turn_budget=turn_budget, budgets=budgets,
        tool_executor=tool_executor, on_event=on_event, should_continue=should_continue,
        transcript_persister=transcript_persister, transcript_lock=transcript_lock,
        transcript_session_id=transcript_session_id, transcript_lock_ttl=transcript_lock_ttl,
        context=context, request=request, on_tool_result=on_tool_result,
        on_budget_exhausted=on_budget_exhausted, on_stop=on_stop,
    )
    return drive_sync(steps)


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
) -> LoopResult:
    """Run a bounded conversation inside the running event loop (same arguments as run_loop)."""
    steps = _loop_steps(
        messages, turn_runner, turn_budget=turn_budget, budgets=budgets,
        tool_executor=tool_executor, on_event=on_event, should_continue=should_continue,
        transcript_persister=transcript_persister, transcript_lock=transcript_lock,
        transcript_session_id=transcript_session_id, transcript_lock_ttl=transcript_lock_ttl,
        context=context, request=request, on_tool_result=on_tool_result,
        on_budget_exhausted=on_budget_exhausted, on_stop=on_stop,
    )
    return await drive_async(steps)


def _add_usage(total: dict[str, Any], usage: Mapping[str, Any]) -> None:
    for key, value in usage.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            previous = total.get(key, 0)
            if isinstance(previous, int | float) and not isinstance(previous, bool):
                total[key] = previous + value
                continue
        total[key] = value


def _emitter(sink: EventSink | None) -> Emit:
    """The run's ``emit(event, payload)``; ``emit.active`` says whether anyone listens.

    ``on_event`` is wrapped so that a sink that raises never changes the run's outcome, unless
    it has ``never_raises = True`` and ``active = True`` (it catches its own errors).

    A closure rather than an object with ``__call__``: calling an instance looks ``__call__``
    up and binds it on every call, and a run emits several events per turn.
    """
    if sink is None:
        def emit(event: str, payload: dict[str, Any]) -> None:
            return None
    elif getattr(sink, "never_raises", False) is True and getattr(sink, "active", False) is True:
        # A sink that guards itself and says so (datamachine's run emitter does) is called as is.
        return cast(Emit, sink)
    else:
        def emit(event: str, payload: dict[str, Any]) -> None:
            try:
                sink(event, payload)
            except Exception:
                # An observer must never change a run's outcome.
                logger.warning("agents_api: event sink failed on %r", event, exc_info=True)
    # Per-turn events build their payloads only when someone listens.
    emit.active = sink is not None  # type: ignore[attr-defined]
    return cast(Emit, emit)


def _loop_steps(
    messages: Iterable[Message | Mapping[str, Any]],
    turn_runner: TurnRunner,
    *,
    turn_budget: IterationBudget,
    budgets: Iterable[IterationBudget],
    tool_executor: ToolExecutor | None,
    on_event: EventSink | None,
    should_continue: ShouldContinue | None,
    transcript_persister: Any,
    transcript_lock: Any,
    transcript_session_id: str | None,
    transcript_lock_ttl: int,
    context: Mapping[str, Any] | None,
    request: Mapping[str, Any] | None,
    on_tool_result: ToolResultHook | None,
    on_budget_exhausted: BudgetExhaustedHook | None,
    on_stop: StopHook | None = None,
) -> Steps[LoopResult]:
    if not callable(turn_runner):
        raise InvalidLoopArgument(
            "turn_runner must be a callable (messages, context) -> TurnResult."
        )
    if not isinstance(turn_budget, IterationBudget):
        raise InvalidLoopArgument("turn_budget must be an agents_api.IterationBudget.")
    if isinstance(transcript_lock_ttl, bool) or not isinstance(transcript_lock_ttl, int):
        raise InvalidLoopArgument("transcript_lock_ttl must be an integer number of seconds.")
    ttl = max(1, transcript_lock_ttl)
    msgs = normalize_messages(messages)
    base_context = dict(context or {})
    request_info = dict(request or {})

    all_budgets: dict[str, IterationBudget] = {turn_budget.name(): turn_budget}
    for extra in budgets:
        if not isinstance(extra, IterationBudget):
            raise InvalidLoopArgument(
                f"budgets must hold agents_api.IterationBudget objects, got {type(extra).__name__}."
            )
        all_budgets.setdefault(extra.name(), extra)
    # ``all_budgets`` is handed to the runner and the executor as ``context["budgets"]``; a tool
    # may add a budget to it mid-run (ToolContext.budget), so checks read the live mapping.
    ordered = all_budgets.values()
    wall_clock = all_budgets.get(WALL_CLOCK_BUDGET)
    wall_clock_start = wall_clock.current() if wall_clock is not None else 0
    tool_budget = all_budgets.get(TOOL_BUDGET)
    per_tool_names: dict[str, str] = {}  # tool name -> its per-tool budget's name

    emit = _emitter(on_event)
    session_id = transcript_session_id or None
    append_turn = getattr(transcript_persister, "append_turn", None)
    if session_id is None and (append_turn is not None or transcript_persister is not None):
        session_id = uuid.uuid4().hex

    state = _RunState(msgs)

    # -- the lock: contention returns before the runner or the persister is touched --------
    token: str | None = None
    if transcript_lock is not None and session_id:
        acquired = transcript_lock.acquire(session_id, ttl)
        if inspect.isawaitable(acquired):
            acquired = yield acquired
        if not acquired:
            emit("transcript_lock_contention", {"session_id": session_id})
            result = state.build(
                "transcript_lock_contention", ordered, session_id,
                error=f"Transcript session {session_id!r} is locked by another run.",
                error_code="transcript_lock_contention",
            )
            emit("completed", _terminal_payload(result))
            return result
        token = str(acquired)

    started = _clock.monotonic()
    status: LoopStatus = "completed"
    stop_budget: IterationBudget | None = None
    error: str | None = None
    error_code: str | None = None

    def fail(code: str, exc: BaseException) -> None:
        nonlocal status, error, error_code, stop_budget
        status, stop_budget = "error", None
        error = str(exc) or type(exc).__name__
        error_code = str(getattr(exc, "code", "") or code)

    try:
        # Everything from here to the final write happens under the lock: the starting messages,
        # every turn, the stop handler (a final summary call) and the persister.
        begin = getattr(transcript_persister, "begin", None)
        try:
            if begin is not None and session_id:
                # Stored now, so a run killed before its first turn finishes leaves its prompt.
                begun = begin(session_id, msgs, request_info)
                if _awaitable(begun):
                    yield begun
        except Exception as exc:
            fail("transcript_write_failed", exc)
        while status != "error":
            # Budgets are checked before a turn starts: the wall clock and any budget that was
            # already spent (a run resumed at its ceiling, a tool that spent an extension budget).
            if wall_clock is not None:
                wall_clock.set_current(wall_clock_start + int(_clock.monotonic() - started))
            spent = _first_exceeded(ordered)
            if spent is not None:
                extended = yield from _try_extend(spent, on_budget_exhausted, state, emit)
                if not extended:
                    status, stop_budget = "budget_exceeded", spent
                    break
            turn = state.turn_count + 1
            state.turn_count = turn
            turn_context = {**base_context, "turn": turn, "budgets": all_budgets,
                            "session_id": session_id}
            if emit.active:
                emit("turn_started", {"turn": turn, "max_turns": turn_budget.ceiling(),
                                      "message_count": len(msgs)})
            turn_start = len(msgs)
            try:
                raw = turn_runner(msgs, turn_context)
                if _awaitable(raw):
                    left = _deadline_left(ordered, wall_clock, wall_clock_start, started)
                    raw = yield (raw if left is None else bounded(raw, left))
                outcome = coerce_turn_result(raw, turn)
            except DeadlineReached:
                # The wall clock ran out while the provider was still answering: the call was
                # cancelled and the run stops on its time budget.
                stop_budget = _spend_time(ordered, wall_clock)
                status = "budget_exceeded"
                emit("turn_interrupted", {"turn": turn, "reason": "deadline",
                                          "budget": stop_budget.name()})
                break
            except Exception as exc:
                # Reported once, by the terminal ``failed`` event (it carries the error).
                fail("turn_failed", exc)
                logger.info("agents_api: turn %d failed: %s", turn, error)
                break

            _add_usage(state.usage, outcome.usage)
            if outcome.request_metadata:
                state.request_metadata = outcome.request_metadata
            if outcome.content:
                msgs.append(Message.text("assistant", outcome.content))

            calls = []
            for index, raw_call in enumerate(outcome.tool_calls, start=1):
                normalized_call = normalize_tool_call(raw_call, turn, index)
                if normalized_call is not None:
                    calls.append(normalized_call)
            state.last_tool_calls = calls
            # Only a run with a time rail pays to compute how long each call may take.
            timed = bool(calls) and (wall_clock is not None or _has_time_rail(ordered))
            policy_complete = False
            hook_error: Exception | None = None
            for call in calls:
                # Tool budgets are checked before each call, so a spent budget runs nothing.
                per_tool_name = per_tool_names.get(call["name"])
                if per_tool_name is None:
                    per_tool_name = per_tool_names[call["name"]] = f"{TOOL_BUDGET}_{call['name']}"
                per_tool = all_budgets.get(per_tool_name)
                if tool_budget is not None and tool_budget.exceeded():
                    stop_budget = tool_budget
                    break
                if per_tool is not None and per_tool.exceeded():
                    stop_budget = per_tool
                    break
                left = (_deadline_left(ordered, wall_clock, wall_clock_start, started)
                        if timed else None)
                tool_result = yield from run_tool(call, turn, turn_context, tool_executor, msgs,
                                                  state.tool_results, emit, left)
                if tool_budget is not None:
                    tool_budget.increment()
                if per_tool is None:  # the tool may have created its own budget just now
                    per_tool = all_budgets.get(per_tool_name)
                if per_tool is not None:
                    per_tool.increment()
                if on_tool_result is not None:
                    try:
                        decision = on_tool_result(call, tool_result, turn_context)
                        if _awaitable(decision):
                            decision = yield decision
                    except Exception as exc:
                        # A policy that raises ends the run as an error; the turn so far is kept.
                        hook_error = exc
                        break
                    if isinstance(decision, Decision):
                        if decision.complete:
                            policy_complete = True
                        elif decision.message:
                            msgs.append(Message.text("user", decision.message,
                                                     {"type": "completion_policy_continue"}))
                # After each call every budget is checked (tools may spend extension budgets).
                if wall_clock is not None:
                    wall_clock.set_current(wall_clock_start + int(_clock.monotonic() - started))
                spent = _first_exceeded(ordered, skip=turn_budget)
                if spent is not None:
                    stop_budget = spent
                    break
            msgs.extend(outcome.continuation_messages)
            turn_budget.increment()

            try:
                if append_turn is not None or token is not None:
                    yield from _store_turn(append_turn, transcript_lock, session_id, token,
                                           ttl, turn, msgs[turn_start:])
            except Exception as exc:
                # A turn that cannot be stored ends the run: going on would lose work silently.
                fail("transcript_write_failed", exc)
                break
            if hook_error is not None:
                fail("tool_result_hook_failed", hook_error)
                break
            if stop_budget is not None:
                extended = yield from _try_extend(stop_budget, on_budget_exhausted, state, emit)
                if not extended:
                    status = "budget_exceeded"
                    break
                stop_budget = None
            if policy_complete or outcome.complete:
                break
            try:
                keep_going = (bool(should_continue(outcome, turn_context))
                              if should_continue is not None
                              else bool(calls or outcome.continuation_messages))
            except Exception as exc:
                fail("should_continue_failed", exc)
                break
            if not keep_going:
                break
            # The next turn's pre-check stops (or extends) a spent turn budget.

        if status == "budget_exceeded" and stop_budget is not None:
            emit("budget_exceeded", _exceeded_payload(stop_budget))
        result = state.build(status, ordered, session_id, stop_budget=stop_budget, error=error,
                             error_code=error_code)
        if on_stop is not None:
            if token is not None:
                # The stop handler may make one more provider call: keep the lock for it.
                yield from _renew(transcript_lock, session_id, token, ttl)
            try:
                stopped = on_stop(result, {**base_context, "budgets": all_budgets,
                                           "session_id": session_id,
                                           "deadline": _deadline_left(ordered, wall_clock,
                                                                      wall_clock_start,
                                                                      started)})
                if _awaitable(stopped):
                    yield stopped
            except Exception as exc:
                logger.error("agents_api: on_stop hook failed", exc_info=True)
                result.warnings.append(f"The run's stop handler failed: {exc}")
        if transcript_persister is not None:
            try:
                stored = transcript_persister.persist(msgs, request_info, result)
                if _awaitable(stored):
                    stored = yield stored
                if isinstance(stored, str) and stored:
                    result.transcript_session_id = stored
            except Exception as exc:
                # The run's outcome stands; the caller learns that storage failed.
                logger.error("agents_api: transcript persister failed", exc_info=True)
                result.warnings.append(f"Transcript could not be stored: {exc}")
    finally:
        if token is not None:
            try:
                released = transcript_lock.release(session_id, token)
                if inspect.isawaitable(released):
                    yield released
            except Exception:
                logger.warning("agents_api: releasing transcript lock %r failed", session_id,
                               exc_info=True)
    emit("failed" if result.status == "error" else "completed", _terminal_payload(result))
    return result


def _renew(lock: Any, session_id: str | None, token: str, ttl: int
           ) -> Generator[Awaitable[Any], Any, None]:
    renew = getattr(lock, "renew", None)
    if renew is None:
        return
    renewed = renew(session_id, token, ttl)
    if _awaitable(renewed):
        renewed = yield renewed
    if renewed is False:
        raise LockLost(f"The transcript lock of session {session_id!r} was taken over by "
                       "another run (it expired); stopping so two runs never write one session.")


class LockLost(RuntimeError):
    """The run's transcript lock expired and another holder took it."""

    code = "transcript_lock_lost"


def _store_turn(append_turn: Any, lock: Any, session_id: str | None, token: str | None,
                ttl: int, turn: int, messages: list[Message]
                ) -> Generator[Awaitable[Any], Any, None]:
    """Write one finished turn (one transaction) and renew the lock after it."""
    if append_turn is not None and session_id:
        written = append_turn(session_id, turn, messages)
        if _awaitable(written):
            yield written
    if token is not None:
        yield from _renew(lock, session_id, token, ttl)


class _RunState:
    __slots__ = ("last_tool_calls", "messages", "request_metadata", "tool_results",
                 "turn_count", "usage")

    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages
        self.turn_count = 0
        self.usage: dict[str, Any] = {"prompt_tokens": 0, "completion_tokens": 0,
                                      "total_tokens": 0}
        self.request_metadata: dict[str, Any] = {}
        self.tool_results: list[dict[str, Any]] = []
        self.last_tool_calls: list[dict[str, Any]] = []

    def build(
        self,
        status: LoopStatus,
        budgets: Iterable[IterationBudget],
        session_id: str | None,
        *,
        stop_budget: IterationBudget | None = None,
        error: str | None = None,
        error_code: str | None = None,
    ) -> LoopResult:
        flags: list[str] = []
        warning = None
        budget_name = None
        if stop_budget is not None:
            budget_name = stop_budget.name()
            flags.append(stop_budget.to_response_flag())
            warning = stop_budget.to_warning()
        return construct(
            LoopResult,
            messages=self.messages,
            final_content=_final_content(self.messages),
            turn_count=self.turn_count,
            completed=status == "completed",
            status=status,
            budget=budget_name,
            flags=flags,
            warning=warning,
            error=error,
            error_code=error_code,
            usage=self.usage,
            tool_execution_results=self.tool_results,
            last_tool_calls=self.last_tool_calls,
            request_metadata=self.request_metadata,
            budgets={b.name(): b.snapshot() for b in budgets},
            transcript_session_id=session_id,
            warnings=[],
            metadata={},
        )


def _final_content(messages: list[Message]) -> str:
    for message in reversed(messages):
        if message.role == "assistant" and message.type == "text" and isinstance(
            message.content, str
        ) and message.content:
            return message.content
    return ""


def _first_exceeded(
    budgets: Iterable[IterationBudget], skip: IterationBudget | None = None
) -> IterationBudget | None:
    for budget in budgets:
        if budget is not skip and budget.exceeded():
            return budget
    return None


def _has_time_rail(budgets: Iterable[IterationBudget]) -> bool:
    return any(budget.max_seconds() is not None for budget in budgets)


def _try_extend(
    budget: IterationBudget,
    hook: BudgetExhaustedHook | None,
    state: _RunState,
    emit: Emit,
) -> Generator[Awaitable[Any], Any, bool]:
    """Ask the host to extend a spent budget; only soft ceilings are ever offered."""
    if hook is None or not budget.extendable():
        return False
    answer = hook(budget, {"turn": state.turn_count, "budget": budget.name()})
    if inspect.isawaitable(answer):
        answer = yield answer
    if answer is True and not budget.exceeded():
        emit("budget_extended", {"budget": budget.name(), "ceiling": budget.ceiling(),
                                 "current": budget.current()})
        return True
    return False


def _deadline_left(
    budgets: Iterable[IterationBudget], wall_clock: IterationBudget | None, wall_clock_start: int,
    started: float,
) -> float | None:
    """Seconds until the earliest time rail of the run, or None when it has none."""
    left: float | None = None
    if wall_clock is not None:
        left = wall_clock.ceiling() - wall_clock_start - (_clock.monotonic() - started)
    for budget in budgets:
        seconds = budget.seconds_left()
        if seconds is not None and (left is None or seconds < left):
            left = seconds
    return None if left is None else max(0.0, left)


def _spend_time(
    budgets: Iterable[IterationBudget], wall_clock: IterationBudget | None
) -> IterationBudget:
    """The time budget that stopped a cut call, marked spent."""
    for budget in budgets:
        if budget.max_seconds() is not None and budget.exceeded():
            return budget
    if wall_clock is not None:
        wall_clock.set_current(max(wall_clock.current(), wall_clock.ceiling()))
        return wall_clock
    for budget in budgets:
        if budget.max_seconds() is not None:
            return budget
    raise RuntimeError("a deadline was reached without a time budget")  # pragma: no cover


def _exceeded_payload(budget: IterationBudget) -> dict[str, Any]:
    name = budget.name()
    if name == WALL_CLOCK_BUDGET:
        dimension = "wall_clock"
    elif name.startswith(TOOL_BUDGET):
        dimension = TOOL_BUDGET
    else:
        dimension = name
    return {"budget": name, "dimension": dimension, "current": budget.current(),
            "ceiling": budget.ceiling(), "rail": budget.exhausted_rail()}


def _terminal_payload(result: LoopResult) -> dict[str, Any]:
    return {
        "status": result.status,
        "turn": result.turn_count,
        "turn_count": result.turn_count,
        "message_count": len(result.messages),
        "tool_results": len(result.tool_execution_results),
        "budget": result.budget,
        "budgets": result.budgets,
        "error": result.error,
        "error_code": result.error_code,
    }
