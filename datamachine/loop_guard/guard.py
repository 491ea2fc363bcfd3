"""One run's loop guard: watches each turn (its text, its calls and how they ended), counts a
signalled turn on ``stuck_turns`` and resets it on progress, and takes the ladder's step.

The run tells it a turn's answer (:meth:`LoopGuard.answered`) and each call's outcome
(:meth:`LoopGuard.ran`); the turn is judged once its last call has ended (at once for a turn
without calls), so the budget is up to date before the loop checks its budgets after that
call. A stop is the budget spent: the loop then stops on ``stuck_turns`` (or offers it to a
person, as any spent budget), the run's final summary follows. The state the built-in signals
need is kept as the turns go (a few sets and the last four calls), so a turn costs a couple of
dict lookups beyond the canonical spelling of its calls.
"""

from __future__ import annotations

import json
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


# The C encoder, keys sorted: one spelling per value, fast enough for every call of a turn.
_canonical = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                              default=repr).encode


def _key(name: str, arguments: Mapping[str, Any]) -> str:
    return f"{name}:{_spelled(arguments)}"


def _spelled(value: object) -> str:
    try:
        return _canonical(value)
    except (TypeError, ValueError):  # keys that cannot be sorted, a circular value
        try:
            return canonical_json(value)
        except TypeError:
            return compact_json(value)


class LoopGuard:
    """The loop guard of one run. ``budget``: its ``stuck_turns``; ``ladder``: the steps;
    ``hidden``: the tools taken away (shared with the tool executor, which refuses them);
    ``detect``: the plugins' ``detect_stuck`` (None: none registered); ``context``: what the
    hook is told besides the turns."""

    def __init__(self, budget: IterationBudget, ladder: tuple[Step, ...], *, emit: Emit,
                 hidden: set[str], detect: Detect | None = None,
                 context: Mapping[str, Any] | None = None) -> None:
        self.budget = budget
        self.ladder = ladder
        self.emit = emit
        self.hidden = hidden
        self.detect = detect
        self.context = dict(context or {})
        # Only a plugin reads whole turns: kept only when one is registered.
        self.turns: list[GuardTurn] = []
        self.failed: set[str] = set()  # keys of calls that failed or were refused
        self.results: set[tuple[str, str]] = set()  # (key, result) of successful calls
        # The last four calls: key, name, whether the result was new.
        self.recent: deque[tuple[str, str, bool]] = deque(maxlen=4)
        self.texts: set[str] = set()
        self.previous_text: str | None = None
        self.nudge: str | None = None  # for the next request only
        # The turn being watched; its calls as (key, name, success, error type, new result).
        self._turn, self._text, self._expected = 0, "", 0
        self._calls: list[tuple[str, str, bool | None, str | None, bool]] = []
        self._arguments: list[Mapping[str, Any]] = []  # kept only for a plugin
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
        if self.detect is not None:
            self._arguments = []
        if not calls:
            self._judge()

    def ran(self, name: str, arguments: Mapping[str, Any], result: Mapping[str, Any]) -> None:
        """A call of the watched turn ended with ``result`` (refused ones too)."""
        key = _key(name, arguments)
        new = False
        success: bool | None
        if result.get("success") is True:
            success, error = True, None
            found = (key, _spelled(result.get("data", result)))
            if found not in self.results:
                self.results.add(found)
                new = True
        else:
            success = None if is_rejected(result) else False
            kind = result.get("error_type")
            error = str(kind) if kind is not None else None
        calls = self._calls
        calls.append((key, name, success, error, new))
        if self.detect is not None:
            self._arguments.append(arguments)
        if len(calls) >= self._expected:
            self._judge()

    def take_nudge(self) -> str | None:
        """The message for the coming request (then gone: it is never stored)."""
        nudge, self.nudge = self.nudge, None
        return nudge

    def approved(self) -> None:
        """A person let a stuck run go on: the count starts again."""
        self.budget.set_current(0)

    # -- judging a turn ---------------------------------------------------------------------
    def _judge(self) -> None:
        calls, text = self._calls, self._text.strip()
        self._expected = -1  # judged: outcomes of calls that wait for a person come later
        signal, tool = self._builtin(calls, text) if (
            self.failed or self.hidden or self.recent or not calls) else (None, None)
        progress = any(call[4] for call in calls) if calls else (
            bool(text) and text not in self.texts)
        self._remember(calls, text)
        if signal is None and self.detect is not None:
            signal = self._asked()
        if progress:
            if self.budget.current():
                self.budget.set_current(0)
            return
        if signal is not None:
            self._step(signal, tool)

    def _builtin(self, calls: list[tuple[str, str, bool | None, str | None, bool]],
                 text: str) -> tuple[str | None, str | None]:
        hidden, failed = self.hidden, self.failed
        for _, name, *_ in calls:
            if name in hidden:
                return HIDDEN_TOOL_CALLED, name
        for key, name, *_ in calls:
            if key in failed:
                return REPEATED_FAILURE, name
        if calls:
            recent = [*self.recent, *((c[0], c[1], c[4]) for c in calls)][-4:]
            # A, B, A, B where the second A and B brought nothing new (the first ones may
            # have: they are what is being repeated).
            if (len(recent) == 4 and recent[0][0] == recent[2][0] != recent[1][0]
                    and recent[1][0] == recent[3][0] and not recent[2][2]
                    and not recent[3][2]):
                return ALTERNATING_CALLS, recent[3][1]
        elif text and text == self.previous_text:
            return REPEATED_TEXT, None
        return None, None

    def _remember(self, calls: list[tuple[str, str, bool | None, str | None, bool]],
                  text: str) -> None:
        if calls:
            recent = self.recent
            for key, name, success, _, new in calls:
                if success is not True:
                    self.failed.add(key)
                recent.append((key, name, new))
            self.previous_text = None
        elif text:
            self.texts.add(text)
            self.previous_text = text
        if self.detect is not None:
            self.turns.append(GuardTurn(self._turn, self._text, tuple(
                GuardCall(name, dict(arguments), key, success, error, new)
                for (key, name, success, error, new), arguments
                in zip(calls, self._arguments, strict=True))))

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
