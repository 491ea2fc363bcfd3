"""Run observers: per-run listeners a plugin creates with the ``run_observer`` hook.

``on_loop_event`` sees every event of every run, so a plugin keeping per-run state (a tracing
span, a timer) would have to tell runs apart itself, and a host with such a plugin builds every
event's payload for every run. A run observer is created once per run, when the run is set up,
from a :class:`RunInfo`; it keeps that run's state and receives only that run's events. A plugin
with nothing to observe for a run (tracing is off) returns ``None``, and a run nobody observes
builds no event payloads at all.

Kept out of ``datamachine.conversation`` so the hookspecs can name these types at boot.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["RunInfo", "RunObserver", "close_observers", "wants_content"]


# Made once per run on the run's set-up path: slotted, not frozen (a frozen dataclass sets each
# field through object.__setattr__, 1 µs a run); never changed once made, as agents_api.records.
@dataclass(slots=True)
class RunInfo:
    """What is known of a run when it is set up, before its first turn.

    ``session_id`` is the transcript session (None when the run stores no transcript);
    ``agent_slug`` the payload's, if any; ``continuation`` is True for a run that carries on a
    stored session (a chat turn after the first, ``continue_conversation``, ``resume``).
    """

    provider: str
    model: str
    mode: str
    session_id: str | None = None
    agent_slug: str | None = None
    continuation: bool = False


class RunObserver(Protocol):
    """One run's listener, returned by the ``run_observer`` hook.

    ``event`` receives each event of the run with the same payload an ``event_sink`` gets
    (see docs/events.md), in order, on the thread or task that runs the loop; the run's
    terminal event (``completed`` or ``failed``) is its last. An observer that raises is logged
    and never changes the run.
    """

    def event(self, name: str, payload: dict[str, Any]) -> None:
        """Observe one event of the run."""


def wants_content(observer: object) -> bool:
    """Whether ``observer`` asked for message content: an observer with ``wants_content =
    True`` makes the run add ``messages`` (the request's, in chat shape) and ``content`` (the
    answer's text) to its ``request_built`` events, which otherwise carry neither."""
    return getattr(observer, "wants_content", False) is True


def close_observers(observers: tuple[Any, ...] | list[Any], error: BaseException | None) -> None:
    """Tell each observer with a ``close(error)`` method that its run is over: after the
    terminal event (a no-op then), or instead of it when the run ended by an exception, was
    cancelled or its step generator was closed. ``error`` is that exception, else None. An
    observer that raises here is ignored: the run's own outcome wins."""
    for observer in observers:
        close = getattr(observer, "close", None)
        if callable(close):
            try:
                close(error)
            except Exception:  # never hide the run's own exception
                logging.getLogger("datamachine.conversation").warning(
                    "datamachine: run observer %r failed to close", observer, exc_info=True)
