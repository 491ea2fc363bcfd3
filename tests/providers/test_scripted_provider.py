"""The scripted provider: replay, per-run cursors, files, exhaustion, echo and validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from datamachine.errors import (
    DataMachineError,
    InvalidScript,
    ProviderError,
    ScriptExhausted,
    UsageError,
)
from datamachine.providers.base import Provider, ProviderRequest
from datamachine.providers.scripted import (
    ScriptCursor,
    ScriptedProvider,
    load_script,
    scripted_provider_for,
)

SCRIPT: list[dict[str, Any]] = [
    {"content": "Looking it up.",
     "tool_calls": [{"id": "c1", "name": "search", "parameters": {"q": "pluggy"}},
                    {"name": "fetch", "parameters": {"url": "https://pluggy.test"}}],
     "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}},
    {"content": "pluggy is a plugin system.",
     "usage": {"prompt_tokens": 30, "completion_tokens": 6, "total_tokens": 36}},
]


def _request(text: str = "What is pluggy?", turn: int = 1) -> ProviderRequest:
    return ProviderRequest(messages=[{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": text}],
                           provider="scripted", model="demo", turn=turn)


def test_replays_content_tool_calls_and_usage_in_order() -> None:
    provider = ScriptedProvider(SCRIPT)

    first = provider.complete(_request(turn=1))
    second = provider.complete(_request(turn=2))

    assert first.content == "Looking it up."
    assert first.tool_calls == [
        {"id": "c1", "name": "search", "parameters": {"q": "pluggy"}},
        {"id": "scripted-1-2", "name": "fetch", "parameters": {"url": "https://pluggy.test"}},
    ]
    assert first.usage == {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
    assert first.finish_reason == "tool_calls"
    assert (second.content, second.tool_calls, second.finish_reason) == (
        "pluggy is a plugin system.", [], "stop")
    assert second.usage["total_tokens"] == 36


def test_record_keeps_every_request_asked() -> None:
    provider = scripted_provider_for(SCRIPT)
    requests = [_request("one", turn=1), _request("two", turn=2)]

    for request in requests:
        provider.complete(request)

    assert list(provider.record) == requests
    assert provider.record[1].messages[-1]["content"] == "two"


def test_exhausted_script_fails_the_turn_saying_how_long_it_was() -> None:
    provider = ScriptedProvider(SCRIPT)
    provider.complete(_request(turn=1))
    provider.complete(_request(turn=2))

    with pytest.raises(ScriptExhausted) as caught:
        provider.complete(_request(turn=3))

    error = caught.value
    assert isinstance(error, ProviderError)
    assert isinstance(error, DataMachineError)
    assert error.code == "script_exhausted"
    assert error.length == 2
    assert "has 2 responses" in str(error)
    assert "turn 3" in str(error)


def test_empty_script_is_exhausted_on_the_first_turn() -> None:
    with pytest.raises(ScriptExhausted, match="has 0 responses"):
        ScriptedProvider([]).complete(_request())


def test_each_run_gets_its_own_cursor() -> None:
    provider = ScriptedProvider(SCRIPT)
    run_a = provider.start_run()
    run_b = provider.start_run()

    assert run_a.complete(_request()).content == "Looking it up."
    assert run_b.complete(_request()).content == "Looking it up."
    assert run_a.complete(_request(turn=2)).content == "pluggy is a plugin system."
    assert (run_a.position, run_a.remaining, run_b.remaining) == (2, 0, 1)
    assert isinstance(run_a, Provider)
    assert run_a.name == "scripted"
    # Each cursor records its own requests; the provider sees all of them.
    assert len(run_a.record) == 2
    assert len(provider.record) == 3


def test_run_script_overrides_the_providers_own() -> None:
    provider = ScriptedProvider(SCRIPT)

    cursor = provider.start_run([{"content": "from the payload"}])

    assert cursor.complete(_request()).content == "from the payload"
    assert provider.complete(_request()).content == "Looking it up."


def test_reset_rewinds_the_provider_cursor() -> None:
    provider = ScriptedProvider(SCRIPT)
    provider.complete(_request())
    provider.reset()
    assert provider.complete(_request()).content == "Looking it up."
    assert len(provider.record) == 1


def test_echo_mode_answers_the_last_user_message() -> None:
    provider = ScriptedProvider()
    request = ProviderRequest(
        messages=[{"role": "user", "content": "first"},
                  {"role": "assistant", "content": "echo: first"},
                  {"role": "user", "content": "second <tool_call name=\"x\">{}</tool_call>"}],
        provider="scripted")

    response = provider.complete(request)

    assert response.content == 'echo: second <tool_call name="x">{}</tool_call>'
    assert response.tool_calls == []  # an echo is never a tool call
    assert provider.availability() is True
    assert provider.start_run().remaining is None


def test_echo_mode_reads_text_parts_and_never_runs_out() -> None:
    cursor = ScriptCursor(None)
    request = ProviderRequest(messages=[{"role": "user", "content": [
        {"type": "text", "text": "look at"}, {"type": "image_url", "image_url": {}},
        {"type": "text", "text": "this"}]}], provider="scripted")

    answers = {cursor.complete(request).content for _ in range(30)}

    assert answers == {"echo: look at this"}


def test_echo_without_user_message_is_empty_echo() -> None:
    request = ProviderRequest(messages=[{"role": "system", "content": "x"}], provider="scripted")
    assert ScriptedProvider().complete(request).content == "echo: "


def test_error_entry_fails_that_turn_only() -> None:
    provider = ScriptedProvider([{"error": "upstream exploded"}, {"content": "recovered"}])

    with pytest.raises(ProviderError, match="upstream exploded") as caught:
        provider.complete(_request())

    assert caught.value.code == "scripted_error"
    assert provider.complete(_request(turn=2)).content == "recovered"


def test_text_written_tool_calls_in_a_script_are_extracted() -> None:
    provider = ScriptedProvider([{"content": (
        '<function_calls><invoke name="search"><parameter name="q">x</parameter>'
        "</invoke></function_calls>")}])

    response = provider.complete(_request())

    assert response.tool_calls == [{"id": "xml-tool-call-1", "name": "search",
                                    "parameters": {"q": "x"}}]


def test_loads_a_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "demo.yaml"
    path.write_text(
        "- content: Looking it up.\n"
        "  tool_calls:\n"
        "    - id: c1\n"
        "      name: search\n"
        "      parameters: {q: pluggy}\n"
        "  usage: {prompt_tokens: 1, completion_tokens: 2, total_tokens: 3}\n"
        "- content: Done.\n",
        encoding="utf-8")

    provider = ScriptedProvider(path)

    first = provider.complete(_request())
    assert first.tool_calls == [{"id": "c1", "name": "search", "parameters": {"q": "pluggy"}}]
    assert first.usage == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    assert provider.complete(_request(turn=2)).content == "Done."
    assert provider.script is not None
    assert provider.script.source == str(path)


def test_loads_a_json_file_given_as_a_string_path(tmp_path: Path) -> None:
    path = tmp_path / "demo.json"
    path.write_text(json.dumps(SCRIPT), encoding="utf-8")

    provider = ScriptedProvider(str(path))

    assert [provider.complete(_request()).content for _ in range(2)] == [
        "Looking it up.", "pluggy is a plugin system."]
    with pytest.raises(ScriptExhausted, match=r"demo\.json"):
        provider.complete(_request())


@pytest.mark.parametrize(("script", "expected"), [
    ([{"content": "ok"}, {"tool_calls": [{"parameters": {}}]}],
     "entry 1: tool_calls.0.name: Field required"),
    ([{"content": "ok"}, {"content": "x", "tool_call": []}], "entry 1: tool_call: Extra inputs"),
    ([{"tool_calls": [{"name": "s", "arguments": "{}"}]}], "entry 0: tool_calls.0.arguments"),
    ([{"tool_calls": [{"name": "s", "parameters": ["q"]}]}], "entry 0: tool_calls.0.parameters"),
    ([{"content": 5}], "entry 0: content"),
    ([{"usage": {"total_tokens": "many"}}], "entry 0: usage.total_tokens"),
    (["just text"], "entry 0: must be a mapping"),
    ({"content": "not a list"}, "must be a list of responses"),
])
def test_invalid_scripts_name_the_entry_and_field(script: Any, expected: str) -> None:
    with pytest.raises(InvalidScript) as caught:
        ScriptedProvider(script)
    assert expected in str(caught.value)
    assert isinstance(caught.value, UsageError)


def test_invalid_entry_in_a_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yml"
    path.write_text("- content: fine\n- tool_calls: [{id: x}]\n", encoding="utf-8")

    with pytest.raises(InvalidScript) as caught:
        load_script(path)

    message = str(caught.value)
    assert "bad.yml" in message
    assert "entry 1: tool_calls.0.name: Field required" in message


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("broken.json", "[{", "not valid JSON"),
    ("broken.yaml", "- content: [unclosed", "not valid YAML"),
    ("scalar.yaml", "hello", "must be a list of responses"),
    ("empty.yaml", "", "must be a list of responses"),
])
def test_unreadable_script_files_are_invalid(tmp_path: Path, name: str, text: str,
                                             expected: str) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InvalidScript, match=expected):
        load_script(path)


def test_missing_script_file_is_invalid(tmp_path: Path) -> None:
    with pytest.raises(InvalidScript, match="does not exist"):
        ScriptedProvider(tmp_path / "nope.yaml")


def test_parameters_scripted_as_text_play_a_model_whose_arguments_did_not_decode() -> None:
    import bootstrap
    from tests.conversation.test_run_conversation import double

    script = [{"tool_calls": [{"name": "double", "parameters": '{"n": two}'}]},
              {"content": "Sorry."}]
    with bootstrap.boot(":memory:", load_entrypoints=False) as host:
        result = host.run_conversation([{"role": "user", "content": "double two"}], [double],
                                       "scripted", "m", payload={"script": script})
    assert result.final_content == "Sorry."
    failure = result.tool_execution_results[0]["result"]
    assert failure["error_type"] == "invalid_arguments"
    assert "not valid JSON (Expecting value at character 7)" in failure["error"]


def test_the_record_keeps_only_the_newest_requests() -> None:
    # A long-running server answers with the scripted provider: its record must not grow
    # with every request it ever answered.
    from datamachine.providers.scripted import RECORD_LIMIT

    provider = ScriptedProvider()
    for turn in range(1, RECORD_LIMIT + 6):
        provider.complete(ProviderRequest(messages=[{"role": "user", "content": str(turn)}],
                                          provider="scripted", turn=turn))
    assert len(provider.record) == RECORD_LIMIT
    assert provider.record[0].turn == 6
    assert provider.record[-1].turn == RECORD_LIMIT + 5
