"""One run of the generic loop: :class:`LoopRun`, its phases, and the one place it stops.

:meth:`LoopRun.steps` is the whole run in a few lines: take the lock, store the starting
messages, run turns until an outcome is decided, ask the stop handler for its verdict, build
the result once, store it, give the lock back, emit the terminal event. Each turn is the same:
check the budgets, ask the turn runner, run the tools, store the turn, decide.

A phase that may have to await something is a generator that yields it (see
:mod:`agents_api.drive`), so one body serves :func:`~agents_api.run_loop` (no event loop while
everything is synchronous) and :func:`~agents_api.arun_loop`; the others are plain methods.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar, Union, cast

from agents_api import clock
from agents_api._tools import ToolExecutor, run_tool
from agents_api.budget import IterationBudget
from agents_api.drive import DeadlineReached, Steps, awaitable, bounded
from agents_api.errors import LockLost, brief_repr
from agents_api.events import Emitter
from agents_api.message import Message
from agents_api.names import TOOL_CALLS, WALL_CLOCK, per_tool_budget
from agents_api.pause import Pause
from agents_api.records import LoopStatus, Outcome, ToolCall, ToolOutcome
from agents_api.results import (
    Decision,
    LoopResult,
    RunStop,
    StopVerdict,
    TurnAnswer,
    TurnResult,
    coerce_turn_result,
    empty_usage,
    terminal_payload,
)
from agents_api.transcript import HeldLock, LegacyTranscript, TranscriptWriter
from agents_api.unchecked import unchecked
from agents_api.usage import plausible_usage, reported_usage

__all__ = ["BudgetExhaustedHook", "LoopRun", "LoopSettings", "RequestEstimate",
           "ShouldContinue", "StopHook", "ToolResultHook", "TurnRunner"]

logger = logging.getLogger("agents_api.loop")

T = TypeVar("T")
MaybeAwaitable: TypeAlias = Union[T, Awaitable[T]]  # noqa: UP007

TurnRunner = Callable[
    [list[Message], dict[str, Any]], MaybeAwaitable[TurnResult | TurnAnswer | Mapping[str, Any]]
]
ToolResultHook = Callable[
    [dict[str, Any], dict[str, Any], dict[str, Any]], MaybeAwaitable[Decision | None]
]
# True: the budget was extended; a Pause: stop and wait for a person (agents_api.pause).
BudgetExhaustedHook = Callable[[IterationBudget, dict[str, Any]],
                               MaybeAwaitable[bool | Pause | None]]
ShouldContinue = Callable[[TurnResult, dict[str, Any]], bool]
# Called once when a run stops, under the transcript lock, before the result is built: it sees
# the run (RunStop) and returns the StopVerdict the loop applies (or None: no change).
StopHook = Callable[[RunStop, dict[str, Any]], MaybeAwaitable[StopVerdict | None]]
# Asked before every turn (synchronously): what the coming request would add to budgets that
# count what requests spend, ``{budget_name: units}``. A request that would take a budget past
# its ceiling is not sent: the budget is offered for extension like a spent one, else the run
# stops on it. Whoever estimates also feeds those budgets with what answers report.
RequestEstimate = Callable[[list[Message], dict[str, Any]], Mapping[str, int]]

# The verdict fields that replace the loop's own when a stop handler sets them.
_OVERRIDES = ("status", "budget", "flags", "warning", "error", "error_code", "final_content",
              "pending")


@dataclass(frozen=True, slots=True)
class LoopSettings:
    """A run's validated arguments (see :func:`agents_api.run_loop`)."""

    turn_runner: TurnRunner
    turn_budget: IterationBudget
    tool_executor: ToolExecutor | None
    should_continue: ShouldContinue | None
    persister: Any
    lock: Any
    writer: TranscriptWriter | None
    session_id: str | None
    ttl: int
    context: dict[str, Any]
    request: dict[str, Any]
    on_tool_result: ToolResultHook | None
    on_budget_exhausted: BudgetExhaustedHook | None
    on_stop: StopHook | None
    # Calls a paused run left waiting, run before the first turn (see agents_api.pause).
    pending_calls: tuple[dict[str, Any], ...] = ()
    estimate_request: RequestEstimate | None = None


