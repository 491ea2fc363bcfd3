"""One run's loop guard: watches each turn (its text, its calls and how they ended), counts a
signalled turn on ``stuck_turns`` and resets it on progress, and takes the ladder's step.

The run tells it a turn's answer (:meth:`LoopGuard.answered`) and each call's outcome
(:meth:`LoopGuard.ran`); the turn is judged once its last call has ended (at once for a turn
without calls), so the budget is up to date before the loop checks its budgets after that
call. A stop is the budget spent: the loop then stops on ``stuck_turns`` (or offers it to a
person, as any spent budget), the run's final summary follows. The state the built-in signals
need is kept as the turns go (a few sets and the last four calls), so a turn costs a couple of
set lookup; a call's arguments are spelled canonically only when a signal needs them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, cast

from agents_api import IterationBudget
from agents_api.jsontext import canonical_json, compact_json
from datamachine.loop_guard.ladder import Step
from datamachine.loop_guard.signals import (
    ALTERNATING_CALLS,
    HIDDEN_TOOL_CALLED,
    REPEATED_FAILURE,
    REPEATED_TEXT,
    GuardCall,
    GuardTurn,
    nudge_text,
)
from datamachine.tools.results import is_rejected

__all__ = ["Detect", "LoopGuard"]

# The plugins' detect_stuck hook: the run's completed turns and a context -> signal names.
Detect = Callable[[list[GuardTurn], dict[str, Any]], list[str | None]]
Emit = Callable[[str, dict[str, Any]], None]


def _key(name: str, arguments: object) -> str:
    """The call's name and canonical arguments: key order never matters."""
    if type(arguments) is dict:
        for value in arguments.values():
            if type(value) is dict or type(value) is list:
                break
        else:
            try:
                # Flat arguments (the usual case): their sorted items' repr, made in C.
                return f"{name}:{sorted(arguments.items())!r}"
            except TypeError:  # keys that cannot be compared
                pass
    try:
        return f"{name}:{canonical_json(arguments)}"
    except TypeError:
        return f"{name}:{compact_json(arguments)}"


# A call as the guard keeps it: name, arguments, success (None: refused), error type, and
# whether its result was new. Its key (name and canonical arguments) is spelled only when a
# signal needs it: a healthy turn never does. A success's novelty (None until known) is
# worked out, with the result it compares, only when a turn looks suspicious: see _spell.
_Call = list[Any]  # [name, arguments, success, error type, new result, result to spell]
_NAME, _ARGUMENTS, _SUCCESS, _ERROR, _NEW, _DATA = range(6)


