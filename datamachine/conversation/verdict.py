"""The product's verdict on a stopped run, decided in one place: :func:`decide`.

The loop says why it stopped (a budget, an error, a final answer). The product adds what only it
knows: the completion rules (an answer that leaves assertions unmet is ``incomplete``), a chat
session's turn limit (declined: ``aborted``), the turn budget's own wording, and the final
summary. The verdict is decided once, while the run still holds its lock, and handed to the loop
as a :class:`~agents_api.StopVerdict` that the loop applies once (``RunStop.decided``), so the
stored transcript, the job, the terminal event and the returned result all say the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from agents_api import Message, RunStop, StopVerdict
from agents_api.records import LoopStatus
from datamachine.budgets_builtin import CONVERSATION_TURNS
from datamachine.conversation.exhaustion import Summary
from datamachine.conversation.pausing import pending_warning

if TYPE_CHECKING:
    from datamachine.completion.controller import CompletionRun
    from datamachine.conversation.output import OutputContract

__all__ = ["OUTPUT_TRUNCATED", "TRUNCATED_WARNING", "TurnGate", "decide"]

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
    turn's tool calls and ends the run after it; ``aborted`` then says so, ``notice`` why.
    ``pending`` (set at the limit with ``confirmation="pause"``): the run pauses before the
    turn's calls run, if it would go on."""

    aborted: bool
    notice: str
    pending: dict[str, Any] | None

    def __call__(self, turn: int) -> bool:
        """Count turn ``turn``; whether the run may go on."""


def decide(stop: RunStop, *, turn_ceiling: int, completion: CompletionRun,
           summary: Summary | None = None, summary_usage: dict[str, Any] | None = None,
           chat_abort: str | None = None, truncated: bool = False,
           output: OutputContract | None = None, partial: str = "",
           metered_warning: str | None = None, pending_extra: Mapping[str, Any] | None = None,
           warnings: list[str] | None = None,
           timeline: list[dict[str, Any]] | None = None
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
    tools, the pause's id). ``warnings`` and ``timeline``: the run's, stored with its end.
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
            stop, turn_ceiling, completion, chat_abort, truncated, output, metered_warning,
            final_content if summary is None else summary.text)
        if summary is not None:
            messages = [Message.text("assistant", summary.text, {"type": "final_summary"})]
    max_turns_reached = status == "budget_exceeded" and budget == CONVERSATION_TURNS
    fields = {"blocker": diagnostics.get("blocker"), "max_turns_reached": max_turns_reached,
              **diagnostics}
    stored = {key: fields[key] for key in _STORED_DIAGNOSTICS
              if fields.get(key) not in (None, [], {}, 0, False)}
    if timeline:
        stored["timeline"] = list(timeline)
    verdict = StopVerdict(status=status, budget=budget, flags=flags, warning=warning,
                          final_content=final_content, messages=messages,
                          usage=dict(summary_usage or {}), warnings=list(warnings or []),
                          metadata=stored, pending=pending)
    return verdict, diagnostics


def _judged(stop: RunStop, turn_ceiling: int, completion: CompletionRun,
            chat_abort: str | None, truncated: bool, output: OutputContract | None,
            metered_warning: str | None, final_content: str
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
    if chat_abort is not None and status in ("completed", "budget_exceeded", "incomplete"):
        status, warning, budget, flags = "aborted", chat_abort, None, []
        final_content = final_content or chat_abort
    return status, budget, flags, warning, final_content
