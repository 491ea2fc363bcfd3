"""A live progress line during a run: turn N/M, the tool running, budget pressure.

On a terminal it is a rich status line on stderr (rich is imported only then); when output is
piped nothing is drawn, so stdout stays clean for ``--json`` and scripts.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any

__all__ = ["Progress", "TextEcho"]


class Progress:
    """An event sink that keeps one status line up to date while a run is in flight."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._status: Any = None
        self._turn = "turn -"
        self._extra = ""

    def __enter__(self) -> Progress:
        if self.enabled:
            from rich.console import Console

            self._status = Console(stderr=True).status("starting…")
            self._status.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def pause(self) -> None:
        """Hide the line (while a question is asked on the terminal)."""
        if self._status is not None:
            self._status.stop()

    def resume(self) -> None:
        """Show the line again after :meth:`pause`."""
        if self._status is not None:
            self._status.start()

    def __call__(self, event: str, payload: dict[str, Any]) -> None:
        if self._status is None:
            return
        if event == "turn_started":
            self._turn = f"turn {payload.get('turn')}/{payload.get('max_turns')}"
            self._extra = "waiting for the model"
        elif event == "tool_call":
            self._extra = f"running tool {payload.get('tool_name')}"
        elif event == "tool_result":
            self._extra = f"tool {payload.get('tool_name')} " + (
                "done" if payload.get("success") else "failed")
        elif event == "budget_pressure":
            self._extra = (f"budget pressure: {payload.get('budget')} {payload.get('tier')} "
                           f"({payload.get('current')}/{payload.get('ceiling')})")
        elif event == "final_summary":
            self._extra = "writing the final summary"
        self._status.update(f"{self._turn} · {self._extra}")


class TextEcho:
    """Prints a model's text to the terminal as it arrives, after ``prefix`` (an ``on_text``
    callback); :meth:`end` finishes the line."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.shown = False  # a streamed line is open
        self.printed = False  # some text was printed at all
        # Called before the first text (the live status line gives way to the text itself).
        self.on_first: Any = None

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
