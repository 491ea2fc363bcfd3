"""The run's event emitter: a sink that raises never changes a run's outcome.

Per-turn events build their payloads only when someone listens (``Emitter.listening``), since
a run emits several events per turn.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol, cast

__all__ = ["Emitter", "EventListener", "EventSink"]

logger = logging.getLogger("agents_api.loop")

EventSink = Callable[[str, dict[str, Any]], object]


class EventListener(Protocol):
    """A sink object: ``emit(event, payload)``; it may declare ``never_raises = True`` (it
    guards itself) and ``per_turn_events`` (False: only the loop's rare events)."""

    def emit(self, event: str, payload: dict[str, Any]) -> object:
        """Receive one event."""


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
            self.emit: Callable[[str, dict[str, Any]], None] = _nothing
            return
        method = getattr(sink, "emit", None)  # an object with emit(), else a callable
        call = cast(EventSink, method if callable(method) else sink)
        if getattr(sink, "never_raises", False) is True:
            self.emit = cast(Callable[[str, dict[str, Any]], None], call)  # result ignored
        else:
            self.emit = _guarded(call)


def _nothing(event: str, payload: dict[str, Any]) -> None:
    return None


def _guarded(sink: EventSink) -> Callable[[str, dict[str, Any]], None]:
    def emit(event: str, payload: dict[str, Any]) -> None:
        try:
            sink(event, payload)
        except Exception:
            # An observer must never change a run's outcome.
            logger.warning("agents_api: event sink failed on %r", event, exc_info=True)

    return emit
