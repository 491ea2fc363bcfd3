"""run_conversation: the adapter over the loop, on the scripted provider and hooks."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import bootstrap
import datamachine
from agents_api import Message
from datamachine import (
    InvalidBudgetValue,
    ProviderRequest,
    ProviderResponse,
    Tool,
    UsageError,
    hookimpl,
    tool,
)
from datamachine.api import reset_default_host
from datamachine.host import Host

USER = [{"role": "user", "content": "go"}]


@tool
def double(n: int) -> int:
    """Double a number.

    Args:
        n: The number to double.
    """
    return n * 2


def call(n: int, call_id: str = "", name: str = "double") -> dict[str, Any]:
    return {"id": call_id or f"c{n}", "name": name, "parameters": {"n": n}}


class Recorder:
    """A text_result plugin that records requests and replays answers."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = list(answers)
        self.requests: list[ProviderRequest] = []

    @hookimpl
    def text_result(self, request: ProviderRequest) -> Any:
        self.requests.append(request)
        return self.answers.pop(0)

    @hookimpl
    def provider_availability(self, provider: str, model: str) -> bool:
        # Availability is checked before text_result, as in the source: a scripted test of
        # an app configured for openai says the provider is available.
        return True


def boot_with(*plugins: object) -> Host:
    return bootstrap.boot(":memory:", plugins=list(plugins), load_entrypoints=False)


def test_tools_run_and_final_answer_completes(host: Host) -> None:
    script = [{"content": "", "tool_calls": [call(2)], "usage": {"total_tokens": 5}},
              {"content": "It is 4.", "usage": {"total_tokens": 3}}]
    result = host.run_conversation(USER, [double], "scripted", "m", payload={"script": script})
    assert (result.status, result.completed, result.turn_count) == ("completed", True, 2)
    assert result.final_content == "It is 4."
    assert result.usage["total_tokens"] == 8
    assert result.tool_execution_results[0]["result"]["result"] == 4
    assert result.last_tool_calls == []


def test_duplicate_is_rejected_kept_in_transcript_and_left_out_of_results(host: Host) -> None:
    script = [{"tool_calls": [call(2, "a")]}, {"tool_calls": [call(2, "b")]}, {"content": "ok"}]
    result = host.run_conversation(USER, [double], "scripted", "m", mode="chat",
                                   payload={"script": script})
    rejected = [m for m in result.messages if m.type == "tool_result"
                and str(m.content).startswith("DUPLICATE REJECTED:")]
    assert len(rejected) == 1
    assert len(result.tool_execution_results) == 1


def test_turn_exhaustion_sets_status_budget_flag_and_warning(host: Host) -> None:
    script = [{"tool_calls": [call(i)]} for i in range(1, 10)]
    result = host.run_conversation(USER, [double], "scripted", "m", payload={"script": script},
                                   max_turns=3)
    assert result.status == "budget_exceeded"
    assert result.budget == "conversation_turns"
    assert "max_conversation_turns_reached" in result.flags
    assert result.max_turns_reached is True
    assert result.completed is False
    assert result.warning == ("Maximum conversation turns (3) reached. "
                              "Response may be incomplete.")
    assert result.turn_count == 3


def test_clamped_max_turns_is_applied_and_reported(host: Host) -> None:
    result = host.run_conversation(USER, None, "scripted", "m", max_turns=500)
    assert result.budgets["conversation_turns"]["ceiling"] == 200
    assert any("requested ceiling 500" in w for w in result.warnings)


def test_single_turn_stops_after_exactly_one_provider_turn(host: Host) -> None:
    script = [{"tool_calls": [call(1)]}, {"content": "never asked"}]
    result = host.run_conversation(USER, [double], "scripted", "m", payload={"script": script},
                                   single_turn=True)
    assert result.turn_count == 1
    assert result.status == "completed"
    assert len(result.tool_execution_results) == 1