class LoopGuard:
    """The loop guard of one run. ``stuck``: makes its ``stuck_turns`` budget, on the first
    signal (a run that never repeats itself never makes it); ``budget``: that budget made
    already (a resumed run's); ``ladder``: the steps;
    ``hidden``: the tools taken away (shared with the tool executor, which refuses them);
    ``detect``: the plugins' ``detect_stuck`` (None: none registered); ``context``: what the
    hook is told besides the turns."""

    def __init__(self, stuck: Callable[[], IterationBudget], ladder: tuple[Step, ...], *,
                 emit: Emit, hidden: set[str], detect: Detect | None = None,
                 context: Mapping[str, Any] | None = None,
                 budget: IterationBudget | None = None) -> None:
        self._make_budget = stuck
        self.made: IterationBudget | None = budget
        self.ladder = ladder
        self.emit = emit
        self.hidden = hidden
        self.detect = detect
        self.context = dict(context or {})
        # Only a plugin reads whole turns: kept only when one is registered.
        self.turns: list[GuardTurn] = []
        self.failed: set[str] = set()  # keys of calls that failed or were refused
        # (tool, result) of every success: a result a tool gave before is nothing new.
        self.results: set[tuple[str, str]] = set()
        self.recent: deque[_Call] = deque(maxlen=4)  # the last four calls
        self._unspelled: list[_Call] = []  # successes whose novelty is not known yet
        self.texts: set[str] = set()
        self.previous_text: str | None = None
        self.nudge: str | None = None  # for the next request only
        # The turn being watched.
        self._turn, self._text, self._expected = 0, "", 0
        self._calls: list[_Call] = []
        self._budgets: Mapping[str, IterationBudget] = {}

    # -- what the run tells it --------------------------------------------------------------
    def answered(self, turn: int, text: str, calls: int,
                 budgets: Mapping[str, IterationBudget]) -> None:
        """Turn ``turn`` answered ``text`` with ``calls`` tool calls: judged now when it has
        none, else once the last call has ended. ``budgets``: the run's live budgets, which
        ``stuck_turns`` joins once it counts."""
        self._turn, self._text, self._expected = turn, text, calls
        self._budgets = budgets
        self._calls = []
        if not calls:
            self._judge()

    def ran(self, name: str, arguments: object, result: Mapping[str, Any],
            budgets: Mapping[str, IterationBudget]) -> None:
        """A call of the watched turn ended with ``result`` (refused ones too); ``arguments``
        as the model sent them (a mapping, or anything a malformed call carried). A call
        outside a watched turn (one a resumed run runs first, for its paused turn) is judged
        on its own."""
        if self._expected < 1:
            self._expected, self._calls, self._text = 1, [], ""
        self._budgets = budgets
        call: _Call
        if result.get("success") is True:
            call = [name, arguments, True, None, None, result.get("data", result)]
            self._unspelled.append(call)
        else:
            kind = result.get("error_type")
            call = [name, arguments, None if is_rejected(result) else False,
                    str(kind) if kind is not None else None, False, None]
        calls = self._calls
        calls.append(call)
        if len(calls) < self._expected:
            return
        if len(calls) == 1 and call[_SUCCESS] is True and self.detect is None \
                and self._unsuspicious(call):
            # The usual turn: one call that worked, in no pattern a signal looks for, and no
            # count to reset. Remembered; whether its result was new is worked out if ever
            # needed.
            self._expected = -1
            self.recent.append(call)
            self.previous_text = None
            return
        self._judge()

    def _unsuspicious(self, call: _Call) -> bool:
        """A successful ``call`` after the recent calls cannot make a signal, and there is
        no count its progress would reset."""
        made = self.made
        if made is not None and made.current():
            return False
        failed = self.failed
        if failed and _key(call[_NAME], call[_ARGUMENTS]) in failed:
            return False  # a call that failed before, made again
        recent = self.recent
        if len(recent) < 3:
            return True
        # Not the second B of A, B, A, B: names and arguments (dict equality ignores key
        # order, as the canonical key does) of the calls two apart differ.
        before, last, first = recent[-2], recent[-1], recent[-3]
        return not (before[_NAME] == call[_NAME] and last[_NAME] == first[_NAME]
                    and before[_ARGUMENTS] == call[_ARGUMENTS]
                    and last[_ARGUMENTS] == first[_ARGUMENTS])

    def _spell(self) -> None:
        """Work out, in the order they came, whether each success not judged yet gave its
        tool a result it had not given before (spelled as Python does: the same tool gives
        the same key order, and a difference only makes a result look new)."""
        results = self.results
        for call in self._unspelled:
            found = (call[_NAME], repr(call[_DATA]))
            call[_NEW] = found not in results
            results.add(found)
            call[_DATA] = None
        self._unspelled.clear()

    def take_nudge(self) -> str | None:
        """The message for the coming request (then gone: it is never stored)."""
        nudge, self.nudge = self.nudge, None
        return nudge

    @property
    def budget(self) -> IterationBudget:
        """The run's ``stuck_turns`` (made now if no signal made it yet)."""
        if self.made is None:
            self.made = self._make_budget()
        return self.made

    def approved(self) -> None:
        """A person let a stuck run go on: the count starts again."""
        self.budget.set_current(0)

    # -- judging a turn ---------------------------------------------------------------------
    def _judge(self) -> None:
        calls, text = self._calls, self._text.strip()
        self._expected = -1  # judged: outcomes of calls that wait for a person come later
        if self._unspelled:
            self._spell()
        if calls:
            progress = any(call[_NEW] for call in calls)
        else:
            progress = bool(text) and text not in self.texts
        # Progress wins over any signal.
        signal, tool = (None, None) if progress else self._builtin(calls, text)
        self._remember(calls, text)
        if progress:
            made = self.made
            if made is not None and made.current():
                made.set_current(0)
            return
        if signal is None and self.detect is not None:
            signal = self._asked()
        if signal is not None:
            self._step(signal, tool)

    def _builtin(self, calls: list[_Call], text: str) -> tuple[str | None, str | None]:
        hidden, failed = self.hidden, self.failed
        for call in calls:
            if call[_NAME] in hidden:
                return HIDDEN_TOOL_CALLED, call[_NAME]
        if failed:
            for call in calls:
                if _key(call[_NAME], call[_ARGUMENTS]) in failed:
                    return REPEATED_FAILURE, call[_NAME]
        if calls:
            recent = [*self.recent, *calls][-4:]
            if len(recent) == 4 and not recent[2][_NEW] and not recent[3][_NEW]:
                # A, B, A, B where the second A and B brought nothing new (the first ones may
                # have: they are what is being repeated).
                a, b, a2, b2 = (_key(call[_NAME], call[_ARGUMENTS]) for call in recent)
                if a == a2 != b == b2:
                    return ALTERNATING_CALLS, recent[3][_NAME]
        elif text and text == self.previous_text:
            return REPEATED_TEXT, None
        return None, None

    def _remember(self, calls: list[_Call], text: str) -> None:
        if calls:
            recent = self.recent
            for call in calls:
                if call[_SUCCESS] is not True:
                    self.failed.add(_key(call[_NAME], call[_ARGUMENTS]))
                recent.append(call)
            self.previous_text = None
        elif text:
            self.texts.add(text)
            self.previous_text = text
        if self.detect is not None:
            self.turns.append(GuardTurn(self._turn, self._text, tuple(
                GuardCall(name, dict(arguments) if isinstance(arguments, Mapping) else {},
                          _key(name, arguments), success, error, bool(new))
                for name, arguments, success, error, new, _ in calls)))

    def _asked(self) -> str | None:
        assert self.detect is not None
        context = {**self.context, "turn": self._turn, "hidden_tools": sorted(self.hidden)}
        for found in self.detect(list(self.turns), context):
            if isinstance(found, str) and found.strip():
                return found.strip()
        return None

    def _step(self, signal: str, tool: str | None) -> None:
        budget = self.budget
        count = budget.increment()
        # The budget joins the run's when it first counts: the loop checks it from then on,
        # and a result shows it (a budget that never counted stays out of it).
        cast(dict[str, IterationBudget], self._budgets).setdefault(budget.name(), budget)
        ladder = self.ladder
        step: Step = ladder[min(count, len(ladder)) - 1]
        if count >= budget.ceiling():
            step = "stop"  # the budget is spent, whatever the ladder says
        if step == "hide_tool":
            if tool is None or tool in self.hidden:
                step = "nudge"  # nothing (more) to take away: say it instead
            else:
                self.hidden.add(tool)
        if step == "nudge":
            self.nudge = nudge_text(signal, tool, count)
        elif step == "stop" and count < budget.ceiling():
            budget.set_current(budget.ceiling())  # the ladder says stop: the budget is spent
        self.emit("loop_guard", {"signal": signal, "tool": tool, "step": step,
                                 "turn": self._turn, "count": count,
                                 "ceiling": budget.ceiling()})
