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
from collections.abc import Awaitable, Callable, Generator
from typing import Any

from agents_api import LoopResult, Message
from agents_api._drive import resume_async

__all__ = ["fallback_summary", "make_final_summary", "strip_thinking", "summary_prompt"]

logger = logging.getLogger("datamachine.exhaustion")

_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL | re.IGNORECASE)
SUMMARY_GRACE_SECONDS = 30.0

Summarize = Callable[[list[Message], str], Any]


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


def make_final_summary(
    summarize: Summarize,
    emit: Callable[[str, dict[str, Any]], None],
    *,
    enabled: bool = True,
    grace_seconds: float = SUMMARY_GRACE_SECONDS,
) -> Callable[[LoopResult, dict[str, Any]], Awaitable[None] | None]:
    """An ``on_stop`` hook for the loop that adds the summary to a budget-stopped run."""

    def on_stop(result: LoopResult, context: dict[str, Any]) -> Awaitable[None] | None:
        if not enabled or result.status != "budget_exceeded" or result.budget is None:
            return None
        if not result.last_tool_calls and result.final_content:
            return None  # the model already gave its final answer
        snapshot = result.budgets.get(result.budget, {})
        current, ceiling = int(snapshot.get("current", 0)), int(snapshot.get("ceiling", 0))
        calls = sum(1 for m in result.messages if m.type == "tool_call")
        prompt = summary_prompt(result.budget, current, ceiling, calls)
        deadline = context.get("deadline")
        grace = grace_seconds if deadline is None else min(grace_seconds, max(deadline, 0) + 5)
        return _summarize(result, summarize, prompt, emit, grace,
                          fallback_summary(result.budget, current, ceiling, calls), calls)

    return on_stop


class _Attempts:
    """How many summary calls were made and the last failure, for the event."""

    def __init__(self) -> None:
        self.attempts = 0
        self.error: str | None = None


def _attempts(summarize: Summarize, result: LoopResult, prompt: str, grace: float,
              state: _Attempts) -> Generator[Awaitable[Any], Any, str | None]:
    """At most two summary calls; yields the call to await when the provider is async."""
    while state.attempts < 2:
        state.attempts += 1
        try:
            answer = summarize(result.messages, prompt)
            if inspect.isawaitable(answer):
                answer = yield asyncio.wait_for(answer, timeout=grace)
        except Exception as exc:  # any failure of the summary call falls back
            state.error = str(exc) or type(exc).__name__
            logger.warning("datamachine: final summary call failed: %s", state.error)
            return None
        text = strip_thinking(str(answer or ""))
        if text:
            return text
    return None


def _summarize(result: LoopResult, summarize: Summarize, prompt: str,
               emit: Callable[[str, dict[str, Any]], None], grace: float, fallback: str,
               calls: int) -> Awaitable[None] | None:
    """Run the attempts; a sync provider finishes here, an async one in the returned coroutine."""
    state = _Attempts()

    def conclude(text: str | None) -> None:
        source = "model" if text else "fallback"
        text = text or fallback
        result.messages.append(Message.text("assistant", text, {"type": "final_summary"}))
        result.final_content = text
        payload: dict[str, Any] = {"budget": result.budget, "tool_calls": calls,
                                   "source": source, "attempts": state.attempts}
        if state.error:
            payload["error"] = state.error
        emit("final_summary", payload)

    steps = _attempts(summarize, result, prompt, grace, state)
    try:
        pending = next(steps)
    except StopIteration as stop:
        conclude(stop.value)
        return None

    async def finish() -> None:
        conclude(await resume_async(steps, pending))

    return finish()