@pytest.mark.parametrize("bad", [0, -1, "ten", 10_001, 2.5, True])
def test_bad_max_turns_is_refused_before_any_provider_call(bad: Any) -> None:
    recorder = Recorder([{"content": "x"}])
    with boot_with(recorder) as host:
        with pytest.raises(InvalidBudgetValue, match="max_turns"):
            host.run_conversation(USER, None, "scripted", "m", max_turns=bad)
        assert recorder.requests == []


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"provider": "nope"}, "nope"),
    ({"mode": 42}, "mode must be a string"),
    ({"messages": "hello"}, "messages"),
    ({"messages": [{"content": "no role"}]}, "messages"),
    ({"tools": "double"}, "tools must be"),
    ({"tools": [object()]}, "datamachine.Tool"),
    ({"payload": ["not", "a", "dict"]}, "payload must be a dict"),
    ({"payload": {"max_seconds": -1}}, "max_seconds"),
    ({"single_turn": "yes"}, "single_turn"),
])
def test_bad_arguments_raise_usage_error_naming_the_argument(
    kwargs: dict[str, Any], match: str
) -> None:
    recorder = Recorder([{"content": "x"}])
    args: dict[str, Any] = {"messages": USER, "tools": None, "provider": "scripted",
                            "model": "m", **kwargs}
    with boot_with(recorder) as host:
        with pytest.raises(UsageError, match=match):
            host.run_conversation(**args)
        assert recorder.requests == []


def test_tool_definition_without_a_name_is_a_clear_error() -> None:
    with pytest.raises(UsageError, match="name"):
        Tool(name="", description="x", parameters={"type": "object", "properties": {}},
             function=lambda: None)


def test_runtime_objects_never_reach_tools_or_requests() -> None:
    seen: list[dict[str, Any]] = []

    @tool
    def peek(context: datamachine.ToolContext) -> str:
        """Look at the payload."""
        seen.append(dict(context.payload))
        return "ok"

    class Policy:  # a completion policy: a runtime object like the others
        def record_natural_completion(self, messages: Any, content: Any, context: Any) -> Any:
            return datamachine.Decision(complete=True)

    recorder = Recorder([{"tool_calls": [{"name": "peek", "parameters": {}}]}, {"content": "done"}])
    payload = {"job_id": 7, "agent_slug": "a", "event_sink": lambda e, p: None,
               "completion_policy": Policy(), "transcript_lock_ttl": 30, "budget_pressure": True}
    with boot_with(recorder) as host:
        result = host.run_conversation(USER, [peek], "scripted", "m", payload=payload)
    assert result.status == "completed"
    assert seen == [{"job_id": 7, "agent_slug": "a"}]
    assert recorder.requests[0].payload == {"job_id": 7, "agent_slug": "a"}


def test_events_carry_base_log_context_and_request_built() -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    with boot_with() as host:
        payload = {"job_id": 3, "event_sink": lambda e, p: events.append((e, p))}
        host.run_conversation(USER, None, "scripted", "m", mode="system", payload=payload)
    names = [e for e, _ in events]
    assert names == ["turn_started", "request_built", "completed"]
    built = events[1][1]
    assert built["mode"] == "system"
    assert built["job_id"] == 3
    assert built["success"] is True
    assert built["request_metadata"]["provider"] == "scripted"


def test_event_sink_object_with_emit_and_on_loop_event_hook() -> None:
    class Sink:
        def __init__(self) -> None:
            self.events: list[str] = []

        def emit(self, event: str, payload: dict[str, Any]) -> None:
            self.events.append(event)

    class Observer:
        def __init__(self) -> None:
            self.events: list[str] = []

        @hookimpl
        def on_loop_event(self, event: str, payload: dict[str, Any]) -> None:
            self.events.append(event)
            raise RuntimeError("observers never break runs")

    sink, observer = Sink(), Observer()
    with boot_with(observer) as host:
        result = host.run_conversation(USER, None, "scripted", "m", payload={"event_sink": sink})
    assert result.status == "completed"
    assert sink.events == observer.events == ["turn_started", "request_built", "completed"]


def test_text_result_hook_short_circuits_with_dict_response_or_exception() -> None:
    recorder = Recorder([
        {"content": "", "tool_calls": [{"name": "double", "parameters": {"n": 5}}],
         "usage": {"total_tokens": 2}},
        ProviderResponse(content="ten", usage={"total_tokens": 1}),
    ])
    with boot_with(recorder) as host:
        result = host.run_conversation(USER, [double], "openai", "gpt-x")
    assert (result.status, result.final_content) == ("completed", "ten")
    assert result.tool_execution_results[0]["result"]["result"] == 10

    failing = Recorder([RuntimeError("model offline")])
    events: list[tuple[str, dict[str, Any]]] = []
    with boot_with(failing) as host:
        result = host.run_conversation(USER, None, "scripted", "m",
                                       payload={"event_sink": lambda e, p: events.append((e, p))})
    assert (result.status, result.error) == ("error", "model offline")
    built = [p for e, p in events if e == "request_built"]
    assert built[0]["success"] is False
    assert [e for e, _ in events][-1] == "failed"


