"""The generic loop's entry points: :func:`run_loop`, :func:`arun_loop` and :func:`loop_steps`.

They keep the keyword arguments of DESIGN.md section 10 (a turn runner, a tool executor, event
sink, persister and lock, and the optional callables), check them (every failure names the
argument), adapt the callables onto :class:`~agents_api.hooks.LoopHooks` with
:class:`CallableHooks`, build one :class:`~agents_api.loop.LoopRun` and drive it:
:func:`run_loop` without an event loop while every callable is synchronous (no asyncio overhead
per turn), :func:`arun_loop` inside the caller's loop. A product that implements the hooks
itself builds a :class:`~agents_api.hooks.LoopSettings` and calls :func:`hooked_steps`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import TypeAlias

from agents_api.budget import IterationBudget
from agents_api.drive import Steps, drive_async, drive_sync
from agents_api.errors import InvalidLoopArgument, brief_repr
from agents_api.hooks import (
    EMPTY,
    EventListener,
    EventSink,
    LoopSettings,
    MaybeAwaitable,
    ShouldContinue,
    TurnContext,
)
from agents_api.loop import Emitter, LoopRun, normalize_tool_result, tool_result_content
from agents_api.message import Message, normalize_messages
from agents_api.pause import Pause
from agents_api.records import ToolCall, ToolOutcome
from agents_api.results import (
    Decision,
    LoopResult,
    RunStop,
    StopVerdict,
    TurnAnswer,
    TurnResult,
)
from agents_api.transcript import TranscriptLock, TranscriptPersister, TranscriptWriter

__all__ = ["MAX_LOCK_TTL", "BudgetExhaustedHook", "CallableHooks", "EventSink",
           "RequestEstimate", "ShouldContinue", "StopHook", "ToolExecutor", "ToolResultHook",
           "TranscriptLock", "TranscriptPersister", "TurnRunner", "arun_loop", "hooked_steps",
           "loop_steps", "normalize_tool_result", "run_loop", "tool_result_content"]

# A transcript lock lives at most a day: a run renews it after every turn, so a longer TTL
# only keeps a crashed run's session blocked longer.
MAX_LOCK_TTL = 86_400

# The callables of run_loop (DESIGN.md section 10); each receives the turn's context as a new
# dict (TurnContext.as_dict), the shape such callables have always been given. Its values are
# of several types (the turn, the budgets, the session id, the caller's own keys), so they are
# typed object; a callable may annotate the dict as dict[str, Any], as callables always have.
Context: TypeAlias = dict[str, object]
TurnRunner = Callable[[list[Message], Context],
                      MaybeAwaitable[TurnResult | TurnAnswer | Mapping[str, object]]]
# (tool_call, context) -> a result (any value; a Pause: the call waits). The call is its
# {"id", "name", "parameters"} dict (agents_api.records.ToolCallDict); the context also holds
# "messages" and "tool_call_id".
ToolExecutor = Callable[[dict[str, object], Context], object]
# (tool_call, its normalized result {"success": bool, "result"|"error": ...}, context).
ToolResultHook = Callable[[dict[str, object], dict[str, object], Context],
                          MaybeAwaitable[Decision | None]]
# True: the budget was extended; a Pause: stop and wait for a person (agents_api.pause).
BudgetExhaustedHook = Callable[[IterationBudget, dict[str, object]],
                               MaybeAwaitable[bool | Pause | None]]
# Called once when a run stops, under the transcript lock, before its end is stored: it sees
# the run (RunStop) and returns the StopVerdict the loop applies (or None: no change).
StopHook = Callable[[RunStop, Context], MaybeAwaitable[StopVerdict | None]]
# Asked before every turn: what the coming request would add to budgets that count what
# requests spend, ``{budget_name: units}``. A request that would take a budget past its
# ceiling is not sent: the budget is offered for extension like a spent one, else the run
# stops on it. Whoever estimates also feeds those budgets with what answers report. It may
# make the request smaller first (awaitable: that may call a model) and raise BudgetSpent when
# it cannot make it fit.
RequestEstimate = Callable[[list[Message], Context], MaybeAwaitable[Mapping[str, int] | None]]


class CallableHooks:
    """:class:`~agents_api.hooks.LoopHooks` made of ``run_loop``'s keyword callables.

    Each hook calls its callable with the arguments section 10 documents (a tool call as its
    ``{"id", "name", "parameters"}`` dict, the context as a mapping); a callable that was not
    given answers as the loop's default: no executor is a failed call, no policy says nothing,
    no confirmation hook declines, no stop handler keeps the loop's verdict.
    """

    __slots__ = ("_context", "_dict", "estimate", "executor", "on_budget_exhausted", "on_stop",
                 "on_tool_result", "turn_runner")

    def __init__(self, turn_runner: TurnRunner, *, tool_executor: ToolExecutor | None = None,
                 on_tool_result: ToolResultHook | None = None,
                 on_budget_exhausted: BudgetExhaustedHook | None = None,
                 on_stop: StopHook | None = None,
                 estimate_request: RequestEstimate | None = None) -> None:
        self.turn_runner = turn_runner
        self.executor = tool_executor
        self.on_tool_result = on_tool_result
        self.on_budget_exhausted = on_budget_exhausted
        self.on_stop = on_stop
        self.estimate = estimate_request
        self._context: TurnContext | None = None
        self._dict: Context = {}

    def _plain(self, context: TurnContext) -> Context:
        """``context`` as a dict, one per turn (the callables of a turn share it, as the loop
        has always given them)."""
        if context is not self._context:
            self._context, self._dict = context, context.as_dict()
        return self._dict

    def run_turn(self, messages: list[Message], context: TurnContext
                 ) -> MaybeAwaitable[TurnResult | TurnAnswer | Mapping[str, object]]:
        """The turn runner's answer."""
        return self.turn_runner(messages, self._plain(context))

    def run_tool(self, call: ToolCall, messages: list[Message], context: TurnContext) -> object:
        """The executor's result for the call's dict, with the messages and the call's id in
        its context; without an executor, a failed result saying so."""
        if self.executor is None:
            return {"success": False, "error_type": "executor_unavailable",
                    "error": f"Tool '{call.name}' cannot run: no tool executor is configured "
                             "for this loop."}
        return self.executor(call.mapping, {**self._plain(context), "messages": messages,
                                            "tool_call_id": call.id})

    def after_tool(self, outcome: ToolOutcome, context: TurnContext
                   ) -> MaybeAwaitable[Decision | None]:
        """``on_tool_result(call, result, context)``, when given."""
        if self.on_tool_result is None:
            return None
        return self.on_tool_result(outcome.call.mapping, outcome.result, self._plain(context))

    def estimate_request(self, messages: list[Message], context: TurnContext
                         ) -> MaybeAwaitable[Mapping[str, int] | None]:
        """``estimate_request(messages, context)``, when given."""
        return None if self.estimate is None else self.estimate(messages, self._plain(context))

    def budget_spent(self, budget: IterationBudget, context: TurnContext
                     ) -> MaybeAwaitable[bool | Pause | None]:
        """``on_budget_exhausted(budget, {"turn", "budget"})``, when given."""
        if self.on_budget_exhausted is None:
            return False
        return self.on_budget_exhausted(budget, {"turn": context.turn,
                                                 "budget": budget.name()})

    def stop(self, stop: RunStop, context: TurnContext) -> MaybeAwaitable[StopVerdict | None]:
        """``on_stop(stop, context)``, when given."""
        return None if self.on_stop is None else self.on_stop(stop, self._plain(context))


