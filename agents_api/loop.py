"""The generic loop itself: :class:`LoopRun`, its phases, and the one place it stops.

:meth:`LoopRun.steps` is the whole run in a few lines: take the lock, store the starting
messages, run turns until an outcome is decided, ask the ``stop`` hook for the verdict, store the
end once, give the lock back, emit the terminal event. Each turn is the same: check the budgets,
ask ``run_turn``, run the tools (``run_tool``, ``after_tool``), store the turn, decide. What the
loop asks the product goes through :class:`~agents_api.hooks.LoopHooks`, with a frozen
:class:`~agents_api.hooks.TurnContext`.

A phase that may have to await something is a generator that yields it (see
:mod:`agents_api.drive`), so one body serves :func:`~agents_api.run_loop` (no event loop while
everything is synchronous) and :func:`~agents_api.arun_loop`; the others are plain methods.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, cast

from agents_api import clock
from agents_api.budget import (
    TOOL_CALLS,
    WALL_CLOCK,
    BudgetSpent,
    IterationBudget,
    per_tool_budget,
    spent_payload,
)
from agents_api.drive import DeadlineReached, Steps, ThreadCall, awaitable, bounded
from agents_api.errors import LockLost, brief_repr
from agents_api.hooks import EventListener, EventSink, LoopSettings, TurnContext
from agents_api.jsontext import compact_json
from agents_api.message import Message
from agents_api.pause import Pause
from agents_api.records import Outcome, ToolCall, ToolOutcome
from agents_api.results import (
    Decision,
    LoopResult,
    RunStop,
    StopVerdict,
    TurnAnswer,
    add_usage,
    coerce_turn_result,
    empty_usage,
    final_content,
    terminal_payload,
)
from agents_api.transcript import HeldLock, LegacyTranscript, TranscriptWriter
from agents_api.usage import Usage, plausible_usage, reported_usage

if TYPE_CHECKING:
    from agents_api.budget import BudgetSnapshot
    from agents_api.records import ToolCallDict, ToolRecord

__all__ = ["Emitter", "LoopRun", "normalize_tool_result", "tool_result_content"]

logger = logging.getLogger("agents_api.loop")


@dataclass(slots=True)
class _Turn:
    """One turn in progress: its number, where its messages start, what hooks receive."""

    number: int
    start: int
    context: TurnContext
    timed: bool = False  # the run has a time rail: calls run where they can be cut


@dataclass(slots=True)
class _ToolsRan:
    """What running a turn's tools found: a spent budget, a policy's word, a failing hook, a
    pause; ``waiting``: the calls that did not run because of the spent budget or the pause."""

    spent: IterationBudget | None = None
    complete: bool = False
    hook_error: Exception | None = None
    pause: Pause | None = None
    waiting: list[ToolCall] | None = None


def normalize_tool_result(raw: object) -> dict[str, object]:
    """``{"success": bool, "result"| "error": ...}`` from whatever a tool run returned."""
    if (type(raw) is dict or isinstance(raw, Mapping)) and type(raw.get("success")) is bool:
        result = dict(raw)  # the tool's dict stays its own
        if not result["success"]:
            error = result.get("error")
            result["error"] = str(error) if error not in (None, "") else "Tool execution failed."
        return result
    return {"success": True, "result": raw}


def tool_result_content(result: Mapping[str, object]) -> str:
    """What the model reads for a tool result: the JSON of ``result``, or the error text."""
    if not result.get("success"):
        return str(result.get("error", "Tool execution failed."))
    value = result.get("result")
    if isinstance(value, str):
        return value
    try:
        return compact_json(value)
    except (TypeError, ValueError):
        return str(value)


def _failure(error: str, error_type: str) -> dict[str, object]:
    return {"success": False, "error": error, "error_type": error_type}


class Emitter:
    """``emit(event, payload)`` to one sink (a callable, or an object with an ``emit``
    method), guarded.

    A sink that declares ``never_raises = True`` (it guards itself, as datamachine's run
    emitter does) is called directly; any other is wrapped so its exceptions are logged. A sink
    that declares ``per_turn_events = False`` is handed only the events the loop emits whatever
    happens (budgets, lock contention, the terminal event), never the per-turn ones, whose
    payloads are then not built (datamachine records the former with every run).
    """

    __slots__ = ("emit", "listening")

    def __init__(self, sink: EventSink | EventListener | None) -> None:
        self.listening = sink is not None and getattr(sink, "per_turn_events", True) is not False
        if sink is None:
            self.emit: Callable[[str, dict[str, object]], None] = _nothing
            return
        method = getattr(sink, "emit", None)  # an object with emit(), else a callable
        call = cast(EventSink, method if callable(method) else sink)
        if getattr(sink, "never_raises", False) is True:
            self.emit = cast(Callable[[str, dict[str, object]], None], call)  # result ignored
        else:
            self.emit = _guarded(call)


def _nothing(event: str, payload: dict[str, object]) -> None:
    return None


def _guarded(sink: EventSink) -> Callable[[str, dict[str, object]], None]:
    def emit(event: str, payload: dict[str, object]) -> None:
        try:
            sink(event, payload)
        except Exception:
            # An observer must never change a run's outcome.
            logger.warning("agents_api: event sink failed on %r", event, exc_info=True)

    return emit


class LoopRun:
    """The state of one run and its phases (see the module docstring)."""

    def __init__(self, settings: LoopSettings, messages: list[Message],
                 budgets: dict[str, IterationBudget], emitter: Emitter) -> None:
        self.settings = settings
        self.hooks = settings.hooks
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
        # Every turn's context is this one with the turn's number and deadline.
        self.context = TurnContext(0, budgets, self.session_id, None, settings.mode,
                                   settings.payload, settings.extra)
        self.turn_count = 0
        self.usage: Usage = {}  # what the requests reported (see agents_api.usage)
        self._usage_warned = False  # see _plausible_usage
        self.request_metadata: dict[str, object] = {}
        self.tool_outcomes: list[ToolOutcome] = []
        self.last_calls: list[ToolCall] = []
        self.warnings: list[str] = []
        self.outcome: Outcome | None = None
        self.verdict: StopVerdict | None = None  # the stop hook's answer, once given
        self.pending: dict[str, object] | None = None  # what a paused run waits for
        # Units the refused request would have added to the budget that stopped the run.
        self.needed: int | None = None
        self._records: list[ToolRecord] | None = None  # made once the run has stopped
        self._rails_seen, self._time_rail = -1, False  # see _has_time_rail
        self.transcript: TranscriptWriter | LegacyTranscript | None = None
        self.started = clock.monotonic()
        # The coming turn's context, made for its estimate (see _request_fits).
        self._next: TurnContext | None = None

    # -- the skeleton -----------------------------------------------------------------------
    def steps(self) -> Steps[RunStop]:
        """The run, start to finish: its decided end (see :meth:`RunStop.decided`)."""
        if not (yield from self._acquire_lock()):
            return self._contended()
        transcript = self.transcript
        if transcript is not None and not isinstance(transcript, LegacyTranscript):
            self.context = replace(self.context, transcript=transcript)
        try:
            declined = self.budgets.get(self.settings.stop_on_budget or "")
            if declined is not None:  # a person said no: nothing else is asked or run
                self._stop(Outcome("budget_exceeded", budget=declined))
            elif self.settings.pending_calls:
                yield from self._run_waiting_calls()
            yield from self._begin()
            while self.outcome is None:
                yield from self._turn()
            stop = self._stop_view()
            verdict = yield from self._ask_stop_hook(stop)
            end = yield from self._store(self._decided(verdict, stop))
        finally:
            yield from self._release()
        self._emit_terminal(end)
        return end

    def _turn(self) -> Steps[None]:
        # Phases with nothing to do are not entered: each is a generator, and a turn of a
        # long run is mostly the model's answer and one call.
        if self.wall_clock is not None:
            self._tick_wall_clock()
        spent = self._first_exceeded()  # a run resumed at its ceiling, a spent tool budget
        if spent is not None and not (yield from self._extend(spent)):
            self._stop(Outcome("budget_exceeded", budget=spent))
            return
        if self.settings.estimates and not (yield from self._request_fits()):
            return
        turn = self._start_turn()
        try:
            raw: object = self.hooks.run_turn(self.messages, turn.context)
            if type(raw) is not TurnAnswer and awaitable(raw):
                left = self._deadline_left()
                raw = yield (raw if left is None else bounded(raw, left))
            answer = self._answer(raw, turn.number)
        except BudgetSpent as spent:
            # The request could not be made within a budget: no turn was taken.
            self.turn_count -= 1
            self._stop_on(spent)
            return
        except Exception as exc:
            self._turn_failed(turn.number, exc)
            return
        calls = self.last_calls = self._calls(turn.number, answer)
        ran = self._before_calls(answer, calls)
        if ran is None:
            ran = _ToolsRan()
            if calls:
                ran = yield from self._run_calls(turn, calls, ran)
        if ran.spent is not None:
            ran = yield from self._extend_and_go_on(turn, ran)
        if answer.continuation_messages:
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
        number = cast(int, waiting[0].get("turn") or 0)
        turn = _Turn(number, len(self.messages), self.context.with_turn(number, None))
        calls = self.last_calls = self._calls(number, TurnAnswer("", [dict(c) for c in waiting]))
        ran = yield from self._run_calls(turn, calls, _ToolsRan())
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

    def _stop_on(self, spent: BudgetSpent) -> None:
        """A hook found the coming request cannot be made within a budget: the run stops on
        it (a budget the run did not have yet joins its budgets, so the result shows it)."""
        budget = spent.budget
        self.budgets.setdefault(budget.name(), budget)
        logger.info("agents_api: stopping on budget %r: %s", budget.name(), spent)
        self._stop(Outcome("budget_exceeded", budget=budget))

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
            keep_going = (bool(should_continue(answer.to_turn_result(), turn.context.as_dict()))
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
            acquired: object = settings.lock.acquire(self.session_id, settings.ttl)
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
        owner: object = lock.lock if isinstance(lock, HeldLock) else lock
        open_writer = getattr(persister, "open_writer", None)
        if open_writer is not None and (token is None or owner is persister):
            # The persister is also the lock: its writer proves the lock on every write.
            writer: TranscriptWriter = open_writer(self.session_id, token, settings.ttl)
            return writer
        return LegacyTranscript(persister, lock if token else None, self.session_id, token,
                                settings.ttl)

    def _contended(self) -> RunStop:
        self.emitter.emit("transcript_lock_contention", {"session_id": self.session_id})
        self._stop(Outcome("transcript_lock_contention",
                           error=f"Transcript session {self.session_id!r} is locked by "
                                 "another run.",
                           error_code="transcript_lock_contention"))
        end = self._decided(None)
        self._emit_terminal(end)
        return end

    def _begin(self) -> Steps[None]:
        """Store the starting messages now, so a run killed before its first turn keeps them."""
        if self.transcript is None:
            return
        try:
            begun = self.transcript.begin(self.messages, dict(self.settings.request))
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

    def _store(self, end: RunStop) -> Steps[RunStop]:
        """Persist the finished run; the stored id joins its end. Nothing is written after a
        lost lock or a failed write: what is stored then stays whole turns, and a run that
        lost its lock never writes over the run that took the session."""
        if self.transcript is None or self._stopped_writing():
            return end
        try:
            stored = self.transcript.persist(end.messages, dict(self.settings.request),
                                             LoopResult.of(end))
            if awaitable(stored):
                stored = yield stored
        except LockLost as exc:
            self._fail("transcript_lock_lost", exc)
            return self._decided(self.verdict, warnings=end.warnings)
        except Exception as exc:
            # The run's outcome stands; the caller learns that storage failed.
            logger.error("agents_api: transcript persister failed", exc_info=True)
            return replace(end, warnings=[*end.warnings,
                                          f"Transcript could not be stored: {exc}"])
        if isinstance(stored, str) and stored and stored != end.session_id:
            return replace(end, session_id=stored)
        return end

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
    def _extend(self, budget: IterationBudget, waiting: list[ToolCall] | None = None,
                turn: int = 0, needed: int = 0) -> Steps[bool]:
        """Ask the host to extend a spent budget; only soft ceilings are ever offered. A
        :class:`Pause` for an answer stops the run (``waiting``: the calls of ``turn`` that
        the budget kept from running wait with it). ``needed``: the units a request that would
        pass the ceiling needs (the budget is not spent yet; extended, it must hold them)."""
        if not (_can_hold(budget, needed) if needed else budget.extendable()):
            return False
        try:
            answer: object = self.hooks.budget_spent(budget, self.context.with_turn(
                self.turn_count, None))
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
        asked: set[str] = set()
        context = self._next = self.context.with_turn(self.turn_count + 1, None)
        while True:
            try:
                needed: object = self.hooks.estimate_request(self.messages, context)
                if awaitable(needed):
                    needed = yield needed
                crossing = (self._crossing(cast("Mapping[str, int]", needed)) if needed
                            else None)
            except BudgetSpent as spent:
                self._stop_on(spent)
                return False
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
        # A provider whose call cannot be cut (a synchronous HTTP request) bounds it itself.
        base, timed = self.context, self._has_time_rail()
        context = self._next  # the estimate's, when there was one and no deadline differs
        if timed or context is None or context.turn != number:
            context = TurnContext(number, base.budgets, base.session_id,
                                  self._deadline_left() if timed else None,
                                  base.mode, base.payload, base.extra, base.transcript)
        self._next = None
        if self.emitter.listening:
            self.emitter.emit("turn_started", {
                "turn": number, "max_turns": self.settings.turn_budget.ceiling(),
                "message_count": len(self.messages)})
        return _Turn(number, len(self.messages), context, timed)

    def _answer(self, raw: object, number: int) -> TurnAnswer:
        """The ``run_turn`` hook's answer, checked and taken in: its usage, its text."""
        if type(raw) is TurnAnswer:
            answer = raw  # made by a product that vouches for every value (see TurnAnswer)
        else:
            answer = coerce_turn_result(raw, number)
            if answer.usage:
                # Anything but a TurnAnswer may report usage that cannot be true
                # (agents_api.usage).
                answer.usage = self._plausible_usage(answer.usage)
        if answer.usage:
            add_usage(self.usage, answer.usage)
        if answer.request_metadata:
            self.request_metadata = answer.request_metadata
        if answer.content:
            self.messages.append(Message.text("assistant", answer.content))
        return answer

    def _turn_failed(self, number: int, exc: Exception) -> None:
        """The turn's hook raised, or the clock cut it: the run stops."""
        if not (isinstance(exc, DeadlineReached) or self._out_of_time()):
            # Reported once, by the terminal ``failed`` event (it carries the error).
            logger.info("agents_api: turn %d failed: %s", number, exc)
            self._fail("turn_failed", exc)
            return
        # The wall clock ran out while the provider was still answering (the call was
        # cancelled, or gave up at the deadline it was given): the run stops on its time
        # budget.
        budget = self._spend_time()
        self.emitter.emit("turn_interrupted", {"turn": number, "reason": "deadline",
                                               "budget": budget.name()})
        self._stop(Outcome("budget_exceeded", budget=budget))

    def _plausible_usage(self, usage: Usage) -> Usage:
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

    def _before_calls(self, answer: TurnAnswer, calls: list[ToolCall]) -> _ToolsRan | None:
        """Why none of the turn's calls may run (a pause, a budget the answer itself spent),
        or None: they run in order, tool budgets checked before each, every budget after."""
        if answer.pause is not None:  # the runner paused the run: no call runs, all wait
            return _ToolsRan(pause=Pause(answer.pause), waiting=calls)
        if calls and self.settings.estimates:
            # The answer's own spend (its reported tokens) may have used a budget up: then
            # none of its calls runs; they wait with the run for an extension.
            spent = self._first_exceeded(skip=self.settings.turn_budget)
            if spent is not None:
                return _ToolsRan(spent=spent, waiting=calls)
        return None

    def _run_calls(self, turn: _Turn, calls: list[ToolCall], ran: _ToolsRan
                   ) -> Steps[_ToolsRan]:
        """Run ``calls`` in order into ``ran``: each through ``run_tool`` with its two
        envelopes appended, then ``after_tool``; tool budgets are checked before each call,
        every budget after it.

        Every way a call can fail (an exception, the run's time limit) becomes a failed
        result the model reads; it never ends the run. A :class:`Pause` means the call did not
        run: its envelope is taken back, and it and the calls after it wait with the run (see
        :mod:`agents_api.pause`).
        """
        # A tool of an earlier turn may have added a budget with a time rail.
        timed = turn.timed or (len(self.budgets) != self._rails_seen and self._has_time_rail())
        hooks, messages, context = self.hooks, self.messages, turn.context
        for index, call in enumerate(calls):
            per_tool = self.per_tool.get(call.name)
            if per_tool is None:
                per_tool = self.per_tool[call.name] = per_tool_budget(call.name)
            ran.spent = self._spent_tool_budget(per_tool)
            if ran.spent is not None:
                ran.waiting = calls[index:]
                break
            self._call_started(call, turn.number)
            try:
                if not timed:
                    raw = hooks.run_tool(call, messages, context)
                    if type(raw) is not dict and awaitable(raw):
                        raw = yield raw
                else:
                    # Under a wall-clock rail a tool runs where the run can stop waiting for
                    # it: a sync tool in a daemon thread, an async one under a timeout.
                    raw = yield ThreadCall(hooks.run_tool, (call, messages, context),
                                           cast(float, self._deadline_left()))
            except DeadlineReached:
                logger.warning("agents_api: tool %r outlived the run's time limit; its late "
                               "result will be discarded", call.name)
                raw = _failure(f"Tool '{call.name}' did not finish before the run's time "
                               "limit.", "deadline_exceeded")
            except Exception as exc:
                raw = _failure(f"Tool '{call.name}' raised: {exc}", "executor_exception")
            if type(raw) is Pause:
                messages.pop()  # the call did not run: it waits
                ran.pause, ran.waiting = raw, calls[index:]
                break
            outcome = self._call_ended(call, turn.number, raw)
            self._count_tool_call(per_tool)
            try:
                decision: object = hooks.after_tool(outcome, context)
                if decision is not None and type(decision) is not Decision \
                        and awaitable(decision):
                    decision = yield decision
            except Exception as exc:
                # A policy that raises ends the run as an error; the turn so far is kept.
                ran.hook_error = exc
                break
            if decision is not None:
                self._apply(decision, ran)
            if self.wall_clock is not None:
                self._tick_wall_clock()
            ran.spent = self._first_exceeded(skip=self.settings.turn_budget)
            if ran.spent is not None:
                ran.waiting = calls[index + 1:]
                break
        return ran

    def _call_started(self, call: ToolCall, number: int) -> None:
        self.messages.append(Message.tool_call(call.name, call.parameters, number, call.id))
        if self.emitter.listening:
            self.emitter.emit("tool_call", {"turn": number, "tool_name": call.name,
                                            "tool_call_id": call.id,
                                            "parameters": call.parameters})

    def _call_ended(self, call: ToolCall, number: int, raw: object) -> ToolOutcome:
        result = normalize_tool_result(raw)
        self.messages.append(Message.tool_result(call.name, result, number, call.id,
                                                 tool_result_content(result)))
        if self.emitter.listening:
            self.emitter.emit("tool_result", {"turn": number, "tool_name": call.name,
                                              "tool_call_id": call.id,
                                              "success": result["success"], "result": result})
        outcome = ToolOutcome(call, number, result)
        self.tool_outcomes.append(outcome)
        return outcome

    @staticmethod
    def _calls(number: int, answer: TurnAnswer) -> list[ToolCall]:
        calls = []
        for index, raw in enumerate(answer.tool_calls, start=1):
            call = ToolCall.from_model(raw, number, index)
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
    def _ask_stop_hook(self, stop: RunStop) -> Steps[StopVerdict | None]:
        """Announce a budget stop, then let the ``stop`` hook (a final summary, the product's
        verdict) have its say on ``stop``, still under the lock."""
        outcome = self.outcome
        assert outcome is not None
        if outcome.status == "budget_exceeded" and outcome.budget is not None:
            payload = spent_payload(outcome.budget)
            if self.needed is not None:
                payload["needed"] = self.needed  # the refused request's estimate
            self.emitter.emit("budget_exceeded", payload)
        try:
            if (self.settings.slow_stop and self.transcript is not None
                    and not self._lock_lost()):
                # The stop hook may make one more provider call: keep the lock for it.
                renewed = self.transcript.renew()
                if awaitable(renewed):
                    yield renewed
            answer: object = self.hooks.stop(stop, self.context.with_turn(
                self.turn_count, self._deadline_left()))
            if awaitable(answer):
                answer = yield answer
        except LockLost as exc:
            self._fail("transcript_lock_lost", exc)
            return None
        except Exception as exc:
            logger.error("agents_api: the stop hook failed", exc_info=True)
            self.warnings.append(f"The run's stop handler failed: {exc}")
            return None
        if answer is not None and not isinstance(answer, StopVerdict):
            self.warnings.append("The run's stop handler returned "
                                 f"{type(answer).__name__}, not a StopVerdict; ignored.")
            return None
        self.verdict = answer
        return answer

    def _stop_view(self, warnings: list[str] | None = None) -> RunStop:
        """The run as the loop stopped it (before any verdict)."""
        outcome = self.outcome
        assert outcome is not None
        budget = outcome.budget
        return RunStop(
            status=outcome.status, budget=budget.name() if budget is not None else None,
            error=outcome.error, error_code=outcome.error_code, messages=self.messages,
            final_content=final_content(self.messages, self.first_new),
            turn_count=self.turn_count,
            usage=reported_usage(self.usage) if self.turn_count else empty_usage(),
            budgets=self._snapshots(),
            # Each call's mapping is the ToolCallDict ToolCall.from_model made.
            last_tool_calls=cast("list[ToolCallDict]", [call.mapping for call in self.last_calls]),
            tool_execution_results=self._tool_records(),
            session_id=self.session_id,
            flags=[budget.to_response_flag()] if budget is not None else [],
            warning=budget.to_warning() if budget is not None else None, pending=self.pending,
            warnings=list(self.warnings if warnings is None else warnings),
            request_metadata=self.request_metadata)

    def _tool_records(self) -> list[ToolRecord]:
        if self._records is None:
            self._records = [outcome.record() for outcome in self.tool_outcomes]
        return self._records

    def _snapshots(self) -> dict[str, BudgetSnapshot]:
        return {name: budget.snapshot() for name, budget in self.budgets.items()}

    def _decided(self, verdict: StopVerdict | None, stop: RunStop | None = None, *,
                 warnings: list[str] | None = None) -> RunStop:
        """The run's end, decided once: the loop's outcome (``stop``, as the stop hook saw
        it, when it was asked and the outcome stands) with the hook's verdict applied (after a
        lost lock, only its warnings: the run's own end is the lost lock)."""
        outcome = self.outcome
        if (stop is None or outcome is None or stop.status != outcome.status
                or stop.error_code != outcome.error_code):
            stop = self._stop_view(warnings)
        elif self.warnings != stop.warnings:  # the stop hook failed: the run says so
            stop = replace(stop, warnings=list(self.warnings))
        return stop.decided(verdict, self._snapshots(), verdict_applies=not self._lock_lost())

    def _emit_terminal(self, end: RunStop) -> None:
        self.emitter.emit("failed" if end.status == "error" else "completed",
                          terminal_payload(end))


def _can_hold(budget: IterationBudget, needed: int) -> bool:
    """Whether extending ``budget`` could make room for ``needed`` more units."""
    hard = budget.hard_ceiling()
    return (budget.exhausted_rail() in (None, "ceiling")
            and (hard is None or budget.current() + needed <= hard))