def test_provider_failure_keeps_earlier_turns(host: Host) -> None:
    script = [{"tool_calls": [call(1)]}]  # runs out on turn 2
    result = host.run_conversation(USER, [double], "scripted", "m", payload={"script": script})
    assert result.status == "error"
    assert result.error_code == "script_exhausted"
    assert "has 1 response" in (result.error or "")
    assert len(result.tool_execution_results) == 1
    assert result.turn_count == 2


def test_provider_availability_string_is_the_reason_and_nothing_is_sent() -> None:
    class Down:
        @hookimpl
        def provider_availability(self, provider: str, model: str) -> str:
            return "Maintenance until noon."

    recorder = Recorder([{"content": "x"}])
    with boot_with(recorder, Down()) as host:
        result = host.run_conversation(USER, None, "scripted", "m")
    assert (result.status, result.error, result.error_code) == (
        "error", "Maintenance until noon.", "provider_unavailable")
    assert recorder.requests == []


def test_openai_without_key_is_unavailable_naming_the_variable(host: Host) -> None:
    result = host.run_conversation(USER, None, "openai", "gpt-4o-mini")
    assert result.status == "error"
    assert "OPENAI_API_KEY" in (result.error or "")


def test_timeouts_come_from_settings_then_filters_and_connect_never_exceeds_request() -> None:
    class Filters:
        @hookimpl
        def request_timeout(self, value: float) -> float:
            return value / 2

        @hookimpl
        def connect_timeout(self, value: float, request_timeout: float) -> float:
            return 10_000.0

    recorder = Recorder([{"content": "x"}])
    with boot_with(Filters(), recorder) as host:
        host.settings.set("request_timeout", 5000)  # clamped to 900 before the filter
        host.run_conversation(USER, None, "scripted", "m")
    request = recorder.requests[0]
    assert request.request_timeout == 450.0
    assert request.connect_timeout == 300.0  # the clamp holds after the filter too


def test_timeout_filters_cannot_pass_the_clamps() -> None:
    class Greedy:
        @hookimpl
        def request_timeout(self, value: float) -> float:
            return 5000.0

    recorder = Recorder([{"content": "x"}])
    with boot_with(Greedy(), recorder) as host:
        host.run_conversation(USER, None, "scripted", "m")
    assert recorder.requests[0].request_timeout == 900.0


@pytest.mark.parametrize(("key", "value"), [("request_timeout", "abc"),
                                            ("connect_timeout", -1),
                                            ("budget_pressure", "yes"),
                                            ("max_request_bytes", 0)])
def test_known_settings_are_validated_when_written(host: Host, key: str, value: Any) -> None:
    from datamachine import InvalidSetting

    with pytest.raises(InvalidSetting, match=key):
        host.settings.set(key, value)


def test_default_timeouts(host: Host) -> None:
    result = host.run_conversation(USER, None, "scripted", "m")
    assert result.request_metadata["transport"] == {"request_timeout": 300.0,
                                                    "connect_timeout": 15.0}


def test_prompt_hash_is_a_running_hash_over_what_the_model_is_sent(host: Host) -> None:
    from agents_api import normalize_messages
    from datamachine.conversation.projection import ChatProjector

    script = [{"tool_calls": [call(1)]}, {"content": "done"}]
    result = host.run_conversation(USER, [double], "scripted", "m", payload={"script": script})
    # The turn-2 request saw every message except the final answer; projecting the stored
    # transcript again gives the same hash and size.
    assert result.transcript_session_id is not None
    stored = host.transcripts.get(result.transcript_session_id)
    again = ChatProjector()
    chat = again.sync(normalize_messages(stored[:-1]))
    assert result.request_metadata["prompt_sha256"] == again.prompt_sha256()
    assert result.request_metadata["messages_json_bytes"] == len(
        json.dumps(chat, separators=(",", ":"), ensure_ascii=False).encode())
    assert result.request_metadata["tools"]["names"] == ["double"]
    assert result.request_metadata["message_count"] == 3


