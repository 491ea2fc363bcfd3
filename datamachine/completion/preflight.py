"""Preflight: refuse a run whose completion assertions can never be satisfied.

If an assertion requires a tool the run does not offer, every final answer would be nudged
until the turns run out, spending tokens on a run that cannot succeed. The check costs nothing
and runs before the first provider call, so the user gets an error naming the tools instead.
"""

from __future__ import annotations

from collections.abc import Iterable

from datamachine.completion.assertions import CompletionAssertions

__all__ = ["ERROR_CODE", "unavailable_message", "unavailable_required_tool_names"]

ERROR_CODE = "completion_required_tool_unavailable"


def unavailable_required_tool_names(
    assertions: CompletionAssertions, available: Iterable[str]
) -> list[str]:
    """Required tools that are not in ``available``, in config order.

    Required are ``required_tool_names`` and the tools of ``minimum_successful_tool_counts``.
    ``complete_when_any`` needs only one reachable outcome: its tools count as required only
    when no outcome has all of its tools available.
    """
    offered = set(available)
    required: list[str] = []
    for name in [*assertions.required_tool_names, *assertions.minimum_successful_tool_counts]:
        if name not in required:
            required.append(name)
    outcomes = assertions.complete_when_any
    if outcomes and not any(all(t.name in offered for t in o.tools) for o in outcomes):
        for outcome in outcomes:
            for requirement in outcome.tools:
                if requirement.name not in required:
                    required.append(requirement.name)
    return [name for name in required if name not in offered]


def unavailable_message(names: Iterable[str]) -> str:
    """The error a user reads: which tools, and how to fix the run."""
    listing = ", ".join(names)
    return (f"Completion assertions require unavailable tool(s): {listing}. Make them available "
            "by passing them in the run's tools (or remove them from completion_assertions), so "
            "every tool the assertions require can be called by the model.")
