"""Shared test helpers: a scripted turn runner and a one-call executor driver."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agents_api import IterationBudget, LoopResult, Message, TurnResult, run_loop
from datamachine.tools import ToolExecutor


class ScriptedRunner:
    """A turn runner that plays a list of turns (each a list of tool calls), then answers."""

    def __init__(self, turns: Sequence[Sequence[Mapping[str, Any]]], final: str = "done") -> None:
        self.turns = [list(turn) for turn in turns]
        self.final = final
        self.calls = 0

    def __call__(self, messages: list[Message], context: dict[str, Any]) -> TurnResult:
        self.calls += 1
        index = context["turn"] - 1
        if index < len(self.turns):
            return TurnResult(tool_calls=self.turns[index])
        return TurnResult(content=self.final)


def call(name: str, call_id: str, **parameters: Any) -> dict[str, Any]:
    """A tool call as a provider reports it."""
    return {"id": call_id, "name": name, "parameters": parameters}


def run_turns(
    executor: ToolExecutor,
    turns: Sequence[Sequence[Mapping[str, Any]]],
    *,
    messages: Sequence[Message | Mapping[str, Any]] = (),
    max_turns: int = 50,
    budgets: Sequence[IterationBudget] = (),
) -> LoopResult:
    """Run the generic loop with ``executor`` over a scripted conversation."""
    start = list(messages) or [{"role": "user", "content": "go"}]
    return run_loop(start, ScriptedRunner(turns), tool_executor=executor,
                    turn_budget=IterationBudget("conversation_turns", max_turns),
                    budgets=budgets)


def tool_results(result: LoopResult) -> list[Message]:
    """The tool_result envelopes of a run, in order."""
    return [m for m in result.messages if m.type == "tool_result"]
