"""The product's verdict on a stopped run, decided in one place: :func:`decide`.

The loop says why it stopped (a budget, an error, a final answer). The product adds what only it
knows: the completion rules (an answer that leaves assertions unmet is ``incomplete``), a chat
session's turn limit (declined: ``aborted``), the turn budget's own wording, and the final
summary. The verdict is decided once, while the run still holds its lock, and handed to the loop
as a :class:`~agents_api.StopVerdict`, so the stored transcript, the job, the terminal event and
the returned result all say the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agents_api import Message, RunStop, StopVerdict
from agents_api.records import LoopStatus
from datamachine.budgets_builtin import CONVERSATION_TURNS
from datamachine.conversation.exhaustion import Summary
from datamachine.conversation.pausing import pending_warning

if TYPE_CHECKING:
    from datamachine.completion.controller import CompletionRun
    from datamachine.conversation.output import OutputContract

__all__ = ["OUTPUT_TRUNCATED", "TRUNCATED_WARNING", "ProductVerdict", "decide"]

# The flag and warning of a final answer the output token limit cut off (DESIGN 12).
OUTPUT_TRUNCATED = "output_truncated"
TRUNCATED_WARNING = ("The final answer was cut off by the output token limit "
                     "(finish_reason 'length'); raise max_tokens in model_options or ask for a "
                     "shorter answer.")

# Result diagnostics the transcript store keeps with a finished run (when not empty).
_STORED_DIAGNOSTICS = ("blocker", "max_turns_reached", "completion_nudge_count",
                       "completion_assertions_complete", "completion_assertions_missing",
                       "remaining_handlers")


# Never changed once made; slotted, not frozen (see agents_api.records).
@dataclass(slots=True)
class ProductVerdict:
    """Why a run stopped, in the product's terms, and the completion diagnostics."""

    status: LoopStatus
    budget: str | None
    flags: list[str]
    warning: str | None
    final_content: str
    max_turns_reached: bool
    diagnostics: dict[str, Any] = field(default_factory=dict)
    summary: Summary | None = None
    summary_usage: dict[str, Any] = field(default_factory=dict)
    # What a paused run waits for (status awaiting_confirmation), else None.
    pending: dict[str, Any] | None = None

    def result_fields(self) -> dict[str, Any]:
        """The fields of the run's result this verdict decides (for the job's record)."""
        return {"status": self.status, "completed": self.status == "completed",
                "warning": self.warning, "budget": self.budget, "flags": self.flags,
                "final_content": self.final_content,
                "max_turns_reached": self.max_turns_reached, **self.diagnostics}

    def for_the_loop(self, warnings: list[str],
                     timeline: list[dict[str, Any]] | None = None) -> StopVerdict:
        """The verdict as the loop applies it: its fields, the summary message and usage, and
        the run's ``warnings`` and ``timeline`` (its recorded events; both stored with the
        transcript)."""
        messages = ([Message.text("assistant", self.summary.text, {"type": "final_summary"})]
                    if self.summary is not None else [])
        fields = self.result_fields()
        stored = {key: fields[key] for key in _STORED_DIAGNOSTICS
                  if fields.get(key) not in (None, [], {}, 0, False)}
        if timeline:
            stored["timeline"] = list(timeline)
        return StopVerdict(status=self.status, budget=self.budget, flags=self.flags,
                           warning=self.warning, final_content=self.final_content,
                           messages=messages, usage=self.summary_usage, warnings=warnings,
                           metadata=stored, pending=self.pending)


def decide(stop: RunStop, *, turn_ceiling: int, completion: CompletionRun,
           summary: Summary | None = None, summary_usage: dict[str, Any] | None = None,
           chat_abort: str | None = None, truncated: bool = False,
           output: OutputContract | None = None, partial: str = "",
           metered_warning: str | None = None) -> ProductVerdict:
    """The verdict on ``stop`` (see the module docstring). Pure: reads, never writes.

    ``truncated``: the run ended on a final answer the output token limit cut off
    (``finish_reason == "length"``), which is never a completed task. ``output``: the run's
    output type; a run whose last answer does not fit it is ``incomplete`` (also when the turns
    ran out retrying), never ``completed``. ``partial``: the text of an answer whose stream was
    cut (the wall clock, a consumer that left), kept as the final content.
    ``metered_warning``: the warning of a stop on a token or cost budget, in its own words.
    """
    status, budget, flags, warning = stop.status, stop.budget, list(stop.flags), stop.warning
    if status == "awaiting_confirmation":
        pending = dict(stop.pending or {})
        return ProductVerdict(
            status=status, budget=pending.get("budget"), flags=[],
            warning=pending_warning(pending), final_content=stop.final_content or partial,
            max_turns_reached=False, diagnostics=completion.diagnostics(), pending=pending,
            summary_usage=dict(summary_usage or {}))
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
    final_content = summary.text if summary is not None else (stop.final_content or partial)
    if chat_abort is not None and status in ("completed", "budget_exceeded", "incomplete"):
        status, warning, budget, flags = "aborted", chat_abort, None, []
        max_turns_reached = False
        final_content = final_content or chat_abort
    return ProductVerdict(
        status=status, budget=budget, flags=flags, warning=warning,
        final_content=final_content, max_turns_reached=max_turns_reached,
        diagnostics=completion.diagnostics(), summary=summary,
        summary_usage=dict(summary_usage or {}))