def test_prompt_hash_reuses_no_key_of_another_call_with_the_same_id(host: Host) -> None:
    # The hash reuses the tool index's canonical parameters per call id; two calls of one turn
    # sharing an id (as some model servers send) must each be hashed with their own.
    from agents_api import normalize_messages
    from datamachine.conversation.projection import ChatProjector

    @tool
    def echo(z: int = 0, a: int = 0) -> str:
        """Echo.

        Args:
            z: A number.
            a: Another.
        """
        return f"{z}-{a}"

    same = [{"id": "dup", "name": "echo", "parameters": {"z": 1, "a": 2}},
            {"id": "dup", "name": "echo", "parameters": {"z": 3, "a": 4}}]
    script = [{"tool_calls": same}, {"content": "done"}]
    result = host.run_conversation(USER, [echo], "scripted", "m", payload={"script": script})
    assert result.transcript_session_id is not None
    stored = host.transcripts.get(result.transcript_session_id)
    again = ChatProjector()
    again.sync(normalize_messages(stored[:-1]))
    assert result.request_metadata["prompt_sha256"] == again.prompt_sha256()


def test_prompt_hash_is_the_same_with_and_without_storage(host: Host) -> None:
    script = [{"tool_calls": [call(1)]}, {"tool_calls": [call(2)]}, {"content": "done"}]
    stored = host.run_conversation(USER, [double], "scripted", "m", payload={"script": script})
    unstored = host.run_conversation(USER, [double], "scripted", "m",
                                     payload={"script": script, "persist_transcript": False})
    assert stored.request_metadata["prompt_sha256"] == unstored.request_metadata["prompt_sha256"]
    assert (stored.request_metadata["messages_json_bytes"]
            == unstored.request_metadata["messages_json_bytes"])


def test_provider_sees_openai_shaped_messages_with_grouped_tool_calls() -> None:
    recorder = Recorder([
        {"content": "two at once", "tool_calls": [call(1, "a"), call(2, "b")]},
        {"content": "done"},
    ])
    with boot_with(recorder) as host:
        host.run_conversation(USER, [double], "scripted", "m")
    second = recorder.requests[1].messages
    assert second[0] == {"role": "user", "content": "go"}
    assert second[1]["role"] == "assistant"
    assert second[1]["content"] == "two at once"
    assert [c["id"] for c in second[1]["tool_calls"]] == ["a", "b"]
    assert second[2] == {"role": "tool", "tool_call_id": "a", "content": "2"}
    assert second[3] == {"role": "tool", "tool_call_id": "b", "content": "4"}


def test_transcript_is_stored_unless_disabled(host: Host) -> None:
    result = host.run_conversation(USER, None, "scripted", "m",
                                   payload={"transcript_session_id": "mine"})
    assert result.transcript_session_id == "mine"
    stored = host.transcripts.get("mine")
    assert [m["content"] for m in stored] == ["go", "echo: go"]
    skipped = host.run_conversation(USER, None, "scripted", "m",
                                    payload={"persist_transcript": False})
    assert skipped.transcript_session_id is None


def test_messages_accept_envelopes(host: Host) -> None:
    result = host.run_conversation([Message(role="user", content="hi")], None, "scripted", "m")
    assert result.final_content == "echo: hi"


def test_async_run_with_async_tool(host: Host) -> None:
    @tool
    async def slow_double(n: int) -> int:
        """Double, asynchronously."""
        await asyncio.sleep(0)
        return n * 2

    script = [{"tool_calls": [{"name": "slow_double", "parameters": {"n": 4}}]},
              {"content": "8"}]
    result = asyncio.run(host.arun_conversation(USER, [slow_double], "scripted", "m",
                                                payload={"script": script}))
    assert result.final_content == "8"
    assert result.tool_execution_results[0]["result"]["result"] == 8


def test_module_level_run_conversation_uses_the_default_host() -> None:
    reset_default_host()
    try:
        result = datamachine.run_conversation(USER, provider="scripted", model="m")
        assert result.final_content == "echo: go"
        assert result.transcript_session_id is not None
        assert datamachine.get_default_host().transcripts.get(result.transcript_session_id)
    finally:
        reset_default_host()