@dataclass(slots=True)
class _Turn:
    """One turn in progress: its number, where its messages start, what callables receive."""

    number: int
    start: int
    context: dict[str, Any]


@dataclass(slots=True)
class _ToolsRan:
    """What running a turn's tools found: a spent budget, a policy's word, a failing hook, a
    pause; ``waiting``: the calls that did not run because of the spent budget or the pause."""

    spent: IterationBudget | None = None
    complete: bool = False
    hook_error: Exception | None = None
    pause: Pause | None = None
    waiting: list[ToolCall] | None = None


class LoopRun:
    """The state of one run and its phases (see the module docstring)."""

    def __init__(self, settings: LoopSettings, messages: list[Message],
                 budgets: dict[str, IterationBudget], emitter: Emitter) -> None:
        self.settings = settings
        self.messages = messages
        # The final answer is this run's own: messages from here on (a continued session's
        # history may end with an earlier run's answer).
        self.first_new = len(messages)
        # Handed to the runner and the executor as context["budgets"]: a tool may add a budget
        # mid-run (ToolContext.budget), so every check reads this live mapping.
        self.budgets = budgets
        self.emitter = emitter
        self.wall_clock = budgets.get(WALL_CLOCK)
        self.wall_clock_start = self.wall_clock.current() if self.wall_clock is not None else 0
        self.tool_budget = budgets.get(TOOL_CALLS)
        self.per_tool: dict[str, str] = {}  # tool name -> the name of its own budget
        self.session_id = settings.session_id or (
            uuid.uuid4().hex if settings.persister is not None else None)
        if settings.writer is not None:
            self.session_id = settings.writer.session_id
        self.turn_count = 0
        self.usage: dict[str, Any] = {}  # what the requests reported (see reported_usage)
        self._usage_warned = False  # see _plausible_usage
        self.request_metadata: dict[str, Any] = {}
        self.tool_outcomes: list[ToolOutcome] = []
        self.last_calls: list[ToolCall] = []
        self.warnings: list[str] = []
        self.outcome: Outcome | None = None
        self.pending: dict[str, Any] | None = None  # what a paused run waits for
        # Units the refused request would have added to the budget that stopped the run.
        self.needed: int | None = None
        self._records: list[dict[str, Any]] | None = None  # made once the run has stopped
        self._rails_seen, self._time_rail = -1, False  # see _has_time_rail
        self.transcript: TranscriptWriter | LegacyTranscript | None = None
        self.started = clock.monotonic()

    # -- the skeleton -----------------------------------------------------------------------
    def steps(self) -> Steps[LoopResult]:
        """The run, start to finish."""
        if not (yield from self._acquire_lock()):
            return self._contended()
        try:
            if self.settings.pending_calls:
                yield from self._run_waiting_calls()
            yield from self._begin()
            while self.outcome is None:
                yield from self._turn()
            verdict = yield from self._ask_stop_handler()
            result = yield from self._store(self._build(verdict))
        finally:
            yield from self._release()
        self._emit_terminal(result)
        return result

    def _turn(self) -> Steps[None]:
        spent = self._spent_before_turn()
        if spent is not None and not (yield from self._extend(spent)):
            self._stop(Outcome("budget_exceeded", budget=spent))
            return
        if self.settings.estimate_request is not None and not (yield from self._request_fits()):
            return
        turn = self._start_turn()
        answer = yield from self._ask_runner(turn)
        if answer is None:
            return
        ran = yield from self._run_tools(turn, answer)
        ran = yield from self._extend_and_go_on(turn, ran)
        self.messages.extend(answer.continuation_messages)
        self.settings.turn_budget.increment()
        if self.transcript is not None and not (yield from self._store_turn(turn)):
            return
        if ran.pause is not None:
            self._pause(ran.pause, ran.waiting, turn.number)
            return
        self._decide(turn, answer, ran)

    def _extend_and_go_on(self, turn: _Turn, ran: _ToolsRan) -> Steps[_ToolsRan]:
        """A budget the turn's calls spent is offered for extension; granted, the calls that
        waited for it run now, in this turn (and may spend a budget again). Declined, they
        stay unrun and ``ran.spent`` stops the run; a pause for the answer stops it with them
        waiting."""
        while ran.spent is not None and ran.pause is None and ran.hook_error is None:
            if not (yield from self._extend(ran.spent, ran.waiting, turn.number)):
                return ran
            waiting, ran.spent, ran.waiting = ran.waiting or [], None, None
            if waiting:
                ran = yield from self._run_calls(turn, waiting, ran)
        return ran

    def _run_waiting_calls(self) -> Steps[None]:
        """A resumed run first runs the calls its paused run left waiting (in their own turn's
        name), before anything is stored: ``begin`` then stores their envelopes with the rest.
        They may pause the run again, or spend a budget, as any turn's calls may."""
        waiting = self.settings.pending_calls
        number = int(waiting[0].get("turn") or 0)
        turn = _Turn(number, len(self.messages), {
            **self.settings.context, "turn": number, "budgets": self.budgets,
            "session_id": self.session_id})
        ran = yield from self._run_tools(turn, TurnAnswer("", list(waiting)))
        ran = yield from self._extend_and_go_on(turn, ran)
        if ran.hook_error is not None:
            self._fail("tool_result_hook_failed", ran.hook_error)
        elif ran.pause is not None:
            self._pause(ran.pause, ran.waiting, number)
        elif ran.spent is not None:
            self._stop(Outcome("budget_exceeded", budget=ran.spent))
        elif ran.complete:
            self._stop(Outcome("completed"))

    # -- deciding ---------------------------------------------------------------------------
    def _stop(self, outcome: Outcome) -> None:
        """The one place the run's outcome is set: the first decision stands, except that a
        lost lock overrides any other (the run must then write nothing more)."""
        if self.outcome is None or outcome.error_code == LockLost.code:
            self.outcome = outcome

    def _fail(self, code: str, exc: BaseException) -> None:
        self._stop(Outcome.failure(code, exc))

    def _pause(self, pause: Pause, waiting: list[ToolCall] | None, turn: int) -> None:
        """Stop to wait for a person: what for, and the calls that wait with the run."""
        self._stop(Outcome("awaiting_confirmation"))
        if self.outcome is not None and self.outcome.status == "awaiting_confirmation":
            self.pending = {**pause.pending, "tool_calls": [
                {**call.mapping, "turn": turn} for call in waiting or ()]}

    def _decide(self, turn: _Turn, answer: TurnAnswer, ran: _ToolsRan) -> None:
        """After a stored turn: stop (and why) or go on to the next turn."""
        if ran.hook_error is not None:
            self._fail("tool_result_hook_failed", ran.hook_error)
            return
        if ran.spent is not None:
            self._stop(Outcome("budget_exceeded", budget=ran.spent))
            return
        if ran.complete or answer.complete:
            self._stop(Outcome("completed"))
            return
        should_continue = self.settings.should_continue
        try:
            keep_going = (bool(should_continue(answer.to_turn_result(), turn.context))
                          if should_continue is not None
                          else bool(self.last_calls or answer.continuation_messages))
        except Exception as exc:
            self._fail("should_continue_failed", exc)
            return
        if not keep_going:
            self._stop(Outcome("completed"))
        # Otherwise the next turn's budget check stops (or extends) a spent turn budget.

    # -- the lock and the transcript --------------------------------------------------------
    def _acquire_lock(self) -> Steps[bool]:
        """Take the session's lock (contention returns False before anything is touched)."""
        settings = self.settings
        if settings.writer is not None:
            self.transcript = settings.writer
            return True
        token: str | None = None
        if settings.lock is not None and self.session_id:
            acquired = settings.lock.acquire(self.session_id, settings.ttl)
            if awaitable(acquired):
                acquired = yield acquired
            if not acquired:
                return False
            token = str(acquired)
        self.transcript = self._open_transcript(token)
        return True

    def _open_transcript(self, token: str | None) -> TranscriptWriter | LegacyTranscript | None:
        settings = self.settings
        persister, lock = settings.persister, settings.lock
        if self.session_id is None or (persister is None and token is None):
            return None
        owner = lock.lock if isinstance(lock, HeldLock) else lock
        open_writer = getattr(persister, "open_writer", None)
        if open_writer is not None and (token is None or owner is persister):
            # The persister is also the lock: its writer proves the lock on every write.
            writer: TranscriptWriter = open_writer(self.session_id, token, settings.ttl)
            return writer
        return LegacyTranscript(persister, lock if token else None, self.session_id, token,
                                settings.ttl)

    def _contended(self) -> LoopResult:
        self.emitter.emit("transcript_lock_contention", {"session_id": self.session_id})
        self._stop(Outcome("transcript_lock_contention",
                           error=f"Transcript session {self.session_id!r} is locked by "
                                 "another run.",
                           error_code="transcript_lock_contention"))
        result = self._build(None)
        self._emit_terminal(result)
        return result

    def _begin(self) -> Steps[None]:
        """Store the starting messages now, so a run killed before its first turn keeps them."""
        if self.transcript is None:
            return
        try:
            begun = self.transcript.begin(self.messages, self.settings.request)
            if awaitable(begun):
                yield begun
        except Exception as exc:
            self._fail("transcript_write_failed", exc)

    def _store_turn(self, turn: _Turn) -> Steps[bool]:
        """Write the finished turn (one transaction) and renew the lock; False stops the run."""
        transcript = self.transcript
        if transcript is None or not getattr(transcript, "writes_turns", True):
            return True
        try:
            written = transcript.append_turn(turn.number, self.messages[turn.start:])
            if awaitable(written):
                yield written
            renewed = transcript.renew()
            if awaitable(renewed):
                yield renewed
        except Exception as exc:
            # A turn that cannot be stored ends the run: going on would lose work silently.
            self._fail("transcript_write_failed", exc)
            return False
        return True

    def _store(self, result: LoopResult) -> Steps[LoopResult]:
        """Persist the finished run; the stored id joins the result. Nothing is written after
        a lost lock or a failed write: what is stored then stays whole turns, and a run that
        lost its lock never writes over the run that took the session."""
        if self.transcript is None or self._stopped_writing():
            return result
        try:
            stored = self.transcript.persist(result.messages, self.settings.request, result)
            if awaitable(stored):
                stored = yield stored
        except LockLost as exc:
            self._fail("transcript_lock_lost", exc)
            return self._build(None, warnings=result.warnings)
        except Exception as exc:
            # The run's outcome stands; the caller learns that storage failed.
            logger.error("agents_api: transcript persister failed", exc_info=True)
            return result.model_copy(update={
                "warnings": [*result.warnings, f"Transcript could not be stored: {exc}"]})
        if isinstance(stored, str) and stored and stored != result.transcript_session_id:
            return result.model_copy(update={"transcript_session_id": stored})
        return result

    def _release(self) -> Steps[None]:
        if self.transcript is None:
            return
        try:
            released = self.transcript.release()
            if awaitable(released):
                yield released
        except Exception:
            logger.warning("agents_api: releasing transcript lock %r failed", self.session_id,
                           exc_info=True)

    def _lock_lost(self) -> bool:
        return self.outcome is not None and self.outcome.error_code == LockLost.code

    def _stopped_writing(self) -> bool:
        """The run stopped because a write failed or its lock was lost."""
        return self.outcome is not None and self.outcome.error_code in (
            LockLost.code, "transcript_write_failed")

    # -- budgets ----------------------------------------------------------------------------
    def _spent_before_turn(self) -> IterationBudget | None:
        """Before a turn: the wall clock moves, then the first budget already spent (a run
        resumed at its ceiling, a tool that spent an extension budget), if any."""
        self._tick_wall_clock()
        return self._first_exceeded()

    def _extend(self, budget: IterationBudget, waiting: list[ToolCall] | None = None,
                turn: int = 0, needed: int = 0) -> Steps[bool]:
        """Ask the host to extend a spent budget; only soft ceilings are ever offered. A
        :class:`Pause` for an answer stops the run (``waiting``: the calls of ``turn`` that
        the budget kept from running wait with it). ``needed``: the units a request that would
        pass the ceiling needs (the budget is not spent yet; extended, it must hold them)."""
        hook = self.settings.on_budget_exhausted
        if hook is None or not (_can_hold(budget, needed) if needed else budget.extendable()):
            return False
        try:
            answer = hook(budget, {"turn": self.turn_count, "budget": budget.name()})
            if awaitable(answer):
                answer = yield answer
        except Exception as exc:
            # A confirmation UI that crashes ends the run as an error, never as a raw exception.
            self._fail("budget_hook_failed", exc)
            return False
        if type(answer) is Pause:
            self._pause(answer, waiting, turn)
            return False
        if answer is True and (budget.current() + needed <= budget.ceiling() if needed
                               else not budget.exceeded()):
            self.emitter.emit("budget_extended", {"budget": budget.name(),
                                                  "ceiling": budget.ceiling(),
                                                  "current": budget.current()})
            return True
        return False

    def _request_fits(self) -> Steps[bool]:
        """Before a turn: whether its request fits every budget the estimate names. One that
        would pass its ceiling is offered for extension once; refused, the run stops on it and
        the request is never sent."""
        estimate = self.settings.estimate_request
        assert estimate is not None
        asked: set[str] = set()
        while True:
            try:
                needed = estimate(self.messages, {
                    **self.settings.context, "turn": self.turn_count + 1,
                    "budgets": self.budgets, "session_id": self.session_id})
                crossing = self._crossing(needed)
            except Exception as exc:
                self._fail("request_estimate_failed", exc)
                return False
            if crossing is None:
                return True
            budget, units = crossing
            if budget.name() in asked or not (yield from self._extend(budget, needed=units)):
                self.needed = units
                self._stop(Outcome("budget_exceeded", budget=budget))
                return False
            asked.add(budget.name())

    def _crossing(self, needed: Mapping[str, int]) -> tuple[IterationBudget, int] | None:
        """The first budget the estimated units would take past its ceiling, and the units."""
        for name, units in needed.items():
            budget = self.budgets.get(name)
            if budget is None:
                raise KeyError(f"estimate_request named {name!r}, which is not a budget of "
                               "this run")
            if isinstance(units, bool) or not isinstance(units, int) or units < 0:
                raise TypeError(f"estimate_request gave {name!r} {units!r} units; give a "
                                "non-negative integer")
            if budget.exceeded() or budget.current() + units > budget.ceiling():
                return budget, units
        return None

    def _first_exceeded(self, skip: IterationBudget | None = None) -> IterationBudget | None:
        for budget in self.budgets.values():
            if budget is not skip and budget.exceeded():
                return budget
        return None

    def _tick_wall_clock(self) -> None:
        if self.wall_clock is not None:
            self.wall_clock.set_current(
                self.wall_clock_start + int(clock.monotonic() - self.started))

    def _deadline_left(self) -> float | None:
        """Seconds until the earliest time rail of the run, or None when it has none."""
        left: float | None = None
        if self.wall_clock is not None:
            left = (self.wall_clock.ceiling() - self.wall_clock_start
                    - (clock.monotonic() - self.started))
        for budget in self.budgets.values():
            seconds = budget.seconds_left()
            if seconds is not None and (left is None or seconds < left):
                left = seconds
        return None if left is None else max(0.0, left)

    def _out_of_time(self) -> bool:
        """A time rail has run out (within a millisecond of clock jitter)."""
        if not self._has_time_rail():
            return False
        left = self._deadline_left()
        return left is not None and left <= 0.001

    def _has_time_rail(self) -> bool:
        # Checked for every turn with tool calls; budgets only join a run (a tool's own), so
        # the answer changes only when their number does.
        if len(self.budgets) != self._rails_seen:
            self._rails_seen = len(self.budgets)
            self._time_rail = self.wall_clock is not None or any(
                budget.max_seconds() is not None for budget in self.budgets.values())
        return self._time_rail

    def _spend_time(self) -> IterationBudget:
        """The time budget that stopped a cut call, marked spent."""
        for budget in self.budgets.values():
            if budget.max_seconds() is not None and budget.exceeded():
                return budget
        if self.wall_clock is not None:
            self.wall_clock.set_current(max(self.wall_clock.current(),
                                            self.wall_clock.ceiling()))
            return self.wall_clock
        return next(b for b in self.budgets.values() if b.max_seconds() is not None)

    # -- one turn ---------------------------------------------------------------------------
    def _start_turn(self) -> _Turn:
        self.turn_count += 1
        number = self.turn_count
        context = {**self.settings.context, "turn": number, "budgets": self.budgets,
                   "session_id": self.session_id}
        if self._has_time_rail():
            # A runner whose call cannot be cut (a synchronous HTTP request) bounds it itself.
            context["deadline"] = self._deadline_left()
        if self.emitter.listening:
            self.emitter.emit("turn_started", {
                "turn": number, "max_turns": self.settings.turn_budget.ceiling(),
                "message_count": len(self.messages)})
        return _Turn(number, len(self.messages), context)

    def _ask_runner(self, turn: _Turn) -> Steps[TurnAnswer | None]:
        """The turn runner's answer (None when the turn failed or the clock cut it)."""
        try:
            raw = self.settings.turn_runner(self.messages, turn.context)
            if awaitable(raw):
                left = self._deadline_left()
                raw = yield (raw if left is None else bounded(raw, left))
            answer = coerce_turn_result(raw, turn.number)
            if type(raw) is not TurnAnswer and answer.usage:
                # A runner that made every value itself returns a TurnAnswer; anything else
                # may report usage that cannot be true (agents_api.usage).
                answer.usage = self._plausible_usage(answer.usage)
        except Exception as exc:
            if not (isinstance(exc, DeadlineReached) or self._out_of_time()):
                # Reported once, by the terminal ``failed`` event (it carries the error).
                logger.info("agents_api: turn %d failed: %s", turn.number, exc)
                self._fail("turn_failed", exc)
                return None
            # The wall clock ran out while the provider was still answering (the call was
            # cancelled, or gave up at the deadline it was given): the run stops on its time
            # budget.
            budget = self._spend_time()
            self.emitter.emit("turn_interrupted", {"turn": turn.number, "reason": "deadline",
                                                   "budget": budget.name()})
            self._stop(Outcome("budget_exceeded", budget=budget))
            return None
        _add_usage(self.usage, answer.usage)
        if answer.request_metadata:
            self.request_metadata = answer.request_metadata
        if answer.content:
            self.messages.append(Message.text("assistant", answer.content))
        return answer

    def _plausible_usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        """``usage`` without the numbers that cannot be true (a negative, fractional, NaN or
        bool count, anything above 10^12): those fields count as not reported, and the run
        says so once."""
        ignored = plausible_usage(usage)[1]
        if not ignored:
            return usage
        if not self._usage_warned:
            self._usage_warned = True
            logger.warning(
                "agents_api: the turn runner reported usage that cannot be true (%s); those "
                "fields were treated as not reported. Logged once per run.",
                ", ".join(f"{key}={brief_repr(value, 40)}" for key, value in ignored.items()))
        return {key: value for key, value in usage.items() if key not in ignored}

    def _run_tools(self, turn: _Turn, answer: TurnAnswer) -> Steps[_ToolsRan]:
        """Run the turn's calls in order; tool budgets are checked before each call, every
        budget after it."""
        self.last_calls = calls = self._calls(turn, answer)
        ran = _ToolsRan()
        if answer.pause is not None:  # the runner paused the run: no call runs, all wait
            ran.pause, ran.waiting = Pause(answer.pause), calls
            return ran
        if calls and self.settings.estimate_request is not None:
            # The answer's own spend (its reported tokens) may have used a budget up: then
            # none of its calls runs; they wait with the run for an extension.
            ran.spent = self._first_exceeded(skip=self.settings.turn_budget)
            if ran.spent is not None:
                ran.waiting = calls
                return ran
        return (yield from self._run_calls(turn, calls, ran))

    def _run_calls(self, turn: _Turn, calls: list[ToolCall], ran: _ToolsRan
                   ) -> Steps[_ToolsRan]:
        """Run ``calls`` in order into ``ran`` (see :meth:`_run_tools`)."""
        timed = bool(calls) and self._has_time_rail()
        for index, call in enumerate(calls):
            per_tool = self.per_tool.get(call.name)
            if per_tool is None:
                per_tool = self.per_tool[call.name] = per_tool_budget(call.name)
            ran.spent = self._spent_tool_budget(per_tool)
            if ran.spent is not None:
                ran.waiting = calls[index:]
                break
            outcome = yield from run_tool(
                call, turn.number, turn.context, self.settings.tool_executor, self.messages,
                self.emitter.emit, self.emitter.listening,
                self._deadline_left() if timed else None)
            if type(outcome) is not ToolOutcome:  # a Pause: the call did not run, it waits
                ran.pause, ran.waiting = cast(Pause, outcome), calls[index:]
                break
            self.tool_outcomes.append(outcome)
            self._count_tool_call(per_tool)
            hook = self.settings.on_tool_result
            if hook is not None:
                try:
                    decision = hook(call.mapping, outcome.result, turn.context)
                    if awaitable(decision):
                        decision = yield decision
                except Exception as exc:
                    # A policy that raises ends the run as an error; the turn so far is kept.
                    ran.hook_error = exc
                    break
                self._apply(decision, ran)
            self._tick_wall_clock()
            ran.spent = self._first_exceeded(skip=self.settings.turn_budget)
            if ran.spent is not None:
                ran.waiting = calls[index + 1:]
                break
        return ran

    @staticmethod
    def _calls(turn: _Turn, answer: TurnAnswer) -> list[ToolCall]:
        calls = []
        for index, raw in enumerate(answer.tool_calls, start=1):
            call = ToolCall.from_model(raw, turn.number, index)
            if call is not None:
                calls.append(call)
        return calls

    def _spent_tool_budget(self, per_tool: str) -> IterationBudget | None:
        if self.tool_budget is not None and self.tool_budget.exceeded():
            return self.tool_budget
        budget = self.budgets.get(per_tool)
        return budget if budget is not None and budget.exceeded() else None

    def _count_tool_call(self, per_tool: str) -> None:
        if self.tool_budget is not None:
            self.tool_budget.increment()
        # Looked up after the call: the tool may have created its own budget just now.
        budget = self.budgets.get(per_tool)
        if budget is not None:
            budget.increment()

    def _apply(self, decision: object, ran: _ToolsRan) -> None:
        """A completion policy's word on one result: done, or a message for the model."""
        if isinstance(decision, Decision):
            if decision.complete:
                ran.complete = True
            elif decision.message:
                self.messages.append(Message.text("user", decision.message,
                                                  {"type": "completion_policy_continue"}))

    # -- the end ----------------------------------------------------------------------------
    def _ask_stop_handler(self) -> Steps[StopVerdict | None]:
        """Announce a budget stop, then let the stop handler (a final summary, the product's
        verdict) have its say, still under the lock."""
        outcome = self.outcome
        assert outcome is not None
        if outcome.status == "budget_exceeded" and outcome.budget is not None:
            payload = _exceeded_payload(outcome.budget)
            if self.needed is not None:
                payload["needed"] = self.needed  # the refused request's estimate
            self.emitter.emit("budget_exceeded", payload)
        handler = self.settings.on_stop
        if handler is None:
            return None
        try:
            if self.transcript is not None and not self._lock_lost():
                # The stop handler may make one more provider call: keep the lock for it.
                renewed = self.transcript.renew()
                if awaitable(renewed):
                    yield renewed
            answer = handler(self._stop_view(), {
                **self.settings.context, "budgets": self.budgets,
                "session_id": self.session_id, "deadline": self._deadline_left()})
            if awaitable(answer):
                answer = yield answer
        except LockLost as exc:
            self._fail("transcript_lock_lost", exc)
            return None
        except Exception as exc:
            logger.error("agents_api: on_stop hook failed", exc_info=True)
            self.warnings.append(f"The run's stop handler failed: {exc}")
            return None
        if answer is not None and not isinstance(answer, StopVerdict):
            self.warnings.append("The run's stop handler returned "
                                 f"{type(answer).__name__}, not a StopVerdict; ignored.")
            return None
        return answer

    def _stop_view(self) -> RunStop:
        outcome = self.outcome
        assert outcome is not None
        budget = outcome.budget
        return RunStop(
            status=outcome.status, budget=budget.name() if budget is not None else None,
            error=outcome.error, error_code=outcome.error_code, messages=self.messages,
            final_content=_final_content(self.messages, self.first_new),
            turn_count=self.turn_count,
            usage=dict(self.usage), budgets=self._snapshots(),
            last_tool_calls=[call.mapping for call in self.last_calls],
            tool_execution_results=self._tool_records(),
            session_id=self.session_id,
            flags=[budget.to_response_flag()] if budget is not None else [],
            warning=budget.to_warning() if budget is not None else None, pending=self.pending)

    def _tool_records(self) -> list[dict[str, Any]]:
        if self._records is None:
            self._records = [outcome.record() for outcome in self.tool_outcomes]
        return self._records

    def _snapshots(self) -> dict[str, dict[str, Any]]:
        return {name: budget.snapshot() for name, budget in self.budgets.items()}

    def _build(self, verdict: StopVerdict | None, *,
               warnings: list[str] | None = None) -> LoopResult:
        """The result, built once: the loop's outcome with the stop handler's verdict applied
        (after a lost lock, only its warnings: the run's own verdict is the lost lock)."""
        outcome = self.outcome
        assert outcome is not None
        budget = outcome.budget
        fields: dict[str, Any] = {
            "status": outcome.status, "budget": budget.name() if budget is not None else None,
            "flags": [budget.to_response_flag()] if budget is not None else [],
            "warning": budget.to_warning() if budget is not None else None,
            "error": outcome.error, "error_code": outcome.error_code, "pending": self.pending}
        messages, usage = self.messages, dict(self.usage)
        noted = list(warnings) if warnings is not None else list(self.warnings)
        metadata: dict[str, Any] = {}
        if verdict is not None:
            noted += [w for w in verdict.warnings if w not in noted]
        if verdict is not None and not self._lock_lost():
            messages = [*messages, *verdict.messages]
            given = verdict.model_fields_set  # a property: read once, not once per name
            fields.update({name: getattr(verdict, name) for name in _OVERRIDES if name in given})
            _add_usage(usage, verdict.usage)
            metadata = dict(verdict.metadata)
        fields.setdefault("final_content", _final_content(messages, self.first_new))
        status: LoopStatus = fields.pop("status")
        if status != "awaiting_confirmation":
            fields["pending"] = None
        return unchecked(
            LoopResult,
            messages=messages, turn_count=self.turn_count,
            completed=status == "completed", status=status,
            usage=reported_usage(usage) if self.turn_count else empty_usage(),
            tool_execution_results=self._tool_records(),
            last_tool_calls=[call.mapping for call in self.last_calls],
            request_metadata=self.request_metadata, budgets=self._snapshots(),
            transcript_session_id=self.session_id, warnings=noted, metadata=metadata,
            **fields)

    def _emit_terminal(self, result: LoopResult) -> None:
        self.emitter.emit("failed" if result.status == "error" else "completed",
                          terminal_payload(result))


