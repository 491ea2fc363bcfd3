"""Graceful exhaustion: when a budget stops a model that was still calling tools, ask it once,
with no tools, for a summary — so a run that ran out of budget never ends empty-handed.

The summary request tells the model how many tool calls ran (so it cannot claim nothing was
done). ``<think>`` blocks are stripped, an empty answer is retried once, and a failed or empty
call falls back to a fixed sentence naming the budget. The call is not a turn: ``turn_count``
does not change, and the status still says ``budget_exceeded``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agents_api import Message, RunStop
from agents_api.drive import Steps, awaitable
from agents_api.jsontext import compact_bytes
from datamachine.conversation.metering import RunMeter, SummaryWontFit
from datamachine.conversation.provider_turn import ProviderTurn, describe_ignored_usage
from datamachine.providers.base import ProviderResponse
from datamachine.tools.results import is_rejected

if TYPE_CHECKING:
    from agents_api.budget import BudgetSnapshot

__all__ = ["FinalSummary", "Summary", "fallback_summary", "strip_thinking", "summary_prompt"]

logger = logging.getLogger("datamachine.exhaustion")

_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL | re.IGNORECASE)
SUMMARY_GRACE_SECONDS = 30.0

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

    It asks the run's provider (``turn``, its :class:`ProviderTurn`) once, with no tools, and
    counts what that cost against the run's ``meter`` (only a summary that fits the run's
    budgets is asked for); ``usage`` adds up what the summary calls reported. The
    ``final_summary`` event reports how it went.
    """

    def __init__(self, turn: ProviderTurn, emit: Emit, *, meter: RunMeter | None = None,
                 enabled: bool = True, grace_seconds: float = SUMMARY_GRACE_SECONDS) -> None:
        self.turn = turn
        self.emit = emit
        self.meter = meter
        self.enabled = enabled
        self.grace_seconds = grace_seconds
        # Tokens spent by the summary call, which is not a turn of the loop.
        self.usage: dict[str, Any] = {}

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
        snapshot: BudgetSnapshot | dict[str, int] = stop.budgets.get(stop.budget, {})
        current, ceiling = int(snapshot.get("current", 0)), int(snapshot.get("ceiling", 0))
        calls = sum(1 for r in stop.tool_execution_results if _ran(r["result"]))
        prompt = summary_prompt(stop.budget, current, ceiling, calls)
        grace = (self.grace_seconds if deadline is None
                 else min(self.grace_seconds, max(deadline, 0) + 5))
        attempts, error, text = 0, None, None
        while attempts < 2 and not text:
            attempts += 1
            try:
                answer: object = self.summarize(stop.messages, prompt)
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

    def summarize(self, messages: list[Message], prompt: str) -> str | Awaitable[str]:
        """One tool-less request for a final summary (not a turn): its text, or an awaitable.

        Goes through the same availability check and ``text_result`` hook as a turn; tool
        calls in the answer are ignored because no tools were offered.
        """
        turn, meter = self.turn, self.meter
        number = int(turn.metadata.get("turn", 0)) + 1
        extra = {"role": "user", "content": prompt}
        request = turn.request(messages, number, extra=[extra], tools=[])
        turn.metadata["final_summary"] = True
        if meter is not None:  # only a summary that fits the run's budgets is asked for
            request = meter.admit_summary(
                request, turn.projector.bytes + len(compact_bytes(extra)) + 1)
        try:
            answer = turn.dispatch(request)
        except BaseException:
            if meter is not None:
                meter.charge_failed()
            raise
        if inspect.isawaitable(answer):
            return self._text_later(answer, number)
        return self._text(answer, number)

    async def _text_later(self, answer: Awaitable[Any], turn: int) -> str:
        try:
            response = await answer
        except BaseException:
            if self.meter is not None:
                self.meter.charge_failed()
            raise
        return self._text(response, turn)

    def _text(self, answer: Any, turn: int) -> str:
        if not isinstance(answer, ProviderResponse | Mapping):
            if self.meter is not None:
                self.meter.release()
            return ""
        response = self.turn.read(answer, turn)
        if response.ignored_usage is not None:
            logger.warning(describe_ignored_usage(self.turn.provider_name,
                                                  response.ignored_usage))
        for key, value in response.usage.items():
            self.usage[key] = self.usage.get(key, 0) + value
        if self.meter is not None:
            self.meter.settle(response.usage, response.content)
        return response.content
