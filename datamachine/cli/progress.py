"""A live progress line during a run: turn i of N, the tool running, budgets near their
ceiling.

It is fed by the run's public event sink (``payload["event_sink"]``, or the ``event`` items of
a streamed run). On a terminal it is a rich status line on stderr (rich is imported only then);
when stderr is piped nothing is drawn, so piped output never holds it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any

__all__ = ["Progress", "TextEcho", "near_ceiling"]

CONVERSATION_TURNS = "conversation_turns"
TOOL_CALLS = "tool_calls"


class Progress:
    """An event sink (``payload["event_sink"]``) that keeps one status line up to date while a
    run is in flight: turn i of N, the tool running, and the budgets near their ceiling.

    ``ceilings``: ceilings of budgets the events do not carry (``tool_calls``), counted here
    from the events. :attr:`text` is the line (kept whether or not it is drawn).
    """

    def __init__(self, enabled: bool | None = None,
                 ceilings: dict[str, int] | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._status: Any = None
        self._shown = False
        self.turn = "turn -"
        self.doing = "starting…"
        self.used: dict[str, int] = {}
        self.ceilings = dict(ceilings or {})
        self.notice = ""

    def __enter__(self) -> Progress:
        if self.enabled:
            from rich.console import Console

            self._status = Console(stderr=True).status(self.text)
            self.resume()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.pause()
        self._status = None

    def pause(self) -> None:
        """Hide the line (while a question is asked, or the answer's text is printed)."""
        if self._status is not None and self._shown:
            self._status.stop()
            self._shown = False

    def resume(self) -> None:
        """Show the line again after :meth:`pause`."""
        if self._status is not None and not self._shown:
            self._status.start()
            self._shown = True

    @property
    def text(self) -> str:
        """The status line: ``turn 3/4 · running tool search · near ceiling: ...``."""
        near = [f"{name} {self.used[name]}/{ceiling}"
                for name, ceiling in sorted(self.ceilings.items())
                if name in self.used and near_ceiling(self.used[name], ceiling)]
        parts = [self.turn, self.doing, *([f"near ceiling: {', '.join(near)}"] if near else []),
                 *([self.notice] if self.notice else [])]
        return " · ".join(parts)

    def __call__(self, event: str, payload: dict[str, Any]) -> None:
        self.follow(event, payload)
        if self._status is not None:
            self._status.update(self.text)

    def follow(self, event: str, payload: dict[str, Any]) -> None:
        """Take one loop event into the line."""
        if event == "turn_started":
            turn, ceiling = payload.get("turn"), payload.get("max_turns")
            self.turn = f"turn {turn}/{ceiling}"
            self.doing = "waiting for the model"
            if isinstance(turn, int) and isinstance(ceiling, int):
                self.used[CONVERSATION_TURNS] = turn
                self.ceilings[CONVERSATION_TURNS] = ceiling
        elif event == "tool_call":
            self.doing = f"running tool {payload.get('tool_name')}"
            self.used[TOOL_CALLS] = self.used.get(TOOL_CALLS, 0) + 1
        elif event == "tool_result":
            self.doing = f"tool {payload.get('tool_name')} " + (
                "done" if payload.get("success") else "failed")
        elif event in ("budget_pressure", "budget_exceeded", "budget_extended"):
            name = str(payload.get("budget"))
            if isinstance(payload.get("current"), int) and isinstance(payload.get("ceiling"),
                                                                       int):
                self.used[name], self.ceilings[name] = payload["current"], payload["ceiling"]
            what = {"budget_pressure": f"{payload.get('tier')}",
                    "budget_exceeded": "spent", "budget_extended": "extended"}[event]
            self.notice = f"budget {name} {what} ({payload.get('current')}/" \
                          f"{payload.get('ceiling')})"
        elif event == "final_summary":
            self.doing = "writing the final summary"


def near_ceiling(current: int, ceiling: int) -> bool:
    """At most a fifth of the budget left (at least the last one): worth a word on the line."""
    return ceiling > 0 and ceiling - current <= max(1, ceiling // 5)


class TextEcho:
    """Prints a model's text to the terminal as it arrives, after ``prefix`` (an ``on_text``
    callback); :meth:`end` finishes the line."""

    def __init__(self, prefix: str = "", *,
                 on_first: Callable[[], object] | None = None) -> None:
        self.prefix = prefix
        self.shown = False  # a streamed line is open
        self.printed = False  # some text was printed at all
        # Called before the first text (the live status line gives way to the text itself).
        self.on_first = on_first

    def __call__(self, text: str) -> None:
        if not self.shown:
            if self.on_first is not None:
                self.on_first()
            sys.stdout.write(self.prefix)
            self.shown = self.printed = True
        sys.stdout.write(text)
        sys.stdout.flush()

    def end(self) -> None:
        """End the streamed line (the next text starts a new one, with the prefix)."""
        if self.shown:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self.shown = False
