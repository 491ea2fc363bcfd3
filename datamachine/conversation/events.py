"""A run's events: :class:`RunEvents`, the one sink the loop and the run's parts emit to.

An event goes to the run's timeline (the rare ones, recorded whether or not anyone listens),
its observers (OpenTelemetry), the payload's ``event_sink`` and the ``on_loop_event`` hook, each
guarded: a listener that raises is logged and never changes the run. With none of those but
the timeline, nothing is built per event, and the loop hands per-turn events to nobody.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from datamachine.conversation.payload import split_payload
from datamachine.conversation.timeline import TIMELINE_EVENTS, RunTimeline

if TYPE_CHECKING:
    from datamachine.host import Services
    from datamachine.observe import RunObserver

__all__ = ["RunEvents", "emit_outside_run"]

logger = logging.getLogger("datamachine.conversation")


class RunEvents:
    """``emit(event, payload)`` for one run (``sink``: the payload's ``event_sink``;
    ``observers``: what the ``run_observer`` hook returned for the run; ``timeline``: where
    the run records its rare events, listened to or not; ``base``: the log context every
    payload starts from).

    ``active``: someone listens beyond the timeline; the loop reads ``per_turn_events`` (per-turn
    payloads are built only for listeners) and ``never_raises`` (it calls :meth:`emit`
    unguarded: every listener here is guarded already).
    """

    never_raises = True
    __slots__ = ("_base", "_hook", "_observers", "_sink", "_timeline", "active",
                 "per_turn_events")

    def __init__(self, services: Services, sink: Any, base: Mapping[str, Any],
                 observers: tuple[RunObserver, ...] = (),
                 timeline: RunTimeline | None = None) -> None:
        if sink is not None and not callable(sink):
            sink = sink.emit
        self._sink: Callable[[str, dict[str, Any]], object] | None = sink
        caller = services.pm.hook.on_loop_event
        self._hook = caller if caller.get_hookimpls() else None
        self._observers = observers
        self._timeline = timeline
        self._base = dict(base)
        self.active = sink is not None or self._hook is not None or bool(observers)
        self.per_turn_events = self.active

    def emit(self, event: str, payload: dict[str, Any]) -> None:
        """Deliver one event (with the run's base log context) to every listener."""
        timeline = self._timeline
        if timeline is not None and event in TIMELINE_EVENTS:
            try:
                timeline.record(event, payload)
            except Exception:  # the loop calls this unguarded (never_raises)
                logger.warning("datamachine: recording %r on the run's timeline failed", event,
                               exc_info=True)
        if not self.active:
            return
        data = {**self._base, **payload}
        for observer in self._observers:
            try:
                observer.event(event, data)
            except Exception:
                logger.warning("datamachine: run observer %r failed on %r", observer, event,
                               exc_info=True)
        sink = self._sink
        if sink is not None:
            try:
                sink(event, data)
            except Exception:
                logger.warning("datamachine: event sink failed on %r", event, exc_info=True)
        hook = self._hook
        if hook is not None:
            try:
                hook(event=event, payload=data)
            except Exception:
                logger.warning("datamachine: on_loop_event hook failed on %r", event,
                               exc_info=True)


def emit_outside_run(services: Services, payload: Mapping[str, Any] | None, event: str,
                     data: dict[str, Any]) -> None:
    """Emit an event for a run that never reached the loop (the payload's sink and the hook)."""
    _, runtime = split_payload(payload)
    RunEvents(services, runtime.event_sink, {}).emit(event, data)
