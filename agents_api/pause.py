"""Stopping a run until a person answers: :class:`Pause`.

A web app cannot block inside a request while someone decides whether a run may go on. So the
loop can *pause* instead of asking: the run stops with status ``awaiting_confirmation``, stores
its transcript, gives its lock back and reports what it waits for in ``LoopResult.pending``.
Whoever answers later starts a new run on the same session; the tool calls that were waiting go
to it as ``pending_tool_calls`` and run first, before its first turn.

Three callables may pause a run, each by handing the loop a :class:`Pause`:

- ``on_budget_exhausted`` returns one instead of True/False (the spent budget stays spent);
- the tool executor returns one instead of a result: that call does not run, and it and the
  turn's later calls wait in ``pending["tool_calls"]``;
- the turn runner sets ``pause`` on its answer: none of that turn's calls run, all of them wait.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Pause"]


@dataclass(frozen=True, slots=True)
class Pause:
    """A request to stop the run and wait for a person (see the module docstring).

    ``pending`` says what for; the loop copies it into ``LoopResult.pending`` and adds
    ``tool_calls``: the calls that did not run yet, each ``{"id", "name", "parameters",
    "turn"}``, in order.
    """

    pending: dict[str, object] = field(default_factory=dict)
