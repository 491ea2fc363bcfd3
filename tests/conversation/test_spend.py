"""Spend limits across runs (DESIGN.md section 15): windows, scopes, refusal before any provider
call, reservations and settlement, window reset under freezegun."""

from __future__ import annotations

from typing import Any

import pytest
from freezegun import freeze_time

from agents_api import clock
from datamachine.conversation.spending import window_bounds
from datamachine.errors import InvalidSetting
from datamachine.host import Host
from datamachine.storage import WindowKey
from datamachine.tools import Tool

USER = [{"role": "user", "content": "go"}]


def _ping(i: int) -> str:
    return f"pong {i}"


PING = Tool(name="ping", description="Ping.", function=_ping)


def step(i: int, tokens: int = 100) -> dict[str, Any]:
    return {"tool_calls": [{"id": f"c{i}", "name": "ping", "parameters": {"i": i}}],
            "usage": {"prompt_tokens": tokens - 20, "completion_tokens": 20,
                      "total_tokens": tokens}}


def done(tokens: int = 100) -> dict[str, Any]:
    return {"content": "done", "usage": {"prompt_tokens": tokens - 20, "completion_tokens": 20,
                                         "total_tokens": tokens}}


def sent(host: Host) -> list[Any]:
    provider: Any = host.providers.get("scripted")
    return list(provider.record)


def run(host: Host, script: list[dict[str, Any]], **payload: Any) -> Any:
    provider: Any = host.providers.get("scripted")
    provider.record.clear()
    return host.run_conversation(USER, [PING], "scripted", "m",
                                 payload={"script": script, "final_summary": False, **payload})


def daily(limit: int, scope: str = "site", name: str = "daily_tokens") -> dict[str, Any]:
    return {"name": name, "budget": "total_tokens", "window": "day", "limit": limit,
            "scope": scope}


def settled(host: Host, name: str, scope_key: str = "site") -> int:
    start, _ = window_bounds("day", clock.now())
    use = host.spend.use([WindowKey(name, scope_key, start)])[0]
    assert use.reserved == 0  # nothing is left reserved once a run has ended
    return use.settled


@pytest.fixture
def host(backend_host: Host) -> Host:
    """The spend windows' semantics hold on both storage backends."""
    return backend_host


def test_every_request_is_settled_in_the_window(host: Host) -> None:
    host.settings.set("spend_limits", [daily(10_000)])
    first = run(host, [step(1), done()])
    second = run(host, [done(150)])
    assert (first.status, second.status) == ("completed", "completed")
    assert settled(host, "daily_tokens") == 350
    # The window is one of the run's budgets: its use when the run ended.
    assert second.budgets["daily_tokens"]["current"] == 350
    assert second.budgets["daily_tokens"]["ceiling"] == 10_000


def test_a_run_under_a_spent_window_is_refused_before_any_provider_call(host: Host) -> None:
    host.settings.set("spend_limits", [daily(300)])
    run(host, [step(1, 150), done(150)])
    assert settled(host, "daily_tokens") == 300
    refused = run(host, [done()])
    assert (refused.status, refused.budget, refused.turn_count) == (
        "budget_exceeded", "daily_tokens", 0)
    assert refused.flags == ["max_daily_tokens_reached"]
    assert sent(host) == []
    assert refused.warning == "Maximum daily tokens (300 tokens) reached (300 tokens used)."
    assert settled(host, "daily_tokens") == 300


def test_a_window_spent_mid_run_stops_the_next_request(host: Host) -> None:
    host.settings.set("spend_limits", [daily(250)])
    result = run(host, [step(1, 200), step(2), done()])
    # 200 spent; the second request's estimate does not fit in the 50 left.
    assert (result.status, result.budget, result.turn_count) == (
        "budget_exceeded", "daily_tokens", 1)
    assert len(sent(host)) == 1
    assert settled(host, "daily_tokens") == 200


def test_scopes_count_separately_and_only_for_runs_that_have_them(host: Host) -> None:
    host.settings.set("spend_limits", [daily(110, "agent", "per_agent"),
                                       daily(10_000, "session", "per_session"),
                                       daily(10_000, "token", "per_token")])
    alice = run(host, [done()], agent_slug="alice")
    assert set(alice.budgets) >= {"per_agent", "per_session"}
    assert "per_token" not in alice.budgets  # not a /chat request: no token scope
    assert run(host, [done()], agent_slug="alice").budget == "per_agent"  # 100 + est > 110
    assert run(host, [done()], agent_slug="bob").status == "completed"
    anonymous = run(host, [done()])
    assert "per_agent" not in anonymous.budgets
    assert settled(host, "per_agent", "alice") == 100
    assert settled(host, "per_agent", "bob") == 100
    assert settled(host, "per_session", str(anonymous.transcript_session_id)) == 100
    served = run(host, [done()], token_name="partner")
    assert served.status == "completed"
    assert settled(host, "per_token", "partner") == 100


