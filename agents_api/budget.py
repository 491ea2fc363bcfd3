"""The per-run counter that bounds every loop: :class:`IterationBudget`.

One value object covers turns, tool calls, chain depth, retries and wall-clock time, so every
consumer checks and reports exhaustion the same way. Beyond the source primitive it carries two
rails a soft ceiling can never pass: a ``hard_ceiling`` (``extend()`` stops there) and a
``max_seconds`` time rail; ``extendable()`` tells a UI whether offering "continue" can help.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypedDict

from agents_api import clock as _clock
from agents_api.errors import InvalidBudget, brief_repr

__all__ = ["TOOL_CALLS", "WALL_CLOCK", "BudgetRail", "BudgetSnapshot", "BudgetSpent",
           "IterationBudget", "per_tool_budget", "spent_payload"]

BudgetRail = Literal["ceiling", "hard_ceiling", "time"]


class BudgetSnapshot(TypedDict):
    """What :meth:`IterationBudget.snapshot` gives: a budget's numbers at one moment, as
    results, events and stores carry them; ``rail`` says which rail is spent (None: none)."""

    current: int
    ceiling: int
    remaining: int
    exceeded: bool
    hard_ceiling: int | None
    rail: BudgetRail | None


# The budget names the generic loop itself knows. Every other budget is just a name to it:
# ``tool_calls`` is checked before each tool call (and ``tool_calls_<tool>`` per tool name), and
# ``wall_clock_seconds`` is set from the clock before each turn and bounds how long a provider
# or tool call may run.
TOOL_CALLS = "tool_calls"
WALL_CLOCK = "wall_clock_seconds"


def per_tool_budget(tool_name: str) -> str:
    """The name of the budget that counts calls of one tool: ``tool_calls_<tool_name>``."""
    return f"{TOOL_CALLS}_{tool_name}"


# The largest count a budget holds: what every store keeps in an integer column (SQLite's
# INTEGER), and far below the size at which an int stops reading back from JSON.
MAX_COUNT = 2**63 - 1


def _as_int(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value > MAX_COUNT:
        raise InvalidBudget(f"IterationBudget {field} must be an integer no larger than "
                            f"{MAX_COUNT}, got {brief_repr(value)}.")
    return value


class BudgetSpent(Exception):
    """Raised by a hook when the work it was asked for cannot be done within ``budget``.

    ``run_turn`` or ``estimate_request`` raise it when the coming request cannot fit (a
    context window nothing more can be taken out of): the loop stops the run
    ``budget_exceeded`` on ``budget`` without counting a turn, and the stop hook is asked as
    for any budget stop. ``message`` says why (logged; the result's warning is the budget's).
    """

    def __init__(self, budget: IterationBudget, message: str = "") -> None:
        super().__init__(message or f"budget {budget.name()!r} is spent")
        self.budget = budget


class IterationBudget:
    """A named counter with a soft ceiling, an optional hard ceiling and an optional time rail.

    ``exceeded()`` is inclusive (``current >= ceiling``): a ceiling of 3 allows three units of work
    and then reports exhaustion. A ceiling below ``min_ceiling`` (1) becomes it and a negative
    current becomes 0, as in the source; a current already at the ceiling is kept, so a budget
    can start exhausted. ``min_ceiling=0`` is for a budget that counts repeats (retries,
    nudges), where a ceiling of 0 means none.
    """

    __slots__ = ("_ceiling", "_clock", "_current", "_floor", "_hard_ceiling", "_max_seconds",
                 "_name", "_started")

    def __init__(
        self,
        name: str,
        ceiling: int,
        current: int = 0,
        *,
        hard_ceiling: int | None = None,
        max_seconds: float | None = None,
        clock: Callable[[], float] | None = None,
        min_ceiling: int = 1,
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise InvalidBudget("IterationBudget name must be a non-empty string.")
        if min_ceiling not in (0, 1):
            raise InvalidBudget(f"IterationBudget min_ceiling must be 0 or 1, got "
                                f"{brief_repr(min_ceiling)}.")
        self._name = name.strip()
        self._floor = min_ceiling
        self._ceiling = max(min_ceiling, _as_int("ceiling", ceiling))
        self._current = max(0, _as_int("current", current))
        if hard_ceiling is not None:
            hard = max(1, _as_int("hard_ceiling", hard_ceiling))
            if self._ceiling > hard:
                raise InvalidBudget(
                    f"IterationBudget {self._name!r}: ceiling {self._ceiling} is above "
                    f"hard_ceiling {hard}; lower the ceiling or raise the hard ceiling."
                )
            self._hard_ceiling: int | None = hard
        else:
            self._hard_ceiling = None
        if max_seconds is not None and _clock.duration(max_seconds) is None:
            raise InvalidBudget(
                f"IterationBudget {self._name!r}: max_seconds must be a finite number of "
                f"seconds above 0, got {brief_repr(max_seconds)}."
            )
        self._max_seconds = max_seconds
        self._clock = clock
        self._started = self._now() if max_seconds is not None else 0.0

    def _now(self) -> float:
        # Read the project clock at call time so freezegun (or an injected clock) moves it.
        return self._clock() if self._clock is not None else _clock.monotonic()

    # -- the source primitive -------------------------------------------------------------
    def name(self) -> str:
        """The budget's name, e.g. ``conversation_turns``."""
        return self._name

    def current(self) -> int:
        """Units consumed so far."""
        return self._current

    def ceiling(self) -> int:
        """The soft ceiling: the limit ``exceeded()`` compares against."""
        return self._ceiling

    def min_ceiling(self) -> int:
        """The lowest ceiling this budget may have: 1, or 0 for one that counts repeats."""
        return self._floor

    def remaining(self) -> int:
        """Units left before the soft ceiling; never negative."""
        return max(0, self._ceiling - self._current)

    def increment(self) -> int:
        """Consume one unit and return the new count (it may pass the ceiling)."""
        self._current += 1
        return self._current

    def set_current(self, n: int) -> None:
        """Replace the count (a negative value stores 0); used by wall-clock style budgets."""
        self._current = max(0, _as_int("current", n))

    def exceeded(self) -> bool:
        """True once the ceiling is reached (inclusive) or the time rail is spent."""
        # Asked several times per turn: the time rail is read inline, and only when set.
        return self._current >= self._ceiling or (
            self._max_seconds is not None and self.elapsed_seconds() >= self._max_seconds)

    def to_response_flag(self) -> str:
        """The flag a result carries when this budget stopped the run: ``max_<name>_reached``."""
        return f"max_{self._name}_reached"

    def to_warning(self) -> str:
        """A sentence for humans, e.g. ``Maximum conversation turns (25) reached.``."""
        return f"Maximum {self._name.replace('_', ' ')} ({self._ceiling}) reached."

    # -- rails beyond the source ----------------------------------------------------------
    def hard_ceiling(self) -> int | None:
        """The ceiling no extension may pass, or None when extensions are unbounded."""
        return self._hard_ceiling

    def max_seconds(self) -> float | None:
        """The wall-clock rail in seconds, or None."""
        return self._max_seconds

    def elapsed_seconds(self) -> float:
        """Seconds since the budget was created (0.0 without a time rail)."""
        if self._max_seconds is None:
            return 0.0
        return max(0.0, self._now() - self._started)

    def seconds_left(self) -> float | None:
        """Seconds before the time rail is spent (never negative), or None without one."""
        if self._max_seconds is None:
            return None
        return max(0.0, self._max_seconds - self.elapsed_seconds())

    def _time_spent(self) -> bool:
        return self._max_seconds is not None and self.elapsed_seconds() >= self._max_seconds

    def exhausted_rail(self) -> BudgetRail | None:
        """Which rail stops this budget (``time``, then ``hard_ceiling``, then ``ceiling``)."""
        if self._time_spent():
            return "time"
        if self._hard_ceiling is not None and self._current >= self._hard_ceiling:
            return "hard_ceiling"
        if self._current >= self._ceiling:
            return "ceiling"
        return None

    def extendable(self) -> bool:
        """True only when granting more would help: the soft ceiling is spent, no hard rail is."""
        return self.exhausted_rail() == "ceiling"

    def extend(self, by: int) -> int:
        """Raise the soft ceiling by ``by``, never past the hard ceiling; return the new one."""
        amount = _as_int("extend(by)", by)
        if amount < 1:
            raise InvalidBudget(f"IterationBudget.extend(by) needs a positive integer, got "
                                f"{brief_repr(by)}.")
        new_ceiling = min(self._ceiling + amount, MAX_COUNT)
        if self._hard_ceiling is not None:
            new_ceiling = min(new_ceiling, self._hard_ceiling)
        self._ceiling = new_ceiling
        return new_ceiling

    def lower(self, ceiling: int) -> int:
        """Lower the ceiling (and a hard ceiling above it) to ``ceiling``, never below its
        ``min_ceiling`` (1 by default); return the new one. For a budget that learns it holds
        less than it was given (a context window the provider reports smaller): a higher value
        changes nothing."""
        target = max(self._floor, _as_int("lower(ceiling)", ceiling))
        if target < self._ceiling:
            self._ceiling = target
        if self._hard_ceiling is not None and target < self._hard_ceiling:
            self._hard_ceiling = max(target, self._ceiling)
        return self._ceiling

    def snapshot(self) -> BudgetSnapshot:
        """A JSON-ready picture of the budget for results, events and storage."""
        # The time rail is read once (a result snapshots every budget, twice per run).
        current, ceiling, hard = self._current, self._ceiling, self._hard_ceiling
        rail: BudgetRail | None = None
        if self._time_spent():
            rail = "time"
        elif hard is not None and current >= hard:
            rail = "hard_ceiling"
        elif current >= ceiling:
            rail = "ceiling"
        return {
            "current": current,
            "ceiling": ceiling,
            "remaining": max(0, ceiling - current),
            "exceeded": rail is not None,
            "hard_ceiling": hard,
            "rail": rail,
        }

    def __repr__(self) -> str:
        return (
            f"IterationBudget({self._name!r}, ceiling={self._ceiling}, current={self._current}, "
            f"hard_ceiling={self._hard_ceiling}, max_seconds={self._max_seconds})"
        )


def spent_payload(budget: IterationBudget) -> dict[str, object]:
    """The payload of the ``budget_exceeded`` event for ``budget``: its name, dimension,
    count, ceiling, rail and the flag the run's result carries. Every emitter of that event
    (the loop, a product stopping on a budget it counts itself) uses this one."""
    name = budget.name()
    if name == WALL_CLOCK:
        dimension = "wall_clock"
    elif name.startswith(TOOL_CALLS):
        dimension = TOOL_CALLS
    else:
        dimension = name
    return {"budget": name, "dimension": dimension, "current": budget.current(),
            "ceiling": budget.ceiling(), "rail": budget.exhausted_rail(),
            "flag": budget.to_response_flag()}