def run_loop(
    messages: Iterable[Message | Mapping[str, object]],
    turn_runner: TurnRunner,
    *,
    turn_budget: IterationBudget,
    budgets: Iterable[IterationBudget] = (),
    tool_executor: ToolExecutor | None = None,
    on_event: EventSink | None = None,
    should_continue: ShouldContinue | None = None,
    transcript_persister: TranscriptPersister | None = None,
    transcript_lock: TranscriptLock | None = None,
    transcript_session_id: str | None = None,
    transcript_lock_ttl: int = 300,
    context: Mapping[str, object] | None = None,
    request: Mapping[str, object] | None = None,
    on_tool_result: ToolResultHook | None = None,
    on_budget_exhausted: BudgetExhaustedHook | None = None,
    on_stop: StopHook | None = None,
    transcript_writer: TranscriptWriter | None = None,
    pending_tool_calls: Iterable[Mapping[str, object]] = (),
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
    :data:`RequestEstimate`).
    """
    return LoopResult.of(drive_sync(loop_steps(
        messages, turn_runner, turn_budget=turn_budget, budgets=budgets,
        tool_executor=tool_executor, on_event=on_event, should_continue=should_continue,
        transcript_persister=transcript_persister, transcript_lock=transcript_lock,
        transcript_session_id=transcript_session_id, transcript_lock_ttl=transcript_lock_ttl,
        context=context, request=request, on_tool_result=on_tool_result,
        on_budget_exhausted=on_budget_exhausted, on_stop=on_stop,
        transcript_writer=transcript_writer, pending_tool_calls=pending_tool_calls,
        estimate_request=estimate_request)))


async def arun_loop(
    messages: Iterable[Message | Mapping[str, object]],
    turn_runner: TurnRunner,
    *,
    turn_budget: IterationBudget,
    budgets: Iterable[IterationBudget] = (),
    tool_executor: ToolExecutor | None = None,
    on_event: EventSink | None = None,
    should_continue: ShouldContinue | None = None,
    transcript_persister: TranscriptPersister | None = None,
    transcript_lock: TranscriptLock | None = None,
    transcript_session_id: str | None = None,
    transcript_lock_ttl: int = 300,
    context: Mapping[str, object] | None = None,
    request: Mapping[str, object] | None = None,
    on_tool_result: ToolResultHook | None = None,
    on_budget_exhausted: BudgetExhaustedHook | None = None,
    on_stop: StopHook | None = None,
    transcript_writer: TranscriptWriter | None = None,
    pending_tool_calls: Iterable[Mapping[str, object]] = (),
    estimate_request: RequestEstimate | None = None,
) -> LoopResult:
    """Run a bounded conversation inside the running event loop (same arguments as run_loop)."""
    return LoopResult.of(await drive_async(loop_steps(
        messages, turn_runner, turn_budget=turn_budget, budgets=budgets,
        tool_executor=tool_executor, on_event=on_event, should_continue=should_continue,
        transcript_persister=transcript_persister, transcript_lock=transcript_lock,
        transcript_session_id=transcript_session_id, transcript_lock_ttl=transcript_lock_ttl,
        context=context, request=request, on_tool_result=on_tool_result,
        on_budget_exhausted=on_budget_exhausted, on_stop=on_stop,
        transcript_writer=transcript_writer, pending_tool_calls=pending_tool_calls,
        estimate_request=estimate_request)))


def loop_steps(
    messages: Iterable[Message | Mapping[str, object]],
    turn_runner: TurnRunner,
    *,
    turn_budget: IterationBudget,
    budgets: Iterable[IterationBudget] = (),
    tool_executor: ToolExecutor | None = None,
    on_event: EventSink | None = None,
    should_continue: ShouldContinue | None = None,
    transcript_persister: TranscriptPersister | None = None,
    transcript_lock: TranscriptLock | None = None,
    transcript_session_id: str | None = None,
    transcript_lock_ttl: int = 300,
    context: Mapping[str, object] | None = None,
    request: Mapping[str, object] | None = None,
    on_tool_result: ToolResultHook | None = None,
    on_budget_exhausted: BudgetExhaustedHook | None = None,
    on_stop: StopHook | None = None,
    transcript_writer: TranscriptWriter | None = None,
    pending_tool_calls: Iterable[Mapping[str, object]] = (),
    estimate_request: RequestEstimate | None = None,
) -> Steps[RunStop]:
    """The run of :func:`run_loop` (same keyword arguments) as a step generator ending in its
    decided :class:`RunStop`, for callers that drive it inside a larger sequence of their own
    (``drive_sync`` / ``drive_async``)."""
    if not callable(turn_runner):
        raise _refused("turn_runner", "a callable (messages, context) -> TurnResult",
                       turn_runner)
    _check_callable("tool_executor", tool_executor, "(tool_call, context) -> result")
    _check_callable("on_tool_result", on_tool_result,
                    "(tool_call, result, context) -> Decision | None")
    _check_callable("on_budget_exhausted", on_budget_exhausted,
                    "(budget, context) -> bool | Pause | None")
    _check_callable("on_stop", on_stop, "(stop, context) -> StopVerdict | None")
    _check_callable("estimate_request", estimate_request,
                    "(messages, context) -> {budget_name: units}")
    _check_mapping("context", context)
    _check_mapping("request", request)
    if transcript_session_id is not None and (not isinstance(transcript_session_id, str)
                                              or not transcript_session_id.strip()):
        raise _refused("transcript_session_id", "the session's id (a non-empty string) or None "
                       "for a new one", transcript_session_id)
    hooks = CallableHooks(turn_runner, tool_executor=tool_executor,
                          on_tool_result=on_tool_result,
                          on_budget_exhausted=on_budget_exhausted, on_stop=on_stop,
                          estimate_request=estimate_request)
    extra = MappingProxyType(dict(context)) if context else EMPTY
    settings = LoopSettings(
        hooks=hooks, turn_budget=turn_budget, extra=extra,
        estimates=estimate_request is not None, slow_stop=on_stop is not None,
        should_continue=should_continue,
        persister=transcript_persister, lock=transcript_lock, writer=transcript_writer,
        session_id=transcript_session_id, ttl=transcript_lock_ttl,
        request=MappingProxyType(dict(request or {})),
        pending_calls=() if pending_tool_calls == () else _check_pending_calls(pending_tool_calls))
    return hooked_steps(messages, settings, budgets, on_event)


def hooked_steps(messages: Iterable[Message | Mapping[str, object]], settings: LoopSettings,
                 budgets: Iterable[IterationBudget] = (),
                 on_event: EventSink | EventListener | None = None) -> Steps[RunStop]:
    """One run of the loop on ``settings`` (a product's own hooks) as a step generator ending
    in its decided :class:`RunStop`; the arguments are checked first, each failure naming
    the argument."""
    budget_map = _budget_map(settings.turn_budget, budgets)
    _check_callable("should_continue", settings.should_continue,
                    "(turn_result, context) -> bool")
    if on_event is not None and not callable(on_event) and not callable(
            getattr(on_event, "emit", None)):
        raise _refused("on_event", "a callable (event, payload) or an object with an emit "
                       "method", on_event)
    _check_transcript(settings.persister, settings.lock, settings.writer)
    check_lock_ttl(settings.ttl)
    return LoopRun(settings, normalize_messages(messages), budget_map,
                   Emitter(on_event)).steps()


def check_lock_ttl(ttl: object, knob: str = "transcript_lock_ttl") -> int:
    """``ttl`` if it is an integer number of seconds in [1, 86400]; else InvalidLoopArgument."""
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= MAX_LOCK_TTL:
        raise InvalidLoopArgument(
            f"{knob} must be an integer number of seconds from 1 to {MAX_LOCK_TTL}, "
            f"got {ttl!r}.")
    return ttl


def _refused(argument: str, must_be: str, given: object) -> InvalidLoopArgument:
    """The refusal of one argument: its name, what it must be, and what was given."""
    return InvalidLoopArgument(f"{argument} must be {must_be}, got {brief_repr(given)}.")


def _check_callable(argument: str, given: object, signature: str) -> None:
    """Refuse an optional callable argument that was given but cannot be called."""
    if given is not None and not callable(given):
        raise _refused(argument, f"a callable {signature}", given)


def _check_mapping(argument: str, given: object) -> None:
    """Refuse an optional mapping argument that was given but is not a mapping."""
    if given is not None and not isinstance(given, Mapping):
        raise _refused(argument, "a mapping (a dict) or None", given)


def _budget_map(turn_budget: object, budgets: Iterable[object]) -> dict[str, IterationBudget]:
    if not isinstance(turn_budget, IterationBudget):
        raise InvalidLoopArgument("turn_budget must be an agents_api.IterationBudget.")
    found: dict[str, IterationBudget] = {turn_budget.name(): turn_budget}
    if not isinstance(budgets, Iterable):
        raise _refused("budgets", "an iterable of agents_api.IterationBudget objects", budgets)
    for extra in budgets:
        if not isinstance(extra, IterationBudget):
            raise InvalidLoopArgument(
                f"budgets must hold agents_api.IterationBudget objects, got {type(extra).__name__}."
            )
        found.setdefault(extra.name(), extra)
    return found


def _check_transcript(persister: object, lock: object, writer: object) -> None:
    if persister is not None and not callable(getattr(persister, "persist", None)):
        raise _refused("transcript_persister", "an object with a persist(messages, request, "
                       "result) method (see agents_api.TranscriptPersister)", persister)
    if lock is not None and not (callable(getattr(lock, "acquire", None))
                                 and callable(getattr(lock, "release", None))):
        raise _refused("transcript_lock", "an object with acquire(session_id, ttl) and "
                       "release(session_id, token) methods (see agents_api.TranscriptLock)",
                       lock)
    if writer is not None and (persister is not None or lock is not None):
        raise InvalidLoopArgument(
            "transcript_writer already holds its session: pass it alone, without "
            "transcript_persister or transcript_lock.")
    if writer is not None and not isinstance(writer, TranscriptWriter):
        raise InvalidLoopArgument(
            "transcript_writer must have session_id and begin, append_turn, renew, persist and "
            "release methods (see agents_api.TranscriptWriter).")


def _check_pending_calls(calls: Iterable[Mapping[str, object]] | None
                         ) -> tuple[dict[str, object], ...]:
    """Waiting calls as a paused run stored them: each a mapping naming its tool (None, as
    ever: none wait)."""
    if calls is None:
        return ()
    if isinstance(calls, str | bytes | Mapping) or not isinstance(calls, Iterable):
        raise _refused("pending_tool_calls", "a list of tool call dicts", calls)
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