def test_result_dumps_to_plain_json(host: Host) -> None:
    data = host.run_conversation(USER, None, "scripted", "m").model_dump(mode="json")
    assert data["messages"][0]["schema"] == "agents-api.message"
    assert data["status"] == "completed"
    json.dumps(data)


@pytest.mark.parametrize("garbage", [
    {"content": 42},
    {"tool_calls": "call everything"},
    {"tool_calls": [{"parameters": {"x": 1}}]},
])
def test_provider_garbage_becomes_a_failed_turn_with_the_reason(garbage: dict[str, Any]) -> None:
    recorder = Recorder([garbage])
    with boot_with(recorder) as host:
        result = host.run_conversation(USER, [double], "scripted", "m")
    assert result.status == "error"
    assert result.error_code == "provider_bad_response"
    assert result.error
    assert result.turn_count == 1


def test_a_call_with_broken_arguments_is_a_tool_result_the_model_corrects() -> None:
    recorder = Recorder([
        {"tool_calls": [{"id": "c1", "name": "double", "parameters": '{"n": 2'}]},
        {"tool_calls": [{"id": "c2", "name": "double", "parameters": {"n": 2}}]},
        {"content": "It is 4."},
    ])
    with boot_with(recorder) as host:
        result = host.run_conversation(USER, [double], "scripted", "m",
                                       payload={"max_tool_calls": 2})
        stored = host.transcripts.get(result.transcript_session_id or "")
    assert (result.status, result.final_content, result.turn_count) == ("completed", "It is 4.", 3)
    first, second = result.tool_execution_results
    assert first["result"]["error_type"] == "invalid_arguments"
    assert "cut off" in first["result"]["error"]
    assert second["result"]["result"] == 4
    # The model read why, and the broken call went back to it with {} as its arguments.
    turn2 = recorder.requests[1].messages
    assert turn2[-2]["tool_calls"] == [{"id": "c1", "name": "double", "parameters": {}}]
    assert turn2[-1] == {"role": "tool", "tool_call_id": "c1",
                         "content": first["result"]["error"]}
    # The transcript keeps what the model actually wrote.
    assert stored is not None
    calls = [m for m in stored if m["type"] == "tool_call"]
    assert calls[0]["payload"]["parameters"] == '{"n": 2'
    # It counted against tool_calls: the corrected call was the last one allowed.
    assert result.budgets["tool_calls"]["current"] == 2


@pytest.mark.parametrize(("payload", "match"), [
    ({"transcript_lock": 5}, "transcript_lock"),
    ({"transcript_persister": "db"}, "transcript_persister"),
    ({"final_summary": "no"}, "final_summary"),
    ({"persist_transcript": "no"}, "persist_transcript"),
    ({"transcript_lock_ttl": float("inf")}, "transcript_lock_ttl"),
    ({"transcript_lock_ttl": 0}, "transcript_lock_ttl"),
    ({"transcript_lock_ttl": 86_401}, "transcript_lock_ttl.*86400"),
    ({"transcript_lock_ttl": 30.5}, "transcript_lock_ttl"),
    ({"max_seconds": float("nan")}, "max_seconds"),
])
def test_bad_runtime_objects_are_refused_before_the_run(payload: dict[str, Any],
                                                        match: str) -> None:
    recorder = Recorder([{"content": "x"}])
    with boot_with(recorder) as host:
        with pytest.raises(UsageError, match=match):
            host.run_conversation(USER, None, "scripted", "m", payload=payload)
        assert recorder.requests == []


def test_wall_clock_keeps_fractions_of_a_second() -> None:
    import time as real_time

    class Slow:
        name = "slow"

        async def complete(self, request: ProviderRequest) -> Any:
            await asyncio.sleep(5)
            return {"content": "late"}

    class Plugin:
        @hookimpl
        def register_providers(self) -> list[Any]:
            return [Slow()]

    with boot_with(Plugin()) as host:
        started = real_time.monotonic()
        result = host.run_conversation(USER, None, "slow", "m",
                                       payload={"max_seconds": 0.3, "final_summary": False})
        elapsed = real_time.monotonic() - started
    assert result.status == "budget_exceeded"
    assert result.budgets["wall_clock_seconds"]["rail"] == "time"
    assert elapsed < 0.9  # cut at 0.3 s, not rounded up to a whole second


def test_message_model_validate_raises_the_loop_error() -> None:
    from agents_api import AgentsAPIError

    with pytest.raises(AgentsAPIError, match="unsupported message type 'weird'"):
        Message.model_validate({"role": "user", "type": "weird"})


