"""A live progress line during a run: turn N/M, the tool running, budget pressure.

On a terminal it is a rich status line on stderr (rich is imported only then); when output is
piped nothing is drawn, so stdout stays clean for ``--json`` and scripts.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any

__all__ = ["Progress"]


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
