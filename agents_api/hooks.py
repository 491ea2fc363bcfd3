"""The seam between the loop and the product built on it: :class:`LoopHooks`, the
:class:`TurnContext` each hook receives, and :class:`LoopSettings`, a run's frozen arguments.

The loop owns mechanics (turn order, budgets, tool order, events, the lock, storage); a product
owns policy (what a turn asks the model, how a tool runs, what a result means). The two meet
only here: the loop calls six hooks and hands each one a typed, frozen context, so a reader can
follow a run by reading signatures. ``run_loop``'s keyword callables (DESIGN.md section 10) are
adapted onto the same hooks by :class:`~agents_api.api.CallableHooks`.

Every hook may answer with an awaitable instead of its value; the loop awaits it (see
:mod:`agents_api.drive`), so one body serves sync and async runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeAlias, TypeVar, Union

if TYPE_CHECKING:
    from agents_api.budget import IterationBudget
    from agents_api.message import Message
    from agents_api.pause import Pause
    from agents_api.records import ToolCall, ToolOutcome
    from agents_api.results import Decision, RunStop, StopVerdict, TurnAnswer, TurnResult
    from agents_api.transcript import TranscriptLock, TranscriptPersister, TranscriptWriter

__all__ = ["EMPTY", "EventListener", "EventSink", "LoopHooks", "LoopSettings", "MaybeAwaitable",
           "TurnContext"]

T = TypeVar("T")
MaybeAwaitable: TypeAlias = Union[T, Awaitable[T]]  # noqa: UP007



class _Empty(Mapping[str, object]):
    """The empty mapping a context holds when nothing was given: immutable and hashable, so
    it can be a frozen dataclass's default (a ``MappingProxyType`` is not hashable)."""

    __slots__ = ()

    def __getitem__(self, key: str) -> object:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "EMPTY"


EMPTY: Mapping[str, object] = _Empty()

@dataclass(frozen=True, slots=True, eq=False)
class TurnContext(Mapping[str, object]):
    """What every hook knows about the run at the moment it is asked (never changed).

    ``turn``: the turn being run (the last one for ``stop``); ``budgets``: the run's budgets by
    name (a live mapping: a tool may add one mid-run); ``session_id``: the transcript session,
    if the run stores one; ``deadline``: seconds left on the run's time rails, or None when it
    has none; ``mode`` and ``payload``: what the product runs (read-only; the generic loop
    passes them through untouched); ``extra``: other keys given to ``run_loop(context=...)``;
    ``transcript``: the run's transcript writer while it holds the session's lock (None: the
    run stores no transcript), for a hook that must write under that lock before it acts
    (the product stores a tool call's intent through it); not a mapping key.

    It is also a read-only mapping of those names (``context["turn"]``), the shape callables
    written for ``run_loop`` have always received; ``deadline``, ``mode`` and ``payload`` are
    keys only when set.
    """

    turn: int
    budgets: Mapping[str, IterationBudget]
    session_id: str | None = None
    deadline: float | None = None
    mode: str = ""
    payload: Mapping[str, object] = EMPTY
    extra: Mapping[str, object] = EMPTY
    transcript: TranscriptWriter | None = None

    def __getitem__(self, key: str) -> object:
        if key == "turn":
            return self.turn
        if key == "budgets":
            return self.budgets
        if key == "session_id":
            return self.session_id
        if key == "deadline" and self.deadline is not None:
            return self.deadline
        if key == "mode" and self.mode:
            return self.mode
        if key == "payload" and self.payload is not EMPTY:
            return self.payload
        return self.extra[key]

    def __iter__(self) -> Iterator[str]:
        own = ["turn", "budgets", "session_id"]
        if self.deadline is not None:
            own.append("deadline")
        if self.mode:
            own.append("mode")
        if self.payload is not EMPTY:
            own.append("payload")
        yield from own
        yield from (key for key in self.extra if key not in own)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def with_turn(self, turn: int, deadline: float | None) -> TurnContext:
        """The same run's context for another turn."""
        return TurnContext(turn, self.budgets, self.session_id, deadline, self.mode,
                           self.payload, self.extra, self.transcript)

    def as_dict(self) -> dict[str, object]:
        """The context as a new dict (what ``run_loop``'s callables receive)."""
        found: dict[str, object] = {**self.extra, "turn": self.turn, "budgets": self.budgets,
                                    "session_id": self.session_id}
        if self.deadline is not None:
            found["deadline"] = self.deadline
        if self.mode:
            found["mode"] = self.mode
        if self.payload is not EMPTY:
            found["payload"] = self.payload
        return found


# run_loop's on_event: a callable (event, payload); it may annotate the payload as
# dict[str, Any].
EventSink = Callable[[str, dict[str, object]], object]


