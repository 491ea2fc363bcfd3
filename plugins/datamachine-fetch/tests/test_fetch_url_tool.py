"""The fetch_url tool against a real HTTP server on loopback (no internet needed)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import datamachine_fetch
import pytest
from datamachine_fetch import HTTP_FETCHES, MAX_BYTES, fetch_url
from fetch_servers import Server, fetch

import bootstrap
from agents_api import IterationBudget, Message, TurnResult, run_loop
from datamachine.host import Host
from datamachine.plugins import make_plugin_manager
from datamachine.registry import IterationBudgetRegistry
from datamachine.tools import ToolExecutor, ToolRegistry


@pytest.fixture
def server() -> Iterator[Server]:
    with Server() as running:
        yield running


@pytest.fixture
def host() -> Iterator[Host]:
    """A host whose site lets fetch_url reach the test servers on 127.0.0.1."""
    with bootstrap.boot(db_path=":memory:", plugins=[datamachine_fetch],
                        load_entrypoints=False) as booted:
        booted.settings.set("fetch_allow_private", ["127.0.0.1/32"])
        yield booted


def registry(ceiling: int | None = None) -> IterationBudgetRegistry:
    settings = {"max_http_fetches": ceiling} if ceiling is not None else {}
    reg = IterationBudgetRegistry(settings_lookup=settings.get)
    reg.register(HTTP_FETCHES)
    return reg


def test_fetch_returns_status_content_type_and_text_and_uses_one_budget_unit(
    host: Host, server: Server,
) -> None:
    budgets: dict[str, IterationBudget] = {}
    result = fetch(ToolExecutor([fetch_url], registry=registry(), host=host),
                   f"{server.url}/page", budgets)
    assert result["success"] is True
    assert result["result"] == {"url": f"{server.url}/page", "status": 200,
                                "content_type": "text/html; charset=utf-8",
                                "text": "<h1>Héllo</h1>", "truncated": False}
    assert budgets["http_fetches"].current() == 1
    assert budgets["http_fetches"].ceiling() == 10


def test_large_bodies_are_cut_to_max_bytes(host: Host, server: Server) -> None:
    result = fetch(ToolExecutor([fetch_url], host=host), f"{server.url}/big", {})
    assert len(result["result"]["text"]) == MAX_BYTES
    assert result["result"]["truncated"] is True


def test_declared_charsets_are_honoured(host: Host, server: Server) -> None:
    result = fetch(ToolExecutor([fetch_url], host=host), f"{server.url}/latin", {})
    assert result["result"]["text"] == "café"


def test_redirects_are_followed_and_the_final_url_reported(host: Host, server: Server) -> None:
    result = fetch(ToolExecutor([fetch_url], host=host), f"{server.url}/redirect", {})
    assert result["result"]["url"] == f"{server.url}/page"
    assert server.paths == ["/redirect", "/page"]


def test_http_errors_are_failed_results_that_still_count(host: Host, server: Server) -> None:
    budgets: dict[str, IterationBudget] = {}
    result = fetch(ToolExecutor([fetch_url], host=host), f"{server.url}/missing", budgets)
    assert result["success"] is False
    assert result["error_type"] == "http_error"
    assert result["error"] == f"GET {server.url}/missing answered HTTP 404 Not Found."
    assert result["status"] == 404
    assert result["text"] == "no such page"
    assert budgets["http_fetches"].current() == 1


@pytest.mark.parametrize("url", ["ftp://example.test/x", "file:///etc/passwd", "/relative",
                                 "http://"])
def test_non_http_urls_are_refused_without_spending_budget(url: str) -> None:
    budgets: dict[str, IterationBudget] = {}
    result = fetch(ToolExecutor([fetch_url]), url, budgets)
    assert result["error_type"] == "invalid_url"
    assert "http_fetches" not in budgets


def test_a_spent_budget_refuses_before_any_request(host: Host, server: Server) -> None:
    budgets = {"http_fetches": IterationBudget("http_fetches", 2, current=2)}
    result = fetch(ToolExecutor([fetch_url], host=host), f"{server.url}/page", budgets)
    assert result["success"] is False
    assert result["error_type"] == "budget_exceeded"
    assert "(2 of 2)" in result["error"]
    assert server.paths == []
    assert budgets["http_fetches"].current() == 2


def test_connection_failures_are_failed_results(host: Host) -> None:
    with Server() as closed:
        url = f"{closed.url}/page"
    result = fetch(ToolExecutor([fetch_url], host=host), url, {})
    assert result["error_type"] == "fetch_failed"
    assert result["error"].startswith(f"Fetching {url} failed: ConnectError")


def test_a_slow_server_times_out_as_a_failed_result(
    host: Host, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(datamachine_fetch, "TIMEOUT_SECONDS", 0.2)
    result = fetch(ToolExecutor([fetch_url], host=host), f"{server.url}/hang", {})
    assert result["error_type"] == "fetch_timeout"
    assert result["error"] == f"Fetching {server.url}/hang timed out after 0.2 seconds."


class KeepFetching:
    """A turn runner for a model that never stops browsing: a new page every turn."""

    def __init__(self, base: str) -> None:
        self.base = base

    def __call__(self, messages: list[Message], context: dict[str, Any]) -> TurnResult:
        turn = context["turn"]
        return TurnResult(tool_calls=[{"id": f"f{turn}", "name": "fetch_url",
                                       "parameters": {"url": f"{self.base}/page?n={turn}"}}])


def test_exhausting_http_fetches_stops_the_loop(host: Host, server: Server) -> None:
    executor = ToolExecutor([fetch_url], mode="chat", registry=registry(ceiling=3),
                            host=host)
    result = run_loop([{"role": "user", "content": "read the whole site"}],
                      KeepFetching(server.url), tool_executor=executor,
                      turn_budget=IterationBudget("conversation_turns", 25))
    assert result.status == "budget_exceeded"
    assert result.budget == "http_fetches"
    assert "max_http_fetches_reached" in result.flags
    assert result.turn_count == 3
    assert len(server.paths) == 3  # the fetch that spent the budget was the last one
    assert result.budgets["http_fetches"]["current"] == 3
    assert all(m.payload["success"] for m in result.messages if m.type == "tool_result")


def test_the_plugin_registers_its_tool_and_budget() -> None:
    pm, _ = make_plugin_manager([datamachine_fetch], load_entrypoints=False, environ={})
    tools = ToolRegistry.from_plugin_manager(pm)
    assert "fetch_url" in tools.names()
    assert tools.owner("fetch_url") == "datamachine_fetch"
    assert pm.hook.register_budgets() == [[HTTP_FETCHES]]
    schema = fetch_url.parameters
    assert schema["required"] == ["url"]
    assert list(schema["properties"]) == ["url"]  # the context argument is not offered
    assert schema["properties"]["url"]["description"].startswith("The absolute http://")
    assert fetch_url.description.startswith("Fetch a web page")
