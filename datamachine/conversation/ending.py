"""How a run ends: the final summary (:class:`FinalSummary`) and the verdict (:func:`decide`).

**The final summary.** When a budget stops a model that was still calling tools, it is asked
once, with no tools, for a summary, so a run that ran out of budget never ends empty-handed. The
request tells the model how many tool calls ran (so it cannot claim nothing was done).
``<think>`` blocks are stripped, an empty answer is retried once, and a failed or empty call
falls back to a fixed sentence naming the budget. The call is not a turn: ``turn_count`` does
not change, and the status still says ``budget_exceeded``.

**The verdict.** The loop says why it stopped (a budget, an error, a final answer). The product
adds what only it knows: the completion rules (an answer that leaves assertions unmet is
``incomplete``), a chat session's turn limit (declined: ``aborted``, naming the budget
``chat_turns`` with its flag, as every budget stop does), the turn budget's own wording, and
the final summary. The verdict is decided once, while the run still holds its lock, and handed
to the loop as a :class:`~agents_api.StopVerdict` that the loop applies once
(``RunStop.decided``), so the stored transcript, the job, the terminal event and the returned
result all say the same thing.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from agents_api import IterationBudget, Message, RunStop, StopVerdict
from agents_api.drive import Steps, awaitable
from agents_api.jsontext import compact_bytes
from agents_api.records import LoopStatus
from agents_api.results import unchecked, updated
from datamachine.budgets_builtin import CONVERSATION_TURNS
from datamachine.conversation.metering import RunMeter, SummaryWontFit
from datamachine.conversation.pausing import pending_warning
from datamachine.conversation.provider_turn import ProviderTurn, describe_ignored_usage
from datamachine.providers.base import ProviderResponse
from datamachine.tools.results import is_rejected

if TYPE_CHECKING:
    from agents_api.budget import BudgetSnapshot
    from datamachine.completion.controller import CompletionRun
    from datamachine.conversation.output import OutputContract

__all__ = ["EMPTY_ANSWER", "EMPTY_ANSWER_WARNING", "OUTPUT_TRUNCATED", "TRUNCATED_WARNING",
           "Abort", "FinalSummary", "Summary", "TurnGate", "decide", "fallback_summary",
           "strip_thinking", "summary_prompt"]

logger = logging.getLogger("datamachine.exhaustion")

_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL | re.IGNORECASE)
SUMMARY_GRACE_SECONDS = 30.0

Emit = Callable[[str, dict[str, Any]], None]
# (messages, the summary prompt's bytes, the answer tokens wanted) -> the messages to send and
# the answer tokens there is room for (None: it does not fit).
SummaryFit = Callable[[list[Message], int, int], tuple[list[Message], int | None]]
# What a final summary of a run with a context window may answer at most, in tokens.
SUMMARY_ANSWER_TOKENS = 1024


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
                 enabled: bool = True, grace_seconds: float = SUMMARY_GRACE_SECONDS,
                 fit: SummaryFit | None = None) -> None:
        self.turn = turn
        self.emit = emit
        self.meter = meter
        self.fit = fit
        self.enabled = enabled
        self.grace_seconds = grace_seconds
        # Tokens spent by the summary call, which is not a turn of the loop.
        self.usage: dict[str, Any] = {}

    def wanted(self, stop: RunStop) -> bool:
        """A budget stopped a model that had not answered yet."""
        if not self.enabled or stop.status != "budget_exceeded" or stop.budget is None:
            return False
        return bool(stop.last_tool_calls) or not stop.final_content

    def steps(self, stop: RunStop, deadline: float | None,
              on_overflow: Callable[[BaseException], bool] | None = None
              ) -> Steps[Summary | None]:
        """The summary (yielding the provider call to await when it is async), or None.
        ``on_overflow``: told when the provider says the summary's prompt is too long (True:
        the window was lowered, try again to fit it; at most twice)."""
        if not self.wanted(stop):
            return None
        assert stop.budget is not None
        snapshot: BudgetSnapshot | dict[str, int] = stop.budgets.get(stop.budget, {})
        current, ceiling = int(snapshot.get("current", 0)), int(snapshot.get("ceiling", 0))
        calls = sum(1 for r in stop.tool_execution_results if _ran(r["result"]))
        prompt = summary_prompt(stop.budget, current, ceiling, calls)
        grace = (self.grace_seconds if deadline is None
                 else min(self.grace_seconds, max(deadline, 0) + 5))
        attempts, error, text, overflows = 0, None, None, 0
        while attempts < 2 and not text:
            attempts += 1
            try:
                answer: object = self.summarize(stop.messages, prompt)
                if awaitable(answer):
                    answer = yield asyncio.wait_for(answer, timeout=grace)
            except Exception as exc:  # any failure of the summary call falls back
                if (getattr(exc, "code", None) == "context_overflow" and on_overflow is not None
                        and overflows < 2 and on_overflow(exc)):
                    overflows += 1
                    attempts -= 1  # made to fit the window it learned: not a failed attempt
                    continue
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
        room = None
        if self.fit is not None:  # the context window: a view that leaves room to answer
            messages, room = self.fit(messages, len(compact_bytes(extra)) + 1,
                                      SUMMARY_ANSWER_TOKENS)
            if room is None:
                raise SummaryWontFit("the final summary does not fit the model's context "
                                     "window")
        request = turn.request(messages, number, extra=[extra], tools=[])
        if room is not None:
            key = ("max_completion_tokens" if "max_completion_tokens" in request.options
                   else "max_tokens")
            given = request.options.get(key)
            request = updated(request, options={
                **request.options, key: min(given, room) if isinstance(given, int) else room})
        turn.metadata["final_summary"] = True
        if meter is not None:  # only a summary that fits the run's budgets is asked for
            request = meter.admit_summary(
                request, turn.projector.bytes + len(compact_bytes(extra)) + 1)
        turn.summary_sent()
        try:
            answer = turn.dispatch(request)
        except BaseException as exc:
            turn.record_summary(number, request.options, None, exc)
            if meter is not None:
                meter.charge_failed()
            raise
        if inspect.isawaitable(answer):
            return self._text_later(answer, number, request.options)
        return self._text(answer, number, request.options)

    async def _text_later(self, answer: Awaitable[Any], turn: int,
                          options: Mapping[str, Any]) -> str:
        try:
            response = await answer
        except BaseException as exc:
            self.turn.record_summary(turn, options, None, exc)
            if self.meter is not None:
                self.meter.charge_failed()
            raise
        return self._text(response, turn, options)

    def _text(self, answer: Any, turn: int, options: Mapping[str, Any]) -> str:
        if not isinstance(answer, ProviderResponse | Mapping):
            if self.meter is not None:
                self.meter.release()
            return ""
        response = self.turn.read(answer, turn)
        self.turn.record_summary(turn, options, response, None)
        if response.ignored_usage is not None:
            logger.warning(describe_ignored_usage(self.turn.provider_name,
                                                  response.ignored_usage))
        for key, value in response.usage.items():
            self.usage[key] = self.usage.get(key, 0) + value
        if self.meter is not None:
            self.meter.settle(response.usage, response.content)
        return response.content


# -- the verdict ----------------------------------------------------------------------------
# The flag and warning of a run whose model answered with no text after its tool calls, even
# when nudged once (DESIGN 25).
EMPTY_ANSWER = "empty_answer"
EMPTY_ANSWER_WARNING = ("The model gave an empty answer after its tool calls, also when asked "
                        "again; the tool results are in the transcript.")
# The flag and warning of a final answer the output token limit cut off (DESIGN 12).
OUTPUT_TRUNCATED = "output_truncated"
TRUNCATED_WARNING = ("The final answer was cut off by the output token limit "
                     "(finish_reason 'length'); raise max_tokens in model_options or ask for a "
                     "shorter answer.")

# Result diagnostics the transcript store keeps with a finished run (when not empty).
_STORED_DIAGNOSTICS = ("blocker", "max_turns_reached", "completion_nudge_count",
                       "completion_assertions_complete", "completion_assertions_missing",
                       "remaining_handlers")


class TurnGate(Protocol):
    """Asked after every provider answer (a chat session's turn limit): False declines the
    turn's tool calls and ends the run after it; ``aborted`` then says so, ``notice`` why, and
    :meth:`budget` is the limit that stopped it. ``pending`` (set at the limit with
    ``confirmation="pause"``): the run pauses before the turn's calls run, if it would go on.
    ``warnings``: what opening the session reported (a limit clamped), for the run's result."""

    aborted: bool
    notice: str
    pending: dict[str, Any] | None
    warnings: list[str]

    def __call__(self, turn: int) -> bool:
        """Count turn ``turn``; whether the run may go on."""

    def budget(self) -> IterationBudget:
        """The limit as a budget: its count against its ceiling."""


@dataclass(frozen=True, slots=True)
class Abort:
    """Why a run ends ``aborted``: ``notice`` (its warning) and the budget that stopped it (a
    chat session's ``chat_turns``, declined at its limit), or None (a stream's consumer left)."""

    notice: str
    budget: IterationBudget | None = None


def decide(stop: RunStop, *, turn_ceiling: int, completion: CompletionRun,
           summary: Summary | None = None, summary_usage: dict[str, Any] | None = None,
           abort: Abort | None = None, truncated: bool = False,
           output: OutputContract | None = None, partial: str = "",
           metered_warning: str | None = None, pending_extra: Mapping[str, Any] | None = None,
           warnings: list[str] | None = None,
           timeline: list[dict[str, Any]] | None = None,
           compactions: list[dict[str, Any]] | None = None,
           spent: IterationBudget | None = None,
           budgets: Mapping[str, dict[str, object]] | None = None
           ) -> tuple[StopVerdict, dict[str, Any]]:
    """The verdict on ``stop`` (see the module docstring), and the run's completion
    diagnostics. Pure: reads, never writes.

    ``truncated``: the run ended on a final answer the output token limit cut off
    (``finish_reason == "length"``), which is never a completed task. ``output``: the run's
    output type; a run whose last answer does not fit it is ``incomplete`` (also when the turns
    ran out retrying), never ``completed``. ``partial``: the text of an answer whose stream was
    cut (the wall clock, a consumer that left), kept as the final content.
    ``metered_warning``: the warning of a stop on a token or cost budget, in its own words.
    ``pending_extra``: what a paused run's ``pending`` carries beyond the loop's word (its
    tools, the pause's id). ``warnings``, ``timeline`` and ``compactions`` (its context
    compactions, the latest with its view): the run's, stored with its end. ``spent``: a
    budget the product counts itself that ended the run (provider retries: an ``error``;
    completion nudges, output re-asks: ``incomplete``), named with its flag like any budget.
    ``budgets``: snapshots of the budgets the product counted itself, for the result.
    """
    diagnostics = completion.diagnostics()
    status, budget, flags, warning = stop.status, stop.budget, list(stop.flags), stop.warning
    final_content = stop.final_content or partial
    messages: list[Message] = []
    pending: dict[str, Any] | None = None
    if status == "awaiting_confirmation":
        pending = {**(stop.pending or {}), **(pending_extra or {})}
        budget, flags, warning = pending.get("budget"), [], pending_warning(pending)
    else:
        status, budget, flags, warning, final_content = _judged(
            stop, turn_ceiling, completion, abort, truncated, output, metered_warning,
            final_content if summary is None else summary.text, spent)
        if summary is not None:
            messages = [Message.text("assistant", summary.text, {"type": "final_summary"})]
    max_turns_reached = status == "budget_exceeded" and budget == CONVERSATION_TURNS
    fields = {"blocker": diagnostics.get("blocker"), "max_turns_reached": max_turns_reached,
              **diagnostics}
    stored = {key: fields[key] for key in _STORED_DIAGNOSTICS
              if fields.get(key) not in (None, [], {}, 0, False)}
    if timeline:
        stored["timeline"] = list(timeline)
    if compactions:
        stored["compactions"] = compactions
    # The run's own values (a Message list, dicts it built): not validated again.
    verdict = unchecked(StopVerdict, status=status, budget=budget, flags=flags,
                        warning=warning, final_content=final_content, messages=messages,
                        usage=dict(summary_usage or {}), warnings=list(warnings or []),
                        metadata=stored, pending=pending, budgets=dict(budgets or {}))
    return verdict, diagnostics


def _judged(stop: RunStop, turn_ceiling: int, completion: CompletionRun,
            abort: Abort | None, truncated: bool, output: OutputContract | None,
            metered_warning: str | None, final_content: str,
            spent: IterationBudget | None = None
            ) -> tuple[LoopStatus, str | None, list[str], str | None, str]:
    """(status, budget, flags, warning, final content) of a run that is not paused."""
    status, budget, flags, warning = stop.status, stop.budget, list(stop.flags), stop.warning
    max_turns_reached = status == "budget_exceeded" and budget == CONVERSATION_TURNS
    if max_turns_reached:
        warning = (f"Maximum conversation turns ({turn_ceiling}) reached. "
                   "Response may be incomplete.")
    elif metered_warning is not None:
        warning = metered_warning
    judgement = completion.judge(status, budget, warning, turn_ceiling)
    status, warning = judgement.status, judgement.warning
    if output is not None and output.value is None and (
            status == "completed" or (max_turns_reached and output.problem is not None)):
        status = "incomplete"
        warning = (f"The final answer did not match output_type {output.name}: "
                   f"{output.problem or 'no answer was given'}.")
    if truncated and status in ("completed", "incomplete"):
        flags.append(OUTPUT_TRUNCATED)
        if status == "completed":
            status, warning = "incomplete", TRUNCATED_WARNING
    if completion.empty_answer and status in ("completed", "incomplete"):
        # Never an earlier turn's words ("Let me check the weather first.") as the answer.
        flags.append(EMPTY_ANSWER)
        final_content = ""
        if status == "completed":
            status, warning = "incomplete", EMPTY_ANSWER_WARNING
    if spent is not None and status in ("error", "completed", "incomplete"):
        # One way to say "ran out": the budget's name, its flag, and a warning naming it.
        if status == "completed":
            status = "incomplete"
        budget = spent.name()
        flags.append(spent.to_response_flag())
        warning = spent.to_warning() + (f" {warning}" if warning else "")
    if abort is not None and status in ("completed", "budget_exceeded", "incomplete"):
        # A budget that stopped the run is named as every budget stop names it.
        limit = abort.budget
        status, warning = "aborted", abort.notice
        budget, flags = (limit.name(), [limit.to_response_flag()]) if limit else (None, [])
        final_content = final_content or abort.notice
    return status, budget, flags, warning, final_content
