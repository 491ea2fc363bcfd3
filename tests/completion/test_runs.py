"""Completion assertions and nudges through ``host.run_conversation`` on the scripted provider."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from datamachine import ProviderRequest, UsageError, hookimpl
from datamachine.completion import DESCRIBED_ACTION_TEXT, NUDGE_TEXT
from datamachine.errors import InvalidCompletionAssertions
from datamachine.host import Host
from tests.completion.helpers import (
    REQUEST,
    USER,
    Events,
    broken,
    call,
    fetch,
    publish,
    publish_wrapped,
    remember_post,
    save_note,
    say,
    turn,
)

NUDGE = f"{NUDGE_TEXT} Original request: {REQUEST}"


def run(host: Host, script: list[dict[str, Any]], assertions: dict[str, Any] | None,
        tools: list[Any], *, mode: str = "chat", events: Events | None = None,
        max_turns: int | None = None, **payload: Any) -> Any:
    payload["script"] = script
    if assertions is not None:
        payload["completion_assertions"] = assertions
    if events is not None:
        payload["event_sink"] = events
    return host.run_conversation(USER, tools, "scripted", "m", mode=mode, payload=payload,
                                 max_turns=max_turns)


def user_texts(result: Any) -> list[str]:
    return [m.content for m in result.messages if m.role == "user" and m.type == "text"]


def test_answer_after_required_tool_succeeded_completes_without_nudge(host: Host) -> None:
    result = run(host, [turn(call("save_note", text="notes")), say("Filed.")],
                 {"required_tool_names": ["save_note"]}, [save_note])
    assert (result.status, result.completed, result.turn_count) == ("completed", True, 2)
    assert result.completion_nudge_count == 0
    assert result.completion_nudge is None
    assert result.completion_assertions_complete is True
    assert result.completion_assertions_required == {"tool_names": ["save_note"]}
    assert result.completion_assertions_satisfied == {"tool_names": ["save_note"]}
    assert result.completion_assertions_missing == {}


def test_premature_answer_is_nudged_then_the_run_succeeds(host: Host) -> None:
    events = Events()
    script = [say("I will file them shortly."), turn(call("save_note", text="n")), say("Filed.")]
    result = run(host, script, {"required_tool_names": ["save_note"]}, [save_note],
                 events=events)
    assert (result.status, result.completed, result.turn_count) == ("completed", True, 3)
    assert result.final_content == "Filed."
    assert result.completion_nudge_count == 1
    assert result.completion_nudge == NUDGE
    assert user_texts(result) == [REQUEST, NUDGE]
    nudge = next(m for m in result.messages if m.content == NUDGE)
    assert nudge.metadata["type"] == "completion_nudge"
    [added] = events.named("completion_nudge_added")
    assert added["completion_nudge_count"] == 1
    assert added["completion_nudge"] == NUDGE
    assert added["completion_assertions_missing"] == {"tool_names": ["save_note"]}
    assert added["completion_assertions_satisfied"] == {}
    assert added["completion_assertions_required"] == {"tool_names": ["save_note"]}
    assert added["completion_nudge_turn"] == 1
    assert added["mode"] == "chat"
    assert events.names[-1] == "completed"


def test_nudge_text_never_names_tools_or_assertion_mechanics(host: Host) -> None:
    assertions = {"required_tool_names": ["save_note"],
                  "minimum_successful_tool_counts": {"fetch": 2},
                  "required_engine_data_keys": ["post_id"],
                  "complete_when_any": [{"name": "published", "tools": ["publish"]}]}
    result = run(host, [say("done?"), say("done!")], assertions,
                 [save_note, fetch, publish, remember_post], max_turns=2)
    nudges = user_texts(result)[1:]
    assert nudges == [NUDGE, NUDGE]
    for text in nudges:
        for word in ("save_note", "fetch", "publish", "post_id", "assert", "missing",
                     "required", "report_blocker"):
            assert word not in text


def test_original_request_in_the_nudge_is_cut_at_300_characters(host: Host) -> None:
    long_request = "x" * 250 + " " + "y" * 200
    result = host.run_conversation(
        [{"role": "system", "content": "You file notes."}, {"role": "user", "content": " "},
         {"role": "user", "content": long_request}],
        [save_note], "scripted", "m", mode="chat",
        payload={"script": [say("later"), turn(call("save_note", text="n")), say("ok")],
                 "completion_assertions": {"required_tool_names": "save_note"}})
    goal = (result.completion_nudge or "").split(" Original request: ", 1)[1]
    assert goal == long_request[:297] + "..."
    assert len(goal) == 300


def test_minimum_successful_counts_nudge_until_reached(host: Host) -> None:
    events = Events()
    script = [turn(call("fetch", url="a")), say("Read one page."),
              turn(call("fetch", url="b")), say("Read both pages.")]
    result = run(host, script, {"minimum_successful_tool_counts": {"fetch": 2}}, [fetch],
                 events=events)
    assert (result.status, result.completion_nudge_count) == ("completed", 1)
    [added] = events.named("completion_nudge_added")
    assert added["completion_assertions_missing"] == {"tool_counts": ["fetch: 1/2"]}
    assert result.completion_assertions_required == {"tool_counts": ["fetch>=2"]}
    assert result.completion_assertions_satisfied == {"tool_counts": ["fetch>=2"]}


def test_failed_required_tool_does_not_satisfy_the_assertion(host: Host) -> None:
    events = Events()
    script = [turn(call("broken")), say("It is done.")]
    result = run(host, script, {"required_tool_names": ["broken"]}, [broken], events=events,
                 max_turns=2)
    assert result.completed is False
    assert result.completion_assertions_missing == {"tool_names": ["broken"]}
    assert result.completion_assertions_complete is False
    assert events.named("completion_nudge_added")


def test_rejected_duplicate_call_does_not_count_twice(host: Host) -> None:
    script = [turn(call("fetch", "a", url="a")), turn(call("fetch", "b", url="a")),
              say("Read it twice."), turn(call("fetch", "c", url="b")), say("done")]
    result = run(host, script, {"minimum_successful_tool_counts": {"fetch": 2}}, [fetch])
    assert result.status == "completed"
    assert result.completion_nudge_count == 1


def test_parameter_matched_outcome_needs_the_exact_parameters_in_chat_mode(host: Host) -> None:
    events = Events()
    assertions = {"complete_when_any": [
        {"name": "Published!", "tools": [{"name": "publish", "required_output": ["url"],
                                          "required_parameters": {"status": "publish"}}]},
        {"name": "drafted", "tools": [{"name": "publish",
                                       "required_parameters": {"status": "draft",
                                                               "options.notify": True}}]},
    ]}
    script = [turn(call("publish", title="t", status="pending")), say("Posted."),
              turn(call("publish", title="t", status="draft", options={"notify": "true"})),
              say("Drafted."),
              turn(call("publish", title="t", status="publish")), say("Published.")]
    result = run(host, script, assertions, [publish], events=events)
    assert (result.status, result.completed) == ("completed", True)
    first, second = events.named("completion_nudge_added")
    assert first["completion_assertions_missing"] == {
        "complete_when_any": ["published: publish", "drafted: publish"]}
    # "true" is not True: strict equality against what the model sent.
    assert second["completion_assertions_missing"] == first["completion_assertions_missing"]
    assert result.completion_assertions_satisfied == {"complete_when_any": ["published"]}
    assert [o["name"] for o in result.completion_assertions_required["complete_when_any"]] == [
        "published", "drafted"]


def test_outcome_reports_missing_output_and_finds_output_under_data(host: Host) -> None:
    events = Events()
    assertions = {"complete_when_any": [
        {"name": "live", "tools": [{"name": "publish", "required_output": "url",
                                    "required_parameters": {"status": "draft"}}]},
        {"name": "wrapped", "tools": [{"name": "publish_wrapped", "required_output": ["url"]}]},
    ]}
    script = [turn(call("publish", title="t", status="draft")), say("Done."),
              turn(call("publish_wrapped", title="t")), say("Done now.")]
    result = run(host, script, assertions, [publish, publish_wrapped], events=events)
    [added] = events.named("completion_nudge_added")
    assert added["completion_assertions_missing"] == {
        "complete_when_any": ["live: publish.url", "wrapped: publish_wrapped"]}
    assert result.completion_assertions_satisfied == {"complete_when_any": ["wrapped"]}
    assert result.status == "completed"


def test_min_successful_calls_of_an_outcome(host: Host) -> None:
    assertions = {"complete_when_any": [
        {"tools": [{"name": "fetch", "min_successful_calls": 2}]}]}
    script = [turn(call("fetch", url="a")), say("one"), turn(call("fetch", url="b")),
              say("two")]
    events = Events()
    result = run(host, script, assertions, [fetch], events=events)
    [added] = events.named("completion_nudge_added")
    assert added["completion_assertions_missing"] == {"complete_when_any": ["outcome_1: fetch x2"]}
    assert result.completion_assertions_satisfied == {"complete_when_any": ["outcome_1"]}


def test_required_engine_data_keys_are_satisfied_by_tool_writes(host: Host) -> None:
    events = Events()
    script = [say("Stored."), turn(call("remember_post", post_id=5)), say("Stored now.")]
    result = run(host, script, {"required_engine_data_keys": ["post_id"]}, [remember_post],
                 events=events, engine_data={"post_id": ""})
    [added] = events.named("completion_nudge_added")
    assert added["completion_assertions_missing"] == {"engine_data_keys": ["post_id"]}
    assert result.status == "completed"
    assert result.completion_assertions_satisfied == {"engine_data_keys": ["post_id"]}


def test_engine_data_given_in_the_payload_satisfies_at_once(host: Host) -> None:
    result = run(host, [say("Nothing to do.")], {"required_engine_data_keys": "post_id"},
                 [remember_post], engine_data={"post_id": 0})
    assert (result.status, result.completion_nudge_count) == ("completed", 0)


def test_preflight_refuses_a_run_whose_required_tool_is_missing() -> None:
    import bootstrap

    class Recorder:
        def __init__(self) -> None:
            self.requests: list[ProviderRequest] = []

        @hookimpl
        def text_result(self, request: ProviderRequest) -> Any:
            self.requests.append(request)
            return {"content": "never"}

    recorder = Recorder()
    events = Events()
    with bootstrap.boot(":memory:", plugins=[recorder], load_entrypoints=False) as host:
        result = host.run_conversation(
            USER, [fetch], "scripted", "m", mode="chat",
            payload={"event_sink": events, "completion_assertions": {
                "required_tool_names": ["publish", "fetch"],
                "complete_when_any": [{"tools": ["save_note"]}]}})
    assert recorder.requests == []
    assert (result.status, result.completed, result.turn_count) == ("error", False, 0)
    assert result.error_code == "completion_required_tool_unavailable"
    assert result.unavailable_required_tool_names == ["publish", "save_note"]
    assert result.available_tool_names == ["fetch"]
    assert "publish, save_note" in (result.error or "")
    assert "available" in (result.error or "")
    assert result.completion_assertions_complete is False
    assert result.transcript_session_id is None
    assert events.names == ["completion_assertions_unavailable", "failed"]
    unavailable = events.named("completion_assertions_unavailable")[0]
    assert unavailable["unavailable_required_tool_names"] == ["publish", "save_note"]
    assert unavailable["available_tool_names"] == ["fetch"]
    assert unavailable["error_message"] == result.error
    assert events.named("failed")[0]["status"] == "error"


def test_preflight_passes_when_one_outcome_is_reachable(host: Host) -> None:
    assertions = {"complete_when_any": [{"tools": ["missing_tool"]}, {"tools": ["fetch"]}]}
    result = run(host, [turn(call("fetch", url="a")), say("ok")], assertions, [fetch])
    assert result.status == "completed"


def test_preflight_counts_minimum_tool_counts_as_required(host: Host) -> None:
    result = run(host, [say("x")], {"minimum_successful_tool_counts": {"publish": 1}}, [fetch])
    assert result.error_code == "completion_required_tool_unavailable"
    assert result.unavailable_required_tool_names == ["publish"]


def test_exhaustion_while_assertions_are_missing(host: Host) -> None:
    script = [say("Almost."), say("Nearly."), say("Done, honestly.")]
    result = run(host, script, {"required_tool_names": ["save_note"]}, [save_note],
                 max_turns=3)
    assert result.completed is False
    assert result.max_turns_reached is True
    assert result.status == "budget_exceeded"
    assert result.warning == ("Maximum conversation turns (3) reached before completion "
                              "policy was satisfied.")
    assert result.completion_nudge_count == 3
    assert result.completion_assertions_missing == {"tool_names": ["save_note"]}
    assert result.turn_count == 3


def test_exhaustion_after_assertions_were_met_keeps_the_plain_warning(host: Host) -> None:
    script = [turn(call("fetch", url="a")), turn(call("fetch", url="b"))]
    result = run(host, script, {"required_tool_names": ["fetch"]}, [fetch], max_turns=2,
                 final_summary=False)
    assert result.status == "budget_exceeded"
    assert result.warning == ("Maximum conversation turns (2) reached. Response may be "
                              "incomplete.")


def test_described_tool_action_is_not_a_completion(host: Host) -> None:
    events = Events()
    script = [say("AI ACTION (Turn 1): Executing save_note with the notes"),
              turn(call("save_note", text="n")), say("Filed.")]
    result = run(host, script, None, [save_note], events=events)
    assert result.status == "completed"
    assert result.completion_nudge_count == 1
    assert user_texts(result)[1] == DESCRIBED_ACTION_TEXT
    assert events.named("completion_nudge_added")[0]["reason"] == "described_tool_action"


def test_described_tool_action_without_tools_is_an_answer(host: Host) -> None:
    result = run(host, [say("AI ACTION (Turn 1): Executing nothing")], None, [])
    assert (result.status, result.completion_nudge_count) == ("completed", 0)


def test_runs_without_assertions_report_no_assertion_diagnostics(host: Host) -> None:
    result = run(host, [say("hello")], None, [fetch])
    assert result.completion_assertions_complete is None
    assert result.completion_assertions_required == {}
    assert "report_blocker" not in result.request_metadata["tools"]["names"]


def test_unknown_assertion_keys_are_reported_in_warnings(host: Host) -> None:
    assertions = {"required_tool_name": ["fetch"],
                  "complete_when_any": [{"tools": [{"name": "fetch", "success": True}]}]}
    result = run(host, [turn(call("fetch", url="a")), say("ok")], assertions, [fetch])
    assert result.status == "completed"
    assert any("'required_tool_name'" in w and "required_tool_names" in w
               for w in result.warnings)
    assert any("complete_when_any[0].tools[0]" in w and "'success'" in w
               for w in result.warnings)


def test_invalid_assertions_fail_before_any_provider_call(host: Host) -> None:
    with pytest.raises(InvalidCompletionAssertions,
                       match=r"minimum_successful_tool_counts\.fetch: must be a positive"):
        run(host, [say("never asked")], {"minimum_successful_tool_counts": {"fetch": 0}},
            [fetch])
    with pytest.raises(UsageError, match="configured_handler_slugs"):
        run(host, [say("never asked")], None, [fetch], configured_handler_slugs=7)
    assert host.transcripts.list() == []


def test_single_turn_with_missing_assertions_is_incomplete(host: Host) -> None:
    result = host.run_conversation(
        USER, [save_note], "scripted", "m", mode="chat", single_turn=True,
        payload={"script": [say("Later.")],
                 "completion_assertions": {"required_tool_names": ["save_note"]}})
    assert (result.status, result.completed, result.turn_count) == ("incomplete", False, 1)
    assert result.completion_nudge_count == 0
    assert "save_note" in (result.warning or "")


def test_async_run_nudges_the_same_way(host: Host) -> None:
    script = [say("soon"), turn(call("save_note", text="n")), say("Filed.")]
    result = asyncio.run(host.arun_conversation(
        USER, [save_note], "scripted", "m", mode="chat",
        payload={"script": script,
                 "completion_assertions": {"required_tool_names": ["save_note"]}}))
    assert (result.status, result.completion_nudge_count) == ("completed", 1)


def test_nudged_transcript_is_stored_with_the_nudge(host: Host) -> None:
    script = [say("soon"), turn(call("save_note", text="n")), say("Filed.")]
    result = run(host, script, {"required_tool_names": ["save_note"]}, [save_note],
                 transcript_session_id="notes-1")
    stored = host.transcripts.get("notes-1")
    assert NUDGE in [m["content"] for m in stored]
    assert result.transcript_session_id == "notes-1"


def test_messages_a_policy_returns_are_plain_user_messages_to_the_model() -> None:
    import bootstrap

    seen: list[list[dict[str, Any]]] = []

    class Recorder:
        def __init__(self) -> None:
            self.answers = [say("soon"), turn(call("save_note", text="n")), say("Filed.")]

        @hookimpl
        def text_result(self, request: ProviderRequest) -> Any:
            seen.append(list(request.messages))
            return self.answers.pop(0)

    with bootstrap.boot(":memory:", plugins=[Recorder()], load_entrypoints=False) as host:
        host.run_conversation(USER, [save_note], "scripted", "m", mode="chat",
                              payload={"completion_assertions": {
                                  "required_tool_names": ["save_note"]}})
    assert seen[1][-1] == {"role": "user", "content": NUDGE}
    assert [m.get("content") for m in seen[1]] == [REQUEST, "soon", NUDGE]

