"""The shipped pytest plugin: ``dm_host``, ``scripted_model`` and the switch that refuses real
model requests, used here exactly as an application's test suite would use them (no import:
the ``pytest11`` entry point provides the fixtures)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

import datamachine
from datamachine import ProviderResponse, tool
from datamachine.host import Host
from datamachine.testing import ScriptedModel


@tool
def get_order(order_id: str) -> dict[str, str]:
    """Look up an order.

    Args:
        order_id: The order number.
    """
    return {"order_id": order_id, "status": "shipped"}


ASK = [{"role": "user", "content": "Where is order A-17?"}]


def test_scripted_model_answers_in_order_and_keeps_what_it_was_asked(
        dm_host: Host, scripted_model: ScriptedModel) -> None:
    scripted_model.enqueue(
        {"tool_calls": [{"name": "get_order", "parameters": {"order_id": "A-17"}}]},
        ProviderResponse(content="Order A-17 has shipped.", usage={"total_tokens": 12}))
    result = dm_host.run_conversation(ASK, [get_order], mode="chat")
    assert result.status == "completed"
    assert result.final_content == "Order A-17 has shipped."
    assert result.tool_execution_results[0]["result"]["result"]["status"] == "shipped"
    first, second = scripted_model.requests
    assert [t["name"] for t in first.tools] == ["get_order"]
    assert second.messages[-1]["role"] == "tool"
    assert scripted_model.last_request is second
    assert scripted_model.remaining == 0


def test_it_stands_in_for_the_provider_the_app_is_configured_for(
        dm_host: Host, scripted_model: ScriptedModel) -> None:
    # An app configured for openai, with no key in the test environment: the scripted model
    # answers instead, and says which provider and model the app asked for.
    dm_host.settings.set("default_provider", "openai")
    dm_host.settings.set("default_model", "gpt-4o-mini")
    scripted_model.enqueue("Bonjour !")
    result = dm_host.run_conversation([{"role": "user", "content": "Say hello in French."}])
    assert (result.status, result.final_content) == ("completed", "Bonjour !")
    [request] = scripted_model.requests
    assert (request.provider, request.model) == ("openai", "gpt-4o-mini")


def test_a_run_past_the_script_fails_with_an_error_naming_the_fixture(
        dm_host: Host, scripted_model: ScriptedModel) -> None:
    scripted_model.enqueue({"tool_calls": [{"name": "get_order",
                                            "parameters": {"order_id": "A-1"}}]})
    result = dm_host.run_conversation(ASK, [get_order])
    assert result.status == "error"
    assert "scripted_model has no response left for request 2" in (result.error or "")


def test_enqueue_refuses_what_cannot_be_an_answer(scripted_model: ScriptedModel) -> None:
    with pytest.raises(datamachine.UsageError, match="enqueue"):
        scripted_model.enqueue(42)  # type: ignore[arg-type]


def test_the_module_level_api_runs_on_dm_host(dm_host: Host,
                                              scripted_model: ScriptedModel) -> None:
    # Application code calls datamachine.run_conversation, not the fixture: it must land on
    # the test's host (its database, its scripted model), not a host booted elsewhere.
    scripted_model.enqueue("From the default host.")
    result = datamachine.run_conversation(ASK)
    assert result.final_content == "From the default host."
    assert [t.id for t in dm_host.transcripts.list()] == [result.transcript_session_id]


def test_the_default_host_is_not_left_behind(dm_host: Host) -> None:
    assert datamachine.get_default_host() is dm_host


def test_the_scripted_provider_still_answers_with_requests_off(dm_host: Host) -> None:
    assert dm_host.settings.get("allow_model_requests") is False
    result = dm_host.run_conversation([{"role": "user", "content": "hi"}])
    assert result.final_content == "echo: hi"


class _CountingServer:
    """A loopback HTTP server that counts requests (a model endpoint that must stay unused)."""

    def __init__(self) -> None:
        hits: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                hits.append(self.path)
                self.send_response(500)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.hits = hits
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint() -> Iterator[_CountingServer]:
    server = _CountingServer()
    try:
        yield server
    finally:
        server.close()


def test_a_real_provider_is_refused_and_never_reached(
        dm_host: Host, endpoint: _CountingServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    dm_host.settings.set("openai_base_url", endpoint.url)
    with pytest.raises(datamachine.ModelRequestsDisabled,
                       match=r"allow_model_requests.*scripted_model") as refused:
        dm_host.run_conversation(ASK, provider="openai", model="gpt-4o-mini")
    assert refused.value.provider == "openai"
    assert endpoint.hits == []
    assert dm_host.transcripts.list() == []  # refused before the run: nothing stored
    # The same host with the switch on does send the request (the check can fail).
    dm_host.settings.set("allow_model_requests", True)
    dm_host.settings.set("provider_max_retries", 0)
    sent = dm_host.run_conversation(ASK, provider="openai", model="gpt-4o-mini")
    assert sent.status == "error"
    assert sent.error_code != "model_requests_disabled"
    assert endpoint.hits == ["/v1/chat/completions"]


def test_the_final_summary_and_streams_are_refused_too(dm_host: Host,
                                                       endpoint: _CountingServer,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    dm_host.settings.set("openai_base_url", endpoint.url)
    with pytest.raises(datamachine.ModelRequestsDisabled):
        list(dm_host.stream_conversation(ASK, None, "openai", "gpt-4o-mini"))
    assert endpoint.hits == []


def test_a_scripted_model_outside_pytest_is_a_plain_plugin() -> None:
    from datamachine.testing import isolated_host

    model = ScriptedModel(["One.", "Two."])
    with isolated_host(plugins=[model], load_entrypoints=False, as_default=False) as host:
        assert host.run_conversation(ASK).final_content == "One."
        assert host.run_conversation(ASK).final_content == "Two."
        assert model.remaining == 0


@pytest.mark.parametrize("value", ["0", "no", "off", '"false"', "False", "nonsense"])
def test_the_switch_fails_closed_on_any_value_but_true(
        value: str, dm_host: Host, endpoint: _CountingServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # DATAMACHINE_ALLOW_MODEL_REQUESTS=0 (or no, off) let a real request out: only `false`
    # refused.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("DATAMACHINE_ALLOW_MODEL_REQUESTS", value)
    dm_host.settings.set("openai_base_url", endpoint.url)
    with pytest.raises(datamachine.ModelRequestsDisabled):
        dm_host.run_conversation(ASK, provider="openai", model="gpt-4o-mini")
    assert endpoint.hits == []
