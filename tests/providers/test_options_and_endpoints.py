"""Model options and named endpoints, through a host, against loopback servers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import bootstrap
import datamachine
from datamachine.errors import InvalidSetting, UnknownProvider, UsageError
from datamachine.host import Host
from datamachine.providers.openai import OpenAIProvider
from tests.providers.fake_openai import FakeOpenAIServer, Reply, completion

USER = [{"role": "user", "content": "go"}]


@datamachine.tool
def step(n: int) -> int:
    """Take a step.

    Args:
        n: Which step.
    """
    return n


@pytest.fixture
def host() -> Iterator[Host]:
    booted = bootstrap.boot(db_path=":memory:", load_entrypoints=False)
    try:
        yield booted
    finally:
        booted.close()


def _call(n: int) -> dict[str, Any]:
    return {"id": f"c{n}", "type": "function",
            "function": {"name": "step", "arguments": f'{{"n": {n}}}'}}


# -- model options --------------------------------------------------------------------------

def test_options_reach_the_body_setting_under_payload_and_the_summary_drops_tool_ones(
    openai_server: FakeOpenAIServer, host: Host,
) -> None:
    host.settings.set("openai_base_url", openai_server.url + "/v1")
    host.settings.set("model_options", {"temperature": 0.7, "seed": 7, "top_k": 40})
    openai_server.enqueue(
        *[Reply(body=completion(None, tool_calls=[_call(n)], finish_reason="tool_calls"))
          for n in (1, 2)],
        Reply(body=completion("summary of two steps")))

    result = host.run_conversation(
        USER, [step], "openai", "m", max_turns=2,
        payload={"model_options": {"temperature": 0, "tool_choice": "required",
                                   "parallel_tool_calls": False, "max_tokens": 64}})

    assert result.status == "budget_exceeded"
    assert result.final_content == "summary of two steps"
    first, _, summary = (request.json for request in openai_server.requests)
    # The payload wins key by key; keys nobody documents pass through.
    assert {k: first[k] for k in ("temperature", "seed", "top_k", "max_tokens", "tool_choice",
                                  "parallel_tool_calls")} == {
        "temperature": 0, "seed": 7, "top_k": 40, "max_tokens": 64, "tool_choice": "required",
        "parallel_tool_calls": False}
    # The tool-less summary request: no tools, so no tool options (OpenAI refuses them).
    assert "tools" not in summary
    assert "tool_choice" not in summary
    assert "parallel_tool_calls" not in summary
    assert (summary["temperature"], summary["max_tokens"]) == (0, 64)


@pytest.mark.parametrize(("options", "message"), [
    ({"temperature": "hot"}, "payload['model_options']['temperature']"),
    ({"max_tokens": 0}, "payload['model_options']['max_tokens']"),
    ({"model": "gpt-5"}, "the run decides the request's model"),
    ({"messages": []}, "the run decides the request's messages"),
    ("temperature=0", "must be a dict"),
])
def test_bad_model_options_fail_before_any_request(
    openai_server: FakeOpenAIServer, host: Host, options: Any, message: str,
) -> None:
    host.settings.set("openai_base_url", openai_server.url + "/v1")
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("]", r"\]")):
        host.run_conversation(USER, [], "openai", "m", payload={"model_options": options})
    assert openai_server.requests == []


def test_the_model_options_setting_is_checked_when_written(host: Host) -> None:
    with pytest.raises(InvalidSetting, match="Setting 'model_options'\\['top_p'\\]"):
        host.settings.set("model_options", {"top_p": 3})
    host.settings.set("model_options", {"temperature": 1})  # an int where a float is fine


def test_a_bad_model_options_environment_variable_fails_the_run_naming_it(
    host: Host, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DATAMACHINE_MODEL_OPTIONS", '{"seed": "x"}')
    with pytest.raises(UsageError, match="setting 'model_options'\\['seed'\\]"):
        host.run_conversation(USER, [], "scripted", "m")


# -- named endpoints ------------------------------------------------------------------------

@pytest.fixture
def second_server() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer().start()
    try:
        yield server
    finally:
        server.stop()


def test_two_named_endpoints_on_one_host(
    openai_server: FakeOpenAIServer, second_server: FakeOpenAIServer, host: Host,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOCAL_KEY", "sk-local")
    host.settings.set("providers", {
        "local": {"type": "openai", "base_url": openai_server.url + "/v1",
                  "api_key_env": "LOCAL_KEY", "model_options": {"temperature": 0.1},
                  "headers": {"X-Team": "a"}},
        "other": {"type": "openai", "base_url": second_server.url + "/v1"},
    })
    openai_server.enqueue(Reply(body=completion("from local")), Reply(body=completion("again")))
    second_server.enqueue(Reply(body=completion("from other")))

    assert {"local", "other", "openai", "scripted"} <= set(host.providers.names())
    assert "local" in host.providers
    one = host.run_conversation(USER, [], "local", "m",
                                payload={"model_options": {"temperature": 0.3}})
    two = host.run_conversation(USER, [], "other", "m")
    three = host.run_conversation(USER, [], "local", "m")

    assert (one.final_content, two.final_content, three.final_content) == (
        "from local", "from other", "again")
    first = openai_server.requests[0]
    assert first.headers["authorization"] == "Bearer sk-local"
    assert first.headers["x-team"] == "a"
    assert first.json["temperature"] == 0.3  # the run's options over the endpoint's
    assert openai_server.requests[1].json["temperature"] == 0.1
    assert "authorization" not in second_server.requests[0].headers
    # One pool per endpoint, kept across runs.
    assert openai_server.connections_used == 1


def test_a_changed_endpoint_gets_a_new_provider_and_the_old_pool_is_closed(
    openai_server: FakeOpenAIServer, second_server: FakeOpenAIServer, host: Host,
) -> None:
    host.settings.set("providers", {"x": {"type": "openai", "base_url": openai_server.url}})
    before = host.providers.get("x")
    assert host.providers.get("x") is before
    host.settings.set("providers", {"x": {"type": "openai", "base_url": second_server.url}})
    after = host.providers.get("x")
    assert after is not before
    assert isinstance(after, OpenAIProvider)
    assert after.resolved_base_url() == second_server.url


def test_an_endpoint_wins_over_a_registered_provider_of_its_name(
    openai_server: FakeOpenAIServer, host: Host,
) -> None:
    host.settings.set("providers", {"openai": {"type": "openai",
                                               "base_url": openai_server.url + "/v1"}})
    openai_server.enqueue(Reply(body=completion("configured")))
    assert host.run_conversation(USER, [], "openai", "m").final_content == "configured"


@pytest.mark.parametrize(("entry", "message"), [
    ({"type": "openai", "base_url": "ftp://x"}, "'bad'].base_url: must be an http(s) URL"),
    ({"type": "openai", "api_key": "sk-x"}, "'bad'].api_key: Extra inputs"),
    ({"type": "openai", "api_key_env": "sk-123"}, "'bad'].api_key_env: must be the name"),
    ({"type": "openai", "model_options": {"stream": True}},
     "run decides the request's stream"),
    ({"base_url": "http://x"}, "'bad'].type: Field required"),
])
def test_bad_endpoints_are_refused_when_written(
    host: Host, entry: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidSetting, match=message.replace("[", r"\[").replace("]", r"\]")
                       .replace("(", r"\(").replace(")", r"\)")):
        host.settings.set("providers", {"bad": entry})


def test_an_endpoint_type_nobody_provides_says_what_to_install(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATAMACHINE_PROVIDERS", '{"claude": {"type": "anthropic"}}')
    with pytest.raises(UsageError, match="install the datamachine-anthropic plugin"):
        host.run_conversation(USER, [], "claude", "m")
    with pytest.raises(UnknownProvider, match="Known providers: claude, openai, scripted"):
        host.providers.get("nope")