def _add_usage(total: dict[str, Any], usage: Mapping[str, Any]) -> None:
    for key, value in usage.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            previous = total.get(key, 0)
            if isinstance(previous, int | float) and not isinstance(previous, bool):
                total[key] = previous + value
                continue
        total[key] = value


def _can_hold(budget: IterationBudget, needed: int) -> bool:
    """Whether extending ``budget`` could make room for ``needed`` more units."""
    hard = budget.hard_ceiling()
    return (budget.exhausted_rail() in (None, "ceiling")
            and (hard is None or budget.current() + needed <= hard))


def _final_content(messages: list[Message], start: int = 0) -> str:
    """The last assistant text among ``messages[start:]``: never an earlier run's answer."""
    for index in range(len(messages) - 1, start - 1, -1):
        message = messages[index]
        if (message.role == "assistant" and message.type == "text"
                and isinstance(message.content, str) and message.content):
            return message.content
    return ""


def _exceeded_payload(budget: IterationBudget) -> dict[str, Any]:
    name = budget.name()
    if name == WALL_CLOCK:
        dimension = "wall_clock"
    elif name.startswith(TOOL_CALLS):
        dimension = TOOL_CALLS
    else:
        dimension = name
    return {"budget": name, "dimension": dimension, "current": budget.current(),
            "ceiling": budget.ceiling(), "rail": budget.exhausted_rail()}
