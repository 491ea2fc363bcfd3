"""payload budget_ceilings: the ceiling of any budget for one run, checked, clamped, reported."""

from __future__ import annotations

from typing import Any

import pytest

from datamachine import BudgetSpec, UsageError
from datamachine.errors import InvalidBudgetValue
from datamachine.host import Host
from datamachine.tools import Tool, ToolContext

USER = [{"role": "user", "content": "go"}]


def calls(n: int, name: str = "ping") -> list[dict[str, Any]]:
    return [{"tool_calls": [{"id": f"c{i}", "name": name, "parameters": {"i": i}}]}
            for i in range(n)]


def _ping(i: int) -> str:
    return f"pong {i}"


PING = Tool(name="ping", description="Ping.", function=_ping)


def run(host: Host, ceilings: Any, script: list[dict[str, Any]], **options: Any) -> Any:
    return host.run_conversation(USER, [PING], "scripted", "m",
                                 payload={"budget_ceilings": ceilings, "script": script,
                                          "final_summary": False}, **options)


def test_a_ceiling_for_the_turn_budget_and_the_tool_budget(host: Host) -> None:
    turns = run(host, {"conversation_turns": 2}, calls(5))
    assert (turns.status, turns.budget, turns.turn_count) == (
        "budget_exceeded", "conversation_turns", 2)
    tools = run(host, {"tool_calls": 3}, calls(5))
    assert (tools.status, tools.budget) == ("budget_exceeded", "tool_calls")
    assert tools.budgets["tool_calls"] == {**tools.budgets["tool_calls"], "current": 3,
                                           "ceiling": 3}


def test_max_turns_wins_over_budget_ceilings(host: Host) -> None:
    result = run(host, {"conversation_turns": 4}, calls(5), max_turns=1)
    assert result.budgets["conversation_turns"]["ceiling"] == 1


def test_a_ceiling_above_the_clamp_is_clamped_and_reported(host: Host) -> None:
    result = run(host, {"tool_calls": 5000}, [*calls(1), {"content": "done"}])
    assert result.budgets["tool_calls"]["ceiling"] == 1000
    assert any("'tool_calls': requested ceiling 5000" in w for w in result.warnings)


def test_a_per_tool_budget_joins_the_run_through_its_ceiling(host: Host) -> None:
    result = run(host, {"tool_calls_ping": 2}, calls(5))
    assert (result.status, result.budget) == ("budget_exceeded", "tool_calls_ping")


def test_a_budget_a_tool_creates_takes_its_ceiling_from_the_payload(host: Host) -> None:
    def fetch(i: int, context: ToolContext) -> str:
        context.budget("fetches").increment()
        return "ok"

    fetcher = Tool(name="fetch", description="Fetch.", function=fetch)
    result = host.run_conversation(
        USER, [fetcher], "scripted", "m",
        payload={"budget_ceilings": {"fetches": 2}, "final_summary": False,
                 "script": calls(5, "fetch")})
    assert (result.status, result.budget) == ("budget_exceeded", "fetches")
    assert result.budgets["fetches"]["ceiling"] == 2


def test_a_token_budget_takes_a_ceiling_in_its_own_range(host: Host) -> None:
    host.budgets.register(BudgetSpec(name="prompt_tokens", unit="tokens", default=1000,
                                     max=10**12))
    with pytest.raises(InvalidBudgetValue, match="between 1 and 10,000"):
        run(host, {"tool_calls": 10**6}, [{"content": "never"}])
    result = run(host, {"prompt_tokens": 10**9, "tool_calls": 10}, [{"content": "hi"}])
    assert result.status == "completed"


@pytest.mark.parametrize(("ceilings", "match"), [
    ([1], "must be a dict"), ({"tool_calls": 0}, "\\['tool_calls'\\]"),
    ({"tool_calls": "3"}, "whole number"), ({"": 3}, "budget names"),
    ({"provider_retries": -1}, "provider_retries"),
    ({"wall_clock_seconds": 0}, "positive number of seconds")])
def test_bad_ceilings_are_refused_before_the_run(host: Host, ceilings: Any, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        run(host, ceilings, [{"content": "never"}])
    assert host.transcripts.list() == []
