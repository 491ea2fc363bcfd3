"""Token and cost budgets inside one run: total_tokens, cost, prices, pressure in tokens and
dollars, and a final summary that must fit (DESIGN.md section 15)."""

from __future__ import annotations

from typing import Any

import pytest

from datamachine import UsageError
from datamachine.conversation.metering import estimate_prompt_tokens, format_usd
from datamachine.errors import InvalidBudgetValue, InvalidSetting
from datamachine.host import Host
from datamachine.tools import Tool

USER = [{"role": "user", "content": "go"}]
RAN: list[int] = []


def _ping(i: int) -> str:
    RAN.append(i)
    return f"pong {i}"


PING = Tool(name="ping", description="Ping.", function=_ping)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    RAN.clear()


def turn(i: int, prompt: int = 100, completion: int = 20, *,
         content: str = "") -> dict[str, Any]:
    return {"content": content,
            "tool_calls": [{"id": f"c{i}", "name": "ping", "parameters": {"i": i}}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion}}


def answer(text: str = "done", prompt: int = 100, completion: int = 20) -> dict[str, Any]:
    return {"content": text, "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                       "total_tokens": prompt + completion}}


def sent(host: Host) -> list[Any]:
    """Every request the scripted provider received (its request log)."""
    provider: Any = host.providers.get("scripted")
    return list(provider.record)


def run(host: Host, script: list[dict[str, Any]], model: str = "m", **payload: Any) -> Any:
    provider: Any = host.providers.get("scripted")
    provider.record.clear()
    return host.run_conversation(USER, [PING], "scripted", model,
                                 payload={"script": script, **payload})


def test_token_and_cost_budgets_are_absent_without_a_ceiling(host: Host) -> None:
    result = run(host, [turn(1), answer()])
    assert result.status == "completed"
    assert "total_tokens" not in result.budgets
    assert "cost" not in result.budgets
    assert "cost_usd" not in result.usage


def test_usage_after_the_fact_stops_the_next_turn_before_its_calls_run(host: Host) -> None:
    result = run(host, [turn(1, prompt=900, completion=300), turn(2), answer()],
                 budget_ceilings={"total_tokens": 1000})
    assert (result.status, result.budget) == ("budget_exceeded", "total_tokens")
    assert result.flags == ["max_total_tokens_reached"]
    assert RAN == []  # the answer used the budget up: its call waits, it does not run
    assert len(sent(host)) == 1  # no second request, and no summary (nothing left for one)
    assert result.budgets["total_tokens"]["current"] == 1200
    assert result.warning == "Maximum total tokens (1,000 tokens) reached (1,200 tokens used)."
    assert "no final summary could be produced" in result.final_content


def test_a_request_that_would_pass_the_ceiling_is_not_sent(host: Host) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    # The first request's estimate is a few dozen tokens; its answer reports 150.
    result = run(host, [turn(1, prompt=100, completion=50), turn(2), answer()],
                 budget_ceilings={"total_tokens": 151},
                 event_sink=lambda e, p: events.append((e, p)))
    assert (result.status, result.budget, result.turn_count) == (
        "budget_exceeded", "total_tokens", 1)
    assert RAN == [1]  # 150 < 151: the call ran; the next request would pass 151
    assert len(sent(host)) == 1
    stop = next(p for e, p in events if e == "budget_exceeded")
    assert stop["current"] == 150
    assert stop["needed"] > 1
    assert result.warning is not None
    assert "would pass the total tokens budget" in result.warning
    assert "150 tokens of 151 tokens used" in result.warning


def test_the_documented_estimate_is_the_request_s_json_bytes_over_four(host: Host) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    result = run(host, [answer()], budget_ceilings={"total_tokens": 1},
                 event_sink=lambda e, p: events.append((e, p)))
    assert result.turn_count == 0
    assert sent(host) == []
    needed = next(p for e, p in events if e == "budget_exceeded")["needed"]
    # The same request, sent for real: its messages and tools as the runner measured them.
    seen: list[dict[str, Any]] = []
    run(host, [answer()], event_sink=lambda e, p: seen.append(p)
        if e == "request_built" else None)
    meta = seen[0]["request_metadata"]
    assert needed == estimate_prompt_tokens(
        int(meta["messages_json_bytes"]) + int(meta["tools_json_bytes"]))
    assert estimate_prompt_tokens(9) == 3
    assert estimate_prompt_tokens(8) == 2


def test_the_setting_sets_the_ceiling_and_budget_ceilings_overrides_it(host: Host) -> None:
    host.settings.set("max_total_tokens", 5000)
    result = run(host, [answer()])
    assert result.budgets["total_tokens"]["ceiling"] == 5000
    assert result.budgets["total_tokens"]["current"] == 120
    assert run(host, [answer()], budget_ceilings={"total_tokens": 700}
               ).budgets["total_tokens"]["ceiling"] == 700
    with pytest.raises(InvalidBudgetValue, match="max_total_tokens"):
        host.settings.set("max_total_tokens", 0)


def test_prices_give_cost_usd_and_feed_the_cost_budget(host: Host) -> None:
    host.settings.set("prices", {"m": {"input": 2.5, "output": 10}})
    result = run(host, [turn(1, 1000, 200), answer("done", 1000, 200)])
    # Each turn: 1000 x 2.5 + 200 x 10 = 4500 microdollars.
    assert result.usage["cost_usd"] == pytest.approx(0.009)
    assert "cost" not in result.budgets  # a price alone sets no ceiling
    other = run(host, [answer()], model="unpriced")
    assert "cost_usd" not in other.usage


def test_a_cost_ceiling_stops_in_dollars(host: Host) -> None:
    host.settings.set("prices", {"m": {"input": 2.5, "output": 10}})
    host.settings.set("max_cost_usd", 0.006)
    result = run(host, [turn(1, 1000, 200), turn(2, 1000, 200), answer()])
    assert (result.status, result.budget) == ("budget_exceeded", "cost")
    assert result.flags == ["max_cost_reached"]
    assert result.budgets["cost"]["ceiling"] == 6000
    assert result.budgets["cost"]["current"] == 9000
    assert result.usage["cost_usd"] == pytest.approx(0.009)
    assert result.warning == "Maximum cost ($0.006) reached ($0.009 used)."


def test_a_cost_ceiling_without_a_price_is_refused_before_the_run(host: Host) -> None:
    with pytest.raises(UsageError, match="no price for model 'm'"):
        run(host, [answer()], budget_ceilings={"cost": 1000})


@pytest.mark.parametrize(("value", "words"), [
    ({"m": {"input": -1, "output": 1}}, "'input'"),
    ({"m": {"input": 1}}, "'output'"),
    ({"m": {"input": 1, "output": 1, "cache": 1}}, "unknown keys"),
    ([1], "must be an object"),
])
def test_bad_prices_are_refused_naming_the_field(host: Host, value: Any, words: str) -> None:
    with pytest.raises(InvalidSetting, match=words):
        host.settings.set("prices", value)


@pytest.mark.parametrize("value", [0, -0.5, float("nan"), "1", True, 2_000_000])
def test_max_cost_usd_is_a_positive_number_of_dollars(host: Host, value: Any) -> None:
    with pytest.raises(InvalidBudgetValue, match="max_cost_usd"):
        host.settings.set("max_cost_usd", value)


def test_pressure_speaks_in_tokens(host: Host) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    run(host, [turn(1, 1200, 300), turn(2, 200, 120), answer()],
        budget_ceilings={"total_tokens": 2000}, budget_pressure=True,
        event_sink=lambda e, p: events.append((e, p)))
    requests = sent(host)
    notices = [[m["content"] for m in r.messages if "BUDGET" in str(m.get("content"))]
               for r in requests]
    assert not any("total tokens" in n for n in notices[0])
    # 1,500 of 2,000 spent before the second request: the caution tier (75 %).
    assert ("[BUDGET: 1,500 tokens of 2,000 tokens used (total tokens). 500 tokens left. Start "
            "consolidating your work.]") in notices[1]
    # 1,820 of 2,000 before the third: the warning tier (91 %).
    assert any(n.startswith("[BUDGET WARNING: 1,820 tokens of 2,000 tokens used")
               for n in notices[2])
    tiers = [(p["tier"], p["current"]) for e, p in events
             if e == "budget_pressure" and p["budget"] == "total_tokens"]
    assert tiers == [("caution", 1500), ("warning", 1820)]


def test_pressure_speaks_in_dollars(host: Host) -> None:
    host.settings.set("prices", {"m": {"input": 1, "output": 1}})
    run(host, [turn(1, 700, 100), answer()], budget_ceilings={"cost": 1000},
        budget_pressure=True)
    second = sent(host)[1]
    assert any(str(m["content"]).startswith("[BUDGET: $0.0008 of $0.001 used (cost). "
                                            "$0.0002 left.") for m in second.messages)


def test_a_summary_that_fits_is_asked_for_with_max_tokens_lowered(host: Host) -> None:
    result = run(host, [turn(1), turn(2), answer("what was done")], budget_ceilings={
        "conversation_turns": 2, "total_tokens": 1000})
    assert (result.status, result.budget) == ("budget_exceeded", "conversation_turns")
    summary = sent(host)[-1]
    assert summary.tools == []
    # 240 of 1,000 spent; what is left after the summary's own prompt bounds its answer.
    assert 0 < summary.options["max_tokens"] < 760
    assert result.budgets["total_tokens"]["current"] == 240 + 120  # the summary is counted
    assert result.final_content == "what was done"


def test_a_summary_that_cannot_fit_is_never_sent(host: Host) -> None:
    result = run(host, [turn(1, 100, 50), turn(2)], budget_ceilings={
        "conversation_turns": 1, "total_tokens": 200})
    assert result.budget == "conversation_turns"
    assert len(sent(host)) == 1  # 150 of 200 spent: no room for a prompt and 64 answer tokens
    assert "no final summary could be produced" in result.final_content


def test_format_usd() -> None:
    assert [format_usd(v) for v in (0, 720_000, 1_000_000, 1_250_000_000, 150, 6000)] == [
        "$0.00", "$0.72", "$1.00", "$1,250.00", "$0.00015", "$0.006"]


def test_a_total_without_a_split_is_still_priced(host: Host) -> None:
    host.settings.set("prices", {"m": {"input": 1, "output": 3}})
    result = run(host, [{"content": "done", "usage": {"total_tokens": 1000}}],
                 budget_ceilings={"cost": 10**9})
    # The prompt estimate is the prompt part, the rest the answer: never priced at zero.
    assert result.usage["cost_usd"] > 0.001
    assert result.budgets["cost"]["current"] > 1000


def test_a_failed_request_is_charged_its_estimate(host: Host) -> None:
    result = run(host, [{"error": "the connection dropped"}],
                 budget_ceilings={"total_tokens": 10_000})
    assert result.status == "error"
    # It may have reached the provider and been billed: its prompt estimate counts.
    assert result.budgets["total_tokens"]["current"] > 0