class EventListener(Protocol):
    """A sink object: ``emit(event, payload)``; it may declare ``never_raises = True`` (it
    guards itself) and ``per_turn_events`` (False: only the loop's rare events, never the
    per-turn ones, whose payloads are then not built)."""

    def emit(self, event: str, payload: dict[str, object]) -> object:
        """Receive one event."""


class LoopHooks(Protocol):
    """What the loop asks of the product that runs it, one method per question.

    The loop calls them in this order for every turn: :meth:`estimate_request` (when
    ``LoopSettings.estimates``), :meth:`run_turn`, then for each tool call :meth:`run_tool` and
    :meth:`after_tool`; :meth:`budget_spent` whenever a budget is spent (or a request would
    pass one), and :meth:`stop` once, when the run stops, before anything final is stored.
    """

    def run_turn(self, messages: list[Message], context: TurnContext
                 ) -> MaybeAwaitable[TurnAnswer | TurnResult | Mapping[str, object]]:
        """Ask the model for one turn. ``messages`` is the live transcript (read it, do not
        change it). A :class:`~agents_api.TurnAnswer` is taken as it is; a ``TurnResult``
        or a mapping of its fields is validated."""

    def run_tool(self, call: ToolCall, messages: list[Message], context: TurnContext
                 ) -> MaybeAwaitable[object]:
        """Run one call: its result (``{"success": bool, "result"|"error": ...}``, or any
        value, which is a success), or a :class:`~agents_api.Pause` (the call did not run; it
        waits with the run). An exception becomes a failed result; it never ends the run."""

    def after_tool(self, outcome: ToolOutcome, context: TurnContext
                   ) -> MaybeAwaitable[Decision | None]:
        """A call ran (or was refused): a :class:`~agents_api.Decision` ends the run
        (``complete``) or adds a message for the model; None says nothing. An exception ends
        the run as an error."""

    def estimate_request(self, messages: list[Message], context: TurnContext
                         ) -> MaybeAwaitable[Mapping[str, int] | None]:
        """What the coming request would add to budgets that count what requests spend
        (``{budget_name: units}``), before it is sent; None when nothing is counted. A request
        that would pass a ceiling is not sent. It may first make the request smaller (a
        product compacting its context, which may call a model: hence the awaitable), and
        raise :class:`~agents_api.BudgetSpent` when it cannot be made to fit."""

    def budget_spent(self, budget: IterationBudget, context: TurnContext
                     ) -> MaybeAwaitable[bool | Pause | None]:
        """A budget with a soft ceiling is spent (or a request would pass it): True when it
        was extended, a :class:`~agents_api.Pause` to wait for a person, else it stops the
        run."""

    def stop(self, stop: RunStop, context: TurnContext
             ) -> MaybeAwaitable[StopVerdict | None]:
        """The run stopped (``stop`` says why): the product's verdict, applied once, under
        the lock, before the end is stored; None keeps the loop's."""


# run_loop's should_continue(turn_result, context_dict): whether the run goes on.
ShouldContinue = Callable[["TurnResult", dict[str, object]], bool]


@dataclass(frozen=True, slots=True)
class LoopSettings:
    """One run's arguments, checked once (see :func:`agents_api.run_loop`).

    ``hooks``: the product; ``turn_budget``: counted once per turn; ``estimates``: whether
    :meth:`LoopHooks.estimate_request` is asked before each turn; ``slow_stop``: whether the
    ``stop`` hook may make a provider call (the lock is renewed first); ``should_continue``: the
    generic loop's own stopping rule (None: go on while a turn called tools or added
    messages); ``writer`` or ``persister`` and ``lock``: where the transcript goes;
    ``request``: what the persister stores with it (provider, model, mode);
    ``pending_calls``: the calls a paused run left waiting, run before the first turn;
    ``stop_on_budget``: a spent budget a person declined to extend (a resumed run stops on it
    at once, whatever else is spent).
    """

    hooks: LoopHooks
    turn_budget: IterationBudget
    mode: str = ""
    payload: Mapping[str, object] = EMPTY
    extra: Mapping[str, object] = EMPTY
    estimates: bool = False
    # Whether the stop hook may take a while (one more provider call): the lock is renewed
    # before it is asked.
    slow_stop: bool = True
    should_continue: ShouldContinue | None = None
    persister: TranscriptPersister | None = None
    lock: TranscriptLock | None = None
    writer: TranscriptWriter | None = None
    session_id: str | None = None
    ttl: int = 300
    request: Mapping[str, object] = EMPTY
    pending_calls: tuple[Mapping[str, object], ...] = ()
    # A budget a person declined to extend: the run stops on it before its first turn.
    stop_on_budget: str | None = None
