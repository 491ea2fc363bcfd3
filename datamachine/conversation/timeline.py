"""What a run keeps of its rare events for the run viewer: :class:`RunTimeline`.

Budget pressure, extensions, the stopping budget, the final summary, completion nudges and
blockers are events (docs/events.md), gone once emitted; the transcript keeps only messages.
A run that stores a transcript records these few events as they fire, whether or not anyone
listens, and its stop handler stores them with the transcript (its ``timeline`` column, read by
``TranscriptStore.timeline``), so the run's page shows when each fired; a run that stores none
keeps no timeline at all. Per-turn events (a turn starting, a tool call) are never recorded:
the messages already say them, and recording them would cost every turn.

The one record a run keeps per turn is its provider request's (:meth:`RunTimeline.request`,
an entry ``{"event": "request", ...}``: latency, tokens, options, the failed attempts before
it), which the messages cannot tell; the turn runner hands it over as one small dict, so a
turn pays a dict and an append, nothing more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agents_api import IterationBudget

__all__ = ["MAX_ENTRIES", "MAX_REQUESTS", "TIMELINE_EVENTS", "RunTimeline"]

# event -> the payload keys kept (small values only: no message text beyond a nudge's).
TIMELINE_EVENTS: dict[str, tuple[str, ...]] = {
    "budget_pressure": ("budget", "tier", "current", "ceiling"),
    "budget_extended": ("budget", "current", "ceiling"),
    "budget_exceeded": ("budget", "current", "ceiling", "rail", "needed", "flag"),
    "turn_interrupted": ("budget", "reason"),
    "final_summary": ("budget", "source", "attempts", "error"),
    "completion_nudge_added": ("completion_nudge_count", "completion_nudge", "reason"),
    "blocker_reported": ("reason",),
    "context_compacted": ("strategy", "tokens_before", "tokens_after", "messages_removed"),
    "context_overflow": ("ceiling", "sent_tokens"),
    "loop_guard": ("signal", "tool", "step", "count", "ceiling"),
}
# A run that fires more than this (a pathological pressure set-up) keeps its first ones, and
# always its stop; a session keeps the last ones of all its runs.
MAX_ENTRIES = 200
# The provider requests a run keeps (its first ones): a row each on the run's page.
MAX_REQUESTS = 500
_ALWAYS_KEPT = frozenset({"budget_exceeded", "turn_interrupted", "final_summary"})
_MAX_TEXT = 500


class RunTimeline:
    """The recorded events of one run, in order, each ``{"event", "turn", ...kept keys}``.

    ``turns``: the run's turn budget, whose count since the run started numbers its finished
    turns as the stored messages are (from 1 in every run; a resumed run's budget carries the
    paused run's count), for events whose payload names no turn; pressure fires while the next
    turn's request is built, so it is recorded on that next turn. ``run_base``: the session's
    turns before this run; each entry carries it, so a session's runs tell their entries
    apart. It holds the budget, never the run: a run the timeline pointed back at would live
    until the cyclic garbage collector found it.
    """

    __slots__ = ("_events", "_requests", "_start", "_turns", "entries", "run_base")

    def __init__(self, turns: IterationBudget | None = None, run_base: int = 0) -> None:
        self.entries: list[dict[str, Any]] = []
        self._turns = turns
        self._start = turns.current() if turns is not None else 0
        self.run_base = run_base
        self._events = 0
        self._requests = 0

    def turn(self) -> int:
        """The run's finished turns so far."""
        return self._turns.current() - self._start if self._turns is not None else 0

    def record(self, event: str, payload: dict[str, Any]) -> None:
        """Keep ``event`` if it is one of :data:`TIMELINE_EVENTS` (else nothing)."""
        keys = TIMELINE_EVENTS.get(event)
        if keys is None or (self._events >= MAX_ENTRIES and event not in _ALWAYS_KEPT):
            return
        self._events += 1
        turn = payload.get("turn", payload.get("completion_nudge_turn"))
        if not isinstance(turn, int):
            turn = self.turn() + (1 if event == "budget_pressure" else 0)
        entry: dict[str, Any] = {"event": event, "turn": turn, "run_base": self.run_base}
        for key in keys:
            value = payload.get(key)
            if value is None:
                continue
            entry[key] = value[:_MAX_TEXT] if isinstance(value, str) else value
        self.entries.append(entry)

    def request(self, turn: int, record: dict[str, Any]) -> None:
        """Keep one provider request's ``record`` (the turn runner's: ``ms``, ``ok``, and when
        there are any ``usage``, ``options``, ``attempts``, ``error``, ``summary``) as the
        entry ``{"event": "request", "turn", "run_base", ...}``; past :data:`MAX_REQUESTS`
        only counted."""
        self._requests += 1
        if self._requests > MAX_REQUESTS:
            return
        record["event"] = "request"
        record["turn"] = turn
        record["run_base"] = self.run_base
        self.entries.append(record)
