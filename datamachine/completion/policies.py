"""Completion policies: who decides that a run is done.

A policy is asked twice per cycle: after every executed tool call
(``record_tool_result``) and whenever the model answers without tool calls
(``record_natural_completion``). It answers with an ``agents_api.Decision``: ``complete=True``
ends the run; ``complete=False`` keeps it going, and a non-empty ``message`` is what the model
reads next.

Built-in policies:

- :class:`DefaultCompletionPolicy` (chat, system and extension modes): tool calls never end the
  run by themselves; a final answer counts once the completion assertions hold, otherwise the
  model is nudged.
- :class:`PipelineCompletionPolicy` (pipeline mode, or any run with
  ``configured_handler_slugs``): as the default, plus handler tools. Every configured handler
  must fire before the run may end, a successful handler tool ends the run once nothing else is
  missing, and so does an outcome of ``complete_when_any``.

Both end the run at once after a successful tool whose runtime declares
``completion_signal: "terminal"``, and neither treats an answer that only narrates a tool
action ("AI ACTION (Turn 4): Executing ...") as final. The messages they return are written
for the model: generic nudges, never assertion mechanics. Why they decided what they did is in
the decision's ``context``, which only users see.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from agents_api import Decision, Message
from datamachine.completion.assertions import (
    COMPLETE_WHEN_ANY,
    AssertionTracker,
    CompletionAssertions,
    Evaluation,
    parse_assertions,
)
from datamachine.completion.nudges import DESCRIBED_ACTION_TEXT, build_nudge, describes_tool_action
from datamachine.tools import Tool

__all__ = [
    "CompletionPolicy",
    "DefaultCompletionPolicy",
    "PipelineCompletionPolicy",
    "is_terminal",
    "normalize_slugs",
]


@runtime_checkable
class CompletionPolicy(Protocol):
    """What ``payload["completion_policy"]`` may be: an object with these two methods.

    ``context`` is a dict with at least ``mode``, ``modes``, ``turn``, ``payload`` and
    ``engine_data``; for tool results also ``parameters`` (what the tool was called with) and
    ``tool_call_id``. A policy may implement only one of the methods: without
    ``record_natural_completion`` a final answer ends the run; without ``record_tool_result``
    tool calls never do.
    """

    def record_tool_result(self, tool_name: str, tool: Tool | None, result: dict[str, Any],
                           context: dict[str, Any]) -> Decision:
        """Called after every executed tool call (``tool`` is None for an unknown name)."""

    def record_natural_completion(self, messages: list[Message], content: str,
                                  context: dict[str, Any]) -> Decision:
        """Called when the model answered without tool calls; ``messages`` end with that
        answer."""


def is_terminal(tool: Tool | None, result: Mapping[str, Any]) -> bool:
    """The tool (or its result's ``runtime``) declares ``completion_signal: "terminal"``."""
    if tool is not None and tool.terminal:
        return True
    runtime = result.get("runtime")
    return isinstance(runtime, Mapping) and runtime.get("completion_signal") == "terminal"


def normalize_slugs(slugs: Iterable[str] | str | None) -> list[str]:
    """Trimmed, de-duplicated handler slugs, empties dropped (one slug may be a bare string)."""
    if slugs is None:
        return []
    if isinstance(slugs, str):
        slugs = [slugs]
    names: list[str] = []
    for slug in slugs:
        cleaned = slug.strip() if isinstance(slug, str) else ""
        if cleaned and cleaned not in names:
            names.append(cleaned)
    return names


def _has_tools(context: Mapping[str, Any]) -> bool:
    names = context.get("tool_names")
    # Called outside a run (no tool list in the context), assume the model has tools.
    return names is None or bool(names)


def _diagnostics(evaluation: Evaluation) -> dict[str, Any]:
    return {"missing": evaluation.missing, "satisfied": evaluation.satisfied,
            "required": evaluation.required}


class DefaultCompletionPolicy:
    """Chat, system and extension modes: the completion assertions decide (module docstring).

    ``assertions`` is a ``completion_assertions`` dict (or a parsed
    :class:`CompletionAssertions`); unknown keys end up in :attr:`warnings`.
    """

    def __init__(self, assertions: Mapping[str, Any] | CompletionAssertions | None = None) -> None:
        self.assertions, self.warnings = parse_assertions(assertions)
        self.tracker = AssertionTracker(self.assertions)
        self.terminal_tool: str | None = None

    def evaluate(self, context: Mapping[str, Any]) -> Evaluation:
        """The assertions against what was recorded and the context's ``engine_data``."""
        return self.tracker.evaluate(context.get("engine_data"))

    def record_tool_result(self, tool_name: str, tool: Tool | None, result: dict[str, Any],
                           context: dict[str, Any]) -> Decision:
        """Record a successful result; only a terminal completion signal ends the run here."""
        succeeded = self.tracker.record(tool_name, result, context.get("parameters"))
        if succeeded and is_terminal(tool, result):
            self.terminal_tool = tool_name
            return Decision(complete=True, context={
                "reason": "terminal_completion_signal", "tool_name": tool_name,
                "completion_signal": "terminal"})
        return self._after_tool(tool_name, tool, succeeded, context)

    def _after_tool(self, tool_name: str, tool: Tool | None, succeeded: bool,
                    context: dict[str, Any]) -> Decision:
        return Decision(complete=False)

    def record_natural_completion(self, messages: list[Message], content: str,
                                  context: dict[str, Any]) -> Decision:
        """A final answer counts once nothing is missing; otherwise nudge the model on."""
        if self.terminal_tool is not None:
            return Decision(complete=True, context={"reason": "terminal_completion_signal",
                                                    "tool_name": self.terminal_tool})
        if describes_tool_action(content) and _has_tools(context):
            return Decision(complete=False, message=DESCRIBED_ACTION_TEXT,
                            context={"reason": "described_tool_action"})
        return self._natural(messages, context)

    def _natural(self, messages: list[Message], context: dict[str, Any]) -> Decision:
        evaluation = self.evaluate(context)
        if evaluation.complete:
            return Decision(complete=True, context={"reason": "assertions_satisfied"}
                            if evaluation.configured else {})
        return Decision(complete=False, message=build_nudge(messages),
                        context={"reason": "assertions_missing", **_diagnostics(evaluation)})


class PipelineCompletionPolicy(DefaultCompletionPolicy):
    """Pipeline mode: the default policy plus handler tools (a :class:`Tool` with ``handler``).

    ``configured_handler_slugs``: handlers that must all fire before the run may end. With
    none configured, the first successful handler tool ends the run (once the assertions hold).
    """

    def __init__(self, assertions: Mapping[str, Any] | CompletionAssertions | None = None,
                 configured_handler_slugs: Iterable[str] | str | None = None) -> None:
        super().__init__(assertions)
        self.configured_handlers = normalize_slugs(configured_handler_slugs)
        self.executed_handlers: list[str] = []

    @property
    def remaining_handlers(self) -> list[str]:
        """Configured handlers that have not fired successfully yet."""
        return [h for h in self.configured_handlers if h not in self.executed_handlers]

    def _handler_context(self) -> dict[str, Any]:
        return {"configured_handlers": list(self.configured_handlers),
                "executed_handlers": list(self.executed_handlers),
                "remaining_handlers": self.remaining_handlers}

    def _after_tool(self, tool_name: str, tool: Tool | None, succeeded: bool,
                    context: dict[str, Any]) -> Decision:
        if not succeeded:
            return Decision(complete=False)
        handler = tool.handler if tool is not None else None
        if handler and handler not in self.executed_handlers:
            self.executed_handlers.append(handler)
        evaluation = self.evaluate(context)
        remaining = self.remaining_handlers
        details = {**self._handler_context(), **_diagnostics(evaluation)}
        if handler:
            if evaluation.complete and not remaining:
                return Decision(complete=True, context={"reason": "handlers_complete", **details})
            reason = "waiting_for_handlers" if remaining else "assertions_missing"
            return Decision(complete=False, context={"reason": reason, **details})
        # A non-handler tool may finish the job when it completes a named outcome.
        if (evaluation.complete and COMPLETE_WHEN_ANY in evaluation.satisfied
                and not remaining):
            return Decision(complete=True, context={"reason": "outcome_satisfied", **details})
        return Decision(complete=False)

    def _natural(self, messages: list[Message], context: dict[str, Any]) -> Decision:
        remaining = self.remaining_handlers
        if not remaining:
            return super()._natural(messages, context)
        evaluation = self.evaluate(context)
        return Decision(complete=False, message=build_nudge(messages), context={
            "reason": "waiting_for_handlers", **self._handler_context(),
            **_diagnostics(evaluation)})