def test_a_cost_window_in_dollars(host: Host) -> None:
    host.settings.set("prices", {"m": {"input": 10, "output": 10}})
    host.settings.set("spend_limits", [{"name": "daily_spend", "budget": "cost",
                                        "window": "day", "limit_usd": 0.002}])
    first = run(host, [done()])  # 100 tokens x $10 per million = 1,000 microdollars
    assert first.usage["cost_usd"] == pytest.approx(0.001)
    assert run(host, [done()]).status == "completed"
    refused = run(host, [done()])
    assert (refused.budget, refused.flags) == ("daily_spend", ["max_daily_spend_reached"])
    assert refused.warning == "Maximum daily spend ($0.002) reached ($0.002 used)."
    assert settled(host, "daily_spend") == 2000


def test_a_cost_window_needs_a_price(host: Host) -> None:
    from datamachine import UsageError

    host.settings.set("spend_limits", [{"name": "daily_spend", "budget": "cost",
                                        "window": "day", "limit": 5000}])
    with pytest.raises(UsageError, match="no price for model 'm'"):
        run(host, [done()])


def test_the_next_window_accepts_again() -> None:
    import bootstrap

    with freeze_time("2026-11-24T23:59:30Z") as frozen:
        host = bootstrap.boot(db_path=":memory:", load_entrypoints=False)
        try:
            host.settings.set("spend_limits", [daily(100)])
            assert run(host, [done()]).status == "completed"
            assert run(host, [done()]).budget == "daily_tokens"
            frozen.move_to("2026-11-25T00:00:01Z")
            again = run(host, [done()])
            assert again.status == "completed"
            assert again.budgets["daily_tokens"]["current"] == 100
        finally:
            host.close()


def test_an_unsettled_reservation_stops_counting_after_its_ttl(host: Host) -> None:
    host.settings.set("spend_limits", [daily(1000)])
    with freeze_time("2026-11-24T12:00:00Z") as frozen:
        start, _ = window_bounds("day", clock.now())
        key = WindowKey("daily_tokens", "site", start)
        ok, _ = host.spend.reserve("killed-run", [(key, 990, 1000)], ttl=300)
        assert ok
        assert host.spend.use([key])[0].used == 990
        assert run(host, [done()]).budget == "daily_tokens"  # 990 reserved: no room
        frozen.tick(301)
        assert host.spend.use([key])[0].reserved == 0
        assert run(host, [done()]).status == "completed"


@pytest.mark.parametrize(("value", "words"), [
    ("nope", "must be a list"),
    ([{"name": "x", "budget": "total_tokens", "window": "week", "limit": 5}], "window"),
    ([{"name": "x", "budget": "total_tokens", "window": "day"}], "exactly one of"),
    ([{"name": "x", "budget": "total_tokens", "window": "day", "limit_usd": 1}], "limit_usd"),
    ([{"name": "x", "budget": "cost", "window": "day", "limit_usd": -1}], "limit_usd"),
    ([{"name": "cost", "budget": "cost", "window": "day", "limit": 5}], "built-in"),
    ([daily(5), daily(6)], "used twice"),
    ([{"name": "x", "budget": "tokens", "window": "day", "limit": 5}], "budget"),
    ([{**daily(5), "scope": "planet"}], "scope"),
])
def test_bad_spend_limits_are_refused_naming_the_entry(host: Host, value: Any,
                                                       words: str) -> None:
    with pytest.raises(InvalidSetting, match=words):
        host.settings.set("spend_limits", value)


def test_windows_are_calendar_windows_in_utc() -> None:
    moment = 1_795_000_000.0  # 2026-11-18T11:06:40Z
    assert window_bounds("hour", moment) == ("2026-11-18T11:00:00Z", 1_795_003_200.0)
    assert window_bounds("day", moment) == ("2026-11-18T00:00:00Z", 1_795_046_400.0)
    assert window_bounds("month", moment) == ("2026-11-01T00:00:00Z", 1_796_083_200.0)
    # December's window resets on the first of January (2027-01-01T00:00:00Z).
    assert window_bounds("month", 1_797_000_000.0) == ("2026-12-01T00:00:00Z", 1_798_761_600.0)
