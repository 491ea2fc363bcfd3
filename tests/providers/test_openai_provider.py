"""The openai provider against a real Chat Completions server on loopback (no mocked client)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

import pytest

from datamachine.errors import DataMachineError, ProviderError, UsageError
from datamachine.providers.base import ProviderRequest, ProviderResponse
from datamachine.providers.openai import DEFAULT_BASE_URL, OpenAIProvider, parse_retry_after
from tests.providers.fake_openai import FakeOpenAIServer, RecordingSleep, Reply, completion


def _request(**overrides: Any) -> ProviderRequest:
    data: dict[str, Any] = {
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "Hi"}],
        "provider": "openai", "model": "test-model", "request_timeout": 5.0,
        "connect_timeout": 2.0,
    }
    data.update(overrides)
    return ProviderRequest(**data)


def _provider(server: FakeOpenAIServer, sleep: RecordingSleep | None = None,
              **kwargs: Any) -> OpenAIProvider:
    return OpenAIProvider(base_url=server.url + "/v1", api_key="sk-test",
                          sleep=sleep or RecordingSleep(), jitter=lambda: 0.0, **kwargs)


# Every test here runs twice: on the synchronous path (no event loop, the pooled httpx.Client)
# and inside an event loop (the loop's pooled httpx.AsyncClient).
TRANSPORT = {"mode": "sync"}


@pytest.fixture(autouse=True, params=["sync", "async"])
def transport(request: pytest.FixtureRequest) -> Iterator[str]:
    TRANSPORT["mode"] = request.param
    yield request.param
    TRANSPORT["mode"] = "sync"


def _complete(provider: OpenAIProvider, request: ProviderRequest | None = None
              ) -> ProviderResponse:
    asked = request or _request()
    if TRANSPORT["mode"] == "sync":
        answer = provider.complete(asked)
        assert isinstance(answer, ProviderResponse)
        return answer

    async def in_a_loop() -> ProviderResponse:
        pending = provider.complete(asked)
        assert not isinstance(pending, ProviderResponse)
        return await pending

    return asyncio.run(in_a_loop())


def _fail(provider: OpenAIProvider, request: ProviderRequest | None = None) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        _complete(provider, request)
    return caught.value


# -- answers ---------------------------------------------------------------------------------

def test_text_answer_with_usage_and_finish_reason(openai_server: FakeOpenAIServer) -> None:
    usage = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14,
             "prompt_tokens_details": {"cached_tokens": 0}}
    openai_server.enqueue(Reply(body=completion("Hello there.", usage=usage)))

    response = _complete(_provider(openai_server))

    assert response.content == "Hello there."
    assert response.tool_calls == []
    assert response.usage == {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
    assert response.finish_reason == "stop"
    assert response.raw["id"] == "chatcmpl-test"


def test_request_hits_base_url_with_bearer_key_and_wire_shapes(
    openai_server: FakeOpenAIServer,
) -> None:
    openai_server.enqueue(Reply(body=completion("done")))
    request = _request(
        messages=[
            {"role": "user", "content": "Find pluggy"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"id": "c1", "name": "search", "parameters": {"q": "pluggy"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": '{"hits": 3}',
             "metadata": {"dropped": True}},
        ],
        tools=[{"name": "search", "description": "Search the web.",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                               "required": ["q"]}}],
    )

    _complete(_provider(openai_server, model_options={"temperature": 0}), request)

    [received] = openai_server.requests
    assert received.path == "/v1/chat/completions"
    assert received.headers["authorization"] == "Bearer sk-test"
    body = received.json
    assert body["model"] == "test-model"
    assert body["stream"] is False
    assert body["temperature"] == 0
    assert body["messages"] == [
        {"role": "user", "content": "Find pluggy"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "search", "arguments": '{"q":"pluggy"}'}}]},
        {"role": "tool", "content": '{"hits": 3}', "tool_call_id": "c1"},
    ]
    assert body["tools"] == [{"type": "function", "function": {
        "name": "search", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                       "required": ["q"]}}}]


def test_no_tools_key_when_the_request_has_no_tools(openai_server: FakeOpenAIServer) -> None:
    openai_server.enqueue(Reply(body=completion("ok")))
    _complete(_provider(openai_server))
    assert "tools" not in openai_server.requests[0].json


def test_structured_tool_calls_are_parsed(openai_server: FakeOpenAIServer) -> None:
    openai_server.enqueue(Reply(body=completion(None, finish_reason="tool_calls", tool_calls=[
        {"id": "call_a", "type": "function",
         "function": {"name": "search", "arguments": '{"q": "pluggy", "limit": 2}'}},
        {"type": "function", "function": {"name": "now", "arguments": ""}},
    ])))

    response = _complete(_provider(openai_server), _request(turn=3))

    assert response.content == ""
    assert response.finish_reason == "tool_calls"
    assert response.tool_calls == [
        {"id": "call_a", "name": "search", "parameters": {"q": "pluggy", "limit": 2}},
        {"id": "call_3_2", "name": "now", "parameters": {}},
    ]


def test_tool_call_written_as_text_is_extracted(openai_server: FakeOpenAIServer) -> None:
    text = 'Let me look.\n<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>'
    openai_server.enqueue(Reply(body=completion(text)))

    response = _complete(_provider(openai_server))

    assert response.content == text
    assert response.tool_calls == [
        {"id": "json-tool-call-1-1", "name": "search", "parameters": {"q": "x"}}]


def test_structured_calls_win_over_text_calls(openai_server: FakeOpenAIServer) -> None:
    text = '<tool_call>{"name": "other", "arguments": {}}</tool_call>'
    openai_server.enqueue(Reply(body=completion(text, tool_calls=[
        {"id": "c", "function": {"name": "search", "arguments": "{}"}}])))

    response = _complete(_provider(openai_server))

    assert [call["name"] for call in response.tool_calls] == ["search"]


@pytest.mark.parametrize("arguments", ['{"q": ', "[1, 2]", '"text"', "{'q': 1}"])
def test_tool_arguments_that_are_not_a_json_object_are_kept_as_text(
    openai_server: FakeOpenAIServer, arguments: str
) -> None:
    openai_server.enqueue(Reply(body=completion(None, tool_calls=[
        {"id": "c", "function": {"name": "search", "arguments": arguments}}])))

    response = _complete(_provider(openai_server))

    # Not the provider's failure: the executor answers the call with invalid_arguments.
    assert response.tool_calls == [{"id": "c", "name": "search", "parameters": arguments}]


def test_tool_arguments_sent_as_an_object_or_nothing_are_accepted(
    openai_server: FakeOpenAIServer
) -> None:
    openai_server.enqueue(Reply(body=completion(None, tool_calls=[
        {"id": "a", "function": {"name": "search", "arguments": {"q": 1}}},
        {"id": "b", "function": {"name": "search", "arguments": None}},
        {"id": "c", "function": {"name": "search", "arguments": [1]}}])))

    response = _complete(_provider(openai_server))

    assert [call["parameters"] for call in response.tool_calls] == [{"q": 1}, {}, "[1]"]


# -- garbage ---------------------------------------------------------------------------------

def test_body_that_is_not_json_is_a_bad_response(openai_server: FakeOpenAIServer) -> None:
    openai_server.enqueue(Reply(body="<html>upstream proxy page</html>",
                                headers={"Content-Type": "text/html"}))

    error = _fail(_provider(openai_server))

    assert error.code == "provider_bad_response"
    assert "not JSON" in str(error)
    assert "upstream proxy page" in str(error)
    assert isinstance(error, DataMachineError)


@pytest.mark.parametrize(("body", "reason"), [
    ({"id": "x", "object": "chat.completion"}, "choices"),
    ({"choices": []}, "choices"),
    ({"choices": [{"finish_reason": "stop"}]}, "choices.0.message"),
    ({"choices": [{"message": {"content": 42}}]}, "choices.0.message.content"),
    ({"choices": [{"message": {"tool_calls": [{"function": {"arguments": "{}"}}]}}]},
     "choices.0.message.tool_calls.0.function.name"),
    ({"choices": "none"}, "choices"),
    ([1, 2, 3], "not a chat completion object"),
    ({"error": {"message": "model overloaded"}}, "model overloaded"),
])
def test_missing_or_mistyped_fields_are_a_bad_response(
    openai_server: FakeOpenAIServer, body: Any, reason: str
) -> None:
    openai_server.enqueue(Reply(body=body))

    error = _fail(_provider(openai_server))

    assert error.code == "provider_bad_response"
    assert reason in str(error)


# -- retries ---------------------------------------------------------------------------------

def test_429_then_success_waits_what_retry_after_asks(
    openai_server: FakeOpenAIServer, recording_sleep: RecordingSleep
) -> None:
    openai_server.enqueue(
        Reply(429, {"error": {"message": "Rate limit reached"}}, headers={"Retry-After": "7"}),
        Reply(body=completion("after the wait")),
    )

    response = _complete(_provider(openai_server, recording_sleep))

    assert response.content == "after the wait"
    assert recording_sleep.calls == [7.0]
    assert len(openai_server.requests) == 2


def test_retry_after_as_http_date_is_honoured(
    openai_server: FakeOpenAIServer, recording_sleep: RecordingSleep
) -> None:
    when = datetime.fromtimestamp(time.time() + 30, tz=UTC).replace(microsecond=0)
    openai_server.enqueue(
        Reply(503, "busy", headers={"Retry-After": format_datetime(when, usegmt=True)}),
        Reply(body=completion("ok")),
    )

    _complete(_provider(openai_server, recording_sleep))

    [waited] = recording_sleep.calls
    assert 25 <= waited <= 30


def test_503_is_retried_with_backoff_then_gives_up_after_max_retries(
    openai_server: FakeOpenAIServer, recording_sleep: RecordingSleep
) -> None:
    openai_server.enqueue(*[Reply(503, {"error": {"message": "overloaded"}})] * 3,
                          Reply(body=completion("never reached")))

    error = _fail(_provider(openai_server, recording_sleep, max_retries=2))

    assert (error.code, error.status, error.attempts) == ("provider_http_error", 503, 3)
    assert "after 3 attempts" in str(error)
    assert "overloaded" in str(error)
    assert len(openai_server.requests) == 3
    # jitter() == 0 gives half the exponential ceiling: 0.5 s base doubling per attempt.
    assert recording_sleep.calls == [0.25, 0.5]


def test_default_is_three_retries_so_a_stuck_500_ends_after_four_requests(
    openai_server: FakeOpenAIServer, recording_sleep: RecordingSleep
) -> None:
    openai_server.enqueue(*[Reply(500, "boom")] * 5)

    error = _fail(_provider(openai_server, recording_sleep))

    assert error.attempts == 4
    assert len(openai_server.requests) == 4
    assert len(recording_sleep.calls) == 3


@pytest.mark.parametrize(("body", "said"), [
    ("", "(empty body)"),
    (" \n", "(empty body)"),
    ('{"error": {"message": ""}}', 'an error with an empty message: {"error": {"message": ""}}'),
    ('{"error": " "}', 'an error with an empty message: {"error": " "}'),
    ('{"message": ""}', 'an error with an empty message: {"message": ""}'),
])
def test_a_500_without_a_message_says_what_came(
    openai_server: FakeOpenAIServer, recording_sleep: RecordingSleep, body: Any, said: str,
) -> None:
    # Ended in "...after 4 attempts: ." with nothing after the colon.
    openai_server.enqueue(*[Reply(500, body)] * 4)
    error = _fail(_provider(openai_server, recording_sleep))
    assert str(error).endswith(f"answered HTTP 500 from {openai_server.url}/v1/chat/completions "
                               f"after 4 attempts: {said}.")
    assert error.status == 500


@pytest.mark.parametrize(("status", "hint"), [
    (400, ""), (401, "OPENAI_API_KEY"), (404, "model id"), (422, "")])
def test_client_errors_are_never_retried(
    openai_server: FakeOpenAIServer, recording_sleep: RecordingSleep, status: int, hint: str
) -> None:
    openai_server.enqueue(Reply(status, {"error": {"message": "nope"}},
                                headers={"Retry-After": "1"}),
                          Reply(body=completion("should not be fetched")))

    error = _fail(_provider(openai_server, recording_sleep))

    assert (error.code, error.status, error.attempts) == ("provider_http_error", status, 1)
    assert len(openai_server.requests) == 1
    assert recording_sleep.calls == []
    assert f"HTTP {status}" in str(error)
    assert "nope" in str(error)
    assert hint in str(error)


def test_retry_after_longer_than_max_retry_wait_fails_at_once(
    openai_server: FakeOpenAIServer, recording_sleep: RecordingSleep
) -> None:
    openai_server.enqueue(Reply(429, "slow down", headers={"Retry-After": "3600"}),
                          Reply(body=completion("not fetched")))

    error = _fail(_provider(openai_server, recording_sleep, max_retry_wait=60))

    assert error.status == 429
    assert "3600" in str(error)
    assert recording_sleep.calls == []
    assert len(openai_server.requests) == 1


@pytest.mark.parametrize(("header", "expected"), [
    ("5", 5.0), ("0.5", 0.5), ("-3", 0.0), ("", None), ("soon", None), ("nan", None),
    ("Wed, 21 Oct 2015 07:28:00 GMT", 10.0), ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0),
])
def test_parse_retry_after(header: str, expected: float | None) -> None:
    now = datetime(2015, 10, 21, 7, 27, 50, tzinfo=UTC).timestamp()
    assert parse_retry_after(header, now=now) == expected


# -- deadlines and connection failures ----------------------------------------------------

def test_request_timeout_becomes_a_provider_error_naming_it(
    openai_server: FakeOpenAIServer, recording_sleep: RecordingSleep
) -> None:
    openai_server.enqueue(Reply(body=completion("too late"), delay=10))
    started = time.perf_counter()

    error = _fail(_provider(openai_server, recording_sleep), _request(request_timeout=0.2))

    assert time.perf_counter() - started < 3
    assert error.code == "provider_timeout"
    assert "request timeout of 0.2 s" in str(error)
    assert recording_sleep.calls == []  # a timeout is not retried
    assert len(openai_server.requests) == 1


def test_unreachable_server_is_a_connection_error() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    provider = OpenAIProvider(base_url=f"http://127.0.0.1:{port}/v1", sleep=RecordingSleep())

    error = _fail(provider)

    assert error.code == "provider_connection_error"
    assert f"127.0.0.1:{port}" in str(error)


# -- configuration -------------------------------------------------------------------------

def test_unavailable_without_key_on_openais_own_url(monkeypatch: pytest.MonkeyPatch) -> None:
    provider = OpenAIProvider()

    reason = provider.availability()

    assert isinstance(reason, str)
    assert "OPENAI_API_KEY" in reason
    error = _fail(provider)
    assert error.code == "provider_unavailable"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    assert provider.availability() is True
    assert provider.resolved_api_key() == "sk-from-env"


def test_local_base_url_needs_no_key(openai_server: FakeOpenAIServer) -> None:
    openai_server.enqueue(Reply(body=completion("local")))
    provider = OpenAIProvider(base_url=openai_server.url + "/v1")

    assert provider.availability() is True
    assert _complete(provider).content == "local"
    assert "authorization" not in openai_server.requests[0].headers


def test_base_url_resolution_order(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = {"openai_base_url": "http://setting.test/v1"}
    provider = OpenAIProvider()
    assert provider.resolved_base_url() == DEFAULT_BASE_URL
    provider.bind_settings(settings.get)
    assert provider.resolved_base_url() == "http://setting.test/v1"
    monkeypatch.setenv("OPENAI_BASE_URL", "http://env.test/v1")
    assert provider.resolved_base_url() == "http://env.test/v1"
    assert OpenAIProvider(base_url="http://arg.test").resolved_base_url() == "http://arg.test"


def test_env_base_url_is_honoured_on_the_wire(
    openai_server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.url + "/proxy/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    openai_server.enqueue(Reply(body=completion("via env")))

    response = _complete(OpenAIProvider(sleep=RecordingSleep()))

    assert response.content == "via env"
    assert openai_server.requests[0].path == "/proxy/v1/chat/completions"
    assert openai_server.requests[0].headers["authorization"] == "Bearer sk-env"


def test_base_url_without_scheme_is_unavailable_with_reason() -> None:
    reason = OpenAIProvider(base_url="localhost:11434").availability()
    assert isinstance(reason, str)
    assert "not an http(s) URL" in reason


def test_missing_model_is_a_bad_request(openai_server: FakeOpenAIServer) -> None:
    error = _fail(_provider(openai_server), _request(model=""))
    assert error.code == "provider_bad_request"
    assert openai_server.requests == []


def test_malformed_message_is_a_bad_request_naming_its_index(
    openai_server: FakeOpenAIServer,
) -> None:
    request = _request(messages=[{"role": "user", "content": "hi"},
                                 {"role": "tool", "content": "orphan result"}])

    error = _fail(_provider(openai_server), request)

    assert error.code == "provider_bad_request"
    assert "messages[1]" in str(error)
    assert "tool_call_id" in str(error)
    assert openai_server.requests == []


def test_invalid_constructor_arguments_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="max_retries"):
        OpenAIProvider(max_retries=-1)
    with pytest.raises(UsageError, match="max_retries"):
        OpenAIProvider(max_retries=True)


def test_complete_sync_runs_the_same_request(openai_server: FakeOpenAIServer) -> None:
    openai_server.enqueue(Reply(body=completion("sync")))
    response = _provider(openai_server).complete_sync(_request())
    assert response.content == "sync"
    assert json.loads(openai_server.requests[0].raw)["messages"][-1]["content"] == "Hi"


# -- retries: the finer points --------------------------------------------------------------

def test_retry_after_ms_wins_over_retry_after(
    openai_server: FakeOpenAIServer, recording_sleep: RecordingSleep
) -> None:
    openai_server.enqueue(
        Reply(429, "slow down", headers={"retry-after-ms": "1500", "Retry-After": "9"}),
        Reply(body=completion("ok")))

    assert _complete(_provider(openai_server, recording_sleep)).content == "ok"

    assert recording_sleep.calls == [1.5]


@pytest.mark.parametrize(("status", "should_retry", "requests"), [
    (503, "false", 1),  # the server says it will not get better
    (400, "true", 2),   # the server says it will
    (501, None, 1),     # not implemented: retrying cannot help
])
def test_x_should_retry_and_final_5xx_statuses(
    openai_server: FakeOpenAIServer, recording_sleep: RecordingSleep, status: int,
    should_retry: str | None, requests: int,
) -> None:
    headers = {"x-should-retry": should_retry} if should_retry else {}
    openai_server.enqueue(Reply(status, "no", headers=headers), Reply(body=completion("ok")))

    provider = _provider(openai_server, recording_sleep)
    if requests == 1:
        assert _fail(provider).status == status
    else:
        assert _complete(provider).content == "ok"
    assert len(openai_server.requests) == requests


def test_the_provider_max_retries_setting_is_read_per_request(
    openai_server: FakeOpenAIServer, recording_sleep: RecordingSleep
) -> None:
    settings: dict[str, Any] = {"provider_max_retries": 0}
    provider = _provider(openai_server, recording_sleep, settings_lookup=settings.get)
    openai_server.enqueue(Reply(500, "boom"), Reply(body=completion("ok")))

    error = _fail(provider)
    assert (error.status, error.attempts) == (500, 1)
    assert "provider_retries budget is 0, so not retried" in str(error)

    settings["provider_max_retries"] = 1
    assert _complete(provider).content == "ok"

    settings["provider_max_retries"] = "lots"
    with pytest.raises(UsageError, match="provider_max_retries"):
        _complete(provider)


# -- the connection pool --------------------------------------------------------------------

def test_one_connection_serves_every_request_until_close(
    openai_server: FakeOpenAIServer, transport: str
) -> None:
    provider = _provider(openai_server)
    openai_server.enqueue(*[Reply(body=completion(f"answer {i}")) for i in range(4)])

    if transport == "sync":
        answers = [_complete(provider).content for _ in range(3)]
    else:
        async def three_requests() -> list[str]:
            answers = []
            for _ in range(3):
                pending = provider.complete(_request())
                assert not isinstance(pending, ProviderResponse)
                answers.append((await pending).content)
            await provider.aclose()
            return answers

        answers = asyncio.run(three_requests())

    assert answers == ["answer 0", "answer 1", "answer 2"]
    assert openai_server.connections_used == 1
    provider.close()
    _complete(provider)  # a closed pool is reopened by the next request
    assert openai_server.connections_used == 2
    provider.close()


def test_an_async_sleep_cannot_serve_a_synchronous_run(
    openai_server: FakeOpenAIServer, transport: str
) -> None:
    async def sleep(seconds: float) -> None:
        return None

    provider = OpenAIProvider(base_url=openai_server.url + "/v1", api_key="k",
                              sleep=sleep, jitter=lambda: 0.0)
    openai_server.enqueue(Reply(503, "busy"), Reply(body=completion("ok")))
    if transport == "async":
        assert _complete(provider).content == "ok"
    else:
        with pytest.raises(UsageError, match="sync sleep"):
            _complete(provider)
    provider.close()


def test_threads_share_one_pool(openai_server: FakeOpenAIServer, transport: str) -> None:
    import threading

    if transport == "async":
        pytest.skip("the sync pool is the one threads share")
    provider = _provider(openai_server)
    openai_server.enqueue(*[Reply(body=completion("ok")) for _ in range(24)])
    answers: list[str] = []
    start = threading.Barrier(8, timeout=30)

    def work() -> None:
        start.wait()  # bounded: the barrier's timeout; every thread's first request at once
        for _ in range(3):
            answers.append(_complete(provider).content)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    provider.close()

    assert answers == ["ok"] * 24
    assert openai_server.connections_used <= 8  # kept-alive connections, reused
