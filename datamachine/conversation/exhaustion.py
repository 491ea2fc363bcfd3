"""Graceful exhaustion: when a budget stops a model that was still calling tools, ask it once,
with no tools, for a summary — so a run that ran out of budget never ends empty-handed.

The summary request tells the model how many tool calls ran (so it cannot claim nothing was
done). ``<think>`` blocks are stripped, an empty answer is retried once, and a failed or empty
call falls back to a fixed sentence naming the budget. The call is not a turn: ``turn_count``
does not change, and the status still says ``budget_exceeded``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agents_api import RunStop
from agents_api.drive import Steps, awaitable
from datamachine.conversation.metering import SummaryWontFit
from datamachine.tools.results import is_rejected

__all__ = ["FinalSummary", "Summary", "fallback_summary", "strip_thinking", "summary_prompt"]

logger = logging.getLogger("datamachine.exhaustion")

_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL | re.IGNORECASE)
SUMMARY_GRACE_SECONDS = 30.0

# (messages, prompt) -> the summary text, or an awaitable of it.
Summarize = Callable[[list[Any], str], Any]
Emit = Callable[[str, dict[str, Any]], None]


def strip_thinking(text: str) -> str:
    """Remove ``<think>...</think>`` blocks (an unclosed one runs to the end) and trim."""
    return _THINK.sub("", text or "").strip()


def _label(budget: str) -> str:
    return budget.replace("_", " ")


def summary_prompt(budget: str, current: int, ceiling: int, tool_calls: int) -> str:
    """The user message of the summary request."""
    return (
        f"[BUDGET EXHAUSTED] This conversation has used its whole {_label(budget)} budget "
        f"({current}/{ceiling}). {tool_calls} tool call(s) ran and their results are above. "
        "Do not call any tools. Write your final answer now: what was done, what was found, "
        "and what is still open."
    )


def fallback_summary(budget: str, current: int, ceiling: int, tool_calls: int) -> str:
    """The fixed sentence used when the model gives no summary."""
    return (
        f"The run stopped because its {_label(budget)} budget was used up ({current}/{ceiling}) "
        f"after {tool_calls} tool call(s), and no final summary could be produced. The "
        "transcript holds every tool result gathered so far."
    )


# Failures that happen before a tool is reached: the call did not run.
_NOT_RUN = frozenset({"tool_not_found", "invalid_arguments"})


def _ran(result: dict[str, Any]) -> bool:
    # A rejected duplicate, a refused rule, an unknown tool or unusable arguments did not run.
    return not is_rejected(result) and result.get("error_type") not in _NOT_RUN


@dataclass(frozen=True)
class Summary:
    """The final summary of a budget-stopped run: its text and where it came from."""

    text: str
    source: str  # "model" or "fallback"


class FinalSummary:
    """The summary step of one run (``enabled=False``: ``final_summary=False`` in the payload).

    ``summarize(messages, prompt)`` makes the tool-less call (the turn runner's); the
    ``final_summary`` event reports how it went.
    """

    def __init__(self, summarize: Summarize, emit: Emit, *, enabled: bool = True,
                 grace_seconds: float = SUMMARY_GRACE_SECONDS,
                 usage: Mapping[str, Any] | None = None) -> None:
        self.summarize = summarize
        self.emit = emit
        # The summary calls' usage as the turn runner adds it up (read when the event is sent).
        self.usage = usage
        self.enabled = enabled
        self.grace_seconds = grace_seconds

    def wanted(self, stop: RunStop) -> bool:
        """A budget stopped a model that had not answered yet."""
        if not self.enabled or stop.status != "budget_exceeded" or stop.budget is None:
            return False
        return bool(stop.last_tool_calls) or not stop.final_content

    def steps(self, stop: RunStop, deadline: float | None) -> Steps[Summary | None]:
        """The summary (yielding the provider call to await when it is async), or None."""
        if not self.wanted(stop):
            return None
        assert stop.budget is not None
        snapshot = stop.budgets.get(stop.budget, {})
        current, ceiling = int(snapshot.get("current", 0)), int(snapshot.get("ceiling", 0))
        calls = sum(1 for r in stop.tool_execution_results if _ran(r["result"]))
        prompt = summary_prompt(stop.budget, current, ceiling, calls)
        grace = (self.grace_seconds if deadline is None
                 else min(self.grace_seconds, max(deadline, 0) + 5))
        attempts, error, text = 0, None, None
        while attempts < 2 and not text:
            attempts += 1
            try:
                answer = self.summarize(stop.messages, prompt)
                if awaitable(answer):
                    answer = yield asyncio.wait_for(answer, timeout=grace)
            except Exception as exc:  # any failure of the summary call falls back
                error = str(exc) or type(exc).__name__
                if isinstance(exc, SummaryWontFit):  # the budgets working, not a failure
                    logger.info("datamachine: no final summary: %s", error)
                else:
                    logger.warning("datamachine: final summary call failed: %s", error)
                break
            text = strip_thinking(str(answer or ""))
        summary = (Summary(text, "model") if text
                   else Summary(fallback_summary(stop.budget, current, ceiling, calls),
                                "fallback"))
        payload: dict[str, Any] = {"budget": stop.budget, "tool_calls": calls,
                                   "source": summary.source, "attempts": attempts}
        if error:
            payload["error"] = error
        if self.usage:
            payload["usage"] = dict(self.usage)
        self.emit("final_summary", payload)
        return summary
