"""The run's event emitter: a sink that raises never changes a run's outcome.

Per-turn events build their payloads only when someone listens (``Emitter.listening``), since
a run emits several events per turn.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

__all__ = ["Emitter", "EventSink"]

logger = logging.getLogger("agents_api.loop")

EventSink = Callable[[str, dict[str, Any]], object]


class Emitter:
    """``emit(event, payload)`` to one sink, guarded.

    A sink that declares ``never_raises = True`` (it guards itself, as datamachine's run
    emitter does) is called directly; any other is wrapped so its exceptions are logged. A sink
    that declares ``per_turn_events = False`` is handed only the events the loop emits whatever
    happens (budgets, lock contention, the terminal event), never the per-turn ones, whose
    payloads are then not built (datamachine records the former with every run).
    """

    __slots__ = ("emit", "listening")

    def __init__(self, sink: EventSink | None) -> None:
        self.listening = sink is not None and getattr(sink, "per_turn_events", True) is not False
        if sink is None:
            self.emit: Callable[[str, dict[str, Any]], None] = _nothing
        elif getattr(sink, "never_raises", False) is True:
            self.emit = sink  # type: ignore[assignment]  # its result is ignored
        else:
            self.emit = _guarded(sink)


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