def test_an_echo_is_never_read_as_a_tool_call(host: Host) -> None:
    # The scripted provider's echo repeats the user's text; tool-call markup in it is text.
    called: list[str] = []

    @datamachine.tool
    def ping() -> str:
        """Ping."""
        called.append("ping")
        return "pong"

    result = host.run_conversation(
        [{"role": "user", "content": 'please <tool_call name="ping">{}</tool_call>'}],
        [ping], "scripted", "m")
    assert result.status == "completed"
    assert result.turn_count == 1
    assert called == []
    assert result.final_content.startswith("echo: please <tool_call")


def test_a_final_answer_cut_off_by_the_token_limit_is_incomplete(host: Host) -> None:
    events: list[tuple[str, dict[str, Any]]] = []

    class Sink:
        def emit(self, event: str, payload: dict[str, Any]) -> None:
            events.append((event, payload))

    script = [{"tool_calls": [call(1)], "finish_reason": "tool_calls"},
              {"content": "The answer is", "finish_reason": "length"}]
    result = host.run_conversation(USER, [double], "scripted", "m",
                                   payload={"script": script, "event_sink": Sink()})
    assert (result.status, result.completed) == ("incomplete", False)
    assert result.flags == ["output_truncated"]
    assert result.warning is not None
    assert "max_tokens" in result.warning
    terminal = [payload for event, payload in events if event in ("completed", "failed")]
    assert [p["status"] for p in terminal] == ["incomplete"]


def test_tool_calls_cut_off_are_not_a_truncated_answer(host: Host) -> None:
    script = [{"tool_calls": [call(1)], "finish_reason": "length"}, {"content": "done"}]
    result = host.run_conversation(USER, [double], "scripted", "m", payload={"script": script})
    assert result.status == "completed"
    assert result.flags == []


def test_a_run_on_a_stored_transcript_counts_every_run_of_it(host: Host) -> None:
    """A run given the id of a transcript the host already stores goes on counting from it
    (it reported its own turns only: the command line's -c had to correct it)."""
    script = [{"tool_calls": [call(2, "a")]}, {"content": "done"}]
    first = host.run_conversation(USER, [double], "scripted", "m",
                                  payload={"script": script, "transcript_session_id": "again"})
    second = host.run_conversation(USER, [double], "scripted", "m",
                                   payload={"script": script, "transcript_session_id": "again"})
    assert (first.turn_count, first.cumulative_turn_count) == (2, 2)
    assert (second.turn_count, second.cumulative_turn_count) == (2, 4)
    assert host.transcripts.summary("again").cumulative_turn_count == 4


PREAMBLE = {"content": "Let me double it first.", "tool_calls": [call(2, "c1")]}


def test_an_empty_answer_after_tool_calls_is_asked_again_once(host: Host) -> None:
    result = host.run_conversation(USER, [double], "scripted", "m", payload={
        "script": [PREAMBLE, {"content": ""}, {"content": "It is 4."}]})
    assert (result.status, result.final_content) == ("completed", "It is 4.")
    assert result.completion_nudge_count == 1
    nudges = [m for m in result.messages if m.metadata.get("type") == "completion_nudge"]
    assert [m.content for m in nudges] == [
        "Your last answer was empty. The results of your tool calls are above: write your "
        "final answer now."]


def test_a_second_empty_answer_is_incomplete_and_never_the_preamble(host: Host) -> None:
    """After a tool turn, an empty final answer was status completed with the first turn's
    preamble as final_content (DESIGN 25)."""
    result = host.run_conversation(USER, [double], "scripted", "m", payload={
        "script": [PREAMBLE, {"content": ""}, {"content": "  "}]})
    assert result.status == "incomplete"
    assert result.flags == ["empty_answer"]
    assert result.final_content == ""
    assert result.completion_nudge_count == 1
    assert result.turn_count == 3
    assert result.warning is not None
    assert "empty answer" in result.warning


def test_an_empty_answer_without_tool_calls_is_not_nudged(host: Host) -> None:
    result = host.run_conversation(USER, [double], "scripted", "m",
                                   payload={"script": [{"content": ""}]})
    assert (result.status, result.completion_nudge_count, result.flags) == ("completed", 0, [])
