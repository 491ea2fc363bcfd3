"""Completion policies through runs: terminal signals, pipeline handlers, custom policies."""

from __future__ import annotations

from typing import Any

import pytest

from agents_api import Message
from datamachine import Decision, Tool
from datamachine.completion import NUDGE_TEXT
from datamachine.errors import InvalidCompletionPolicy
from datamachine.host import Host
from tests.completion.helpers import (
    REQUEST,
    USER,
    Events,
    call,
    fetch,
    finish_job,
    handler_tool,
    publish,
    save_note,
    say,
    turn,
)

NUDGE = f"{NUDGE_TEXT} Original request: {REQUEST}"


def run(host: Host, script: list[dict[str, Any]], tools: list[Any], *, mode: str = "pipeline",
        max_turns: int | None = None, **payload: Any) -> Any:
    payload["script"] = script
    return host.run_conversation(USER, tools, "scripted", "m", mode=mode, payload=payload,
                                 max_turns=max_turns)


def user_texts(result: Any) -> list[str]:
    return [m.content for m in result.messages if m.role == "user" and m.type == "text"]


# -- terminal completion signal ------------------------------------------------------------
@pytest.mark.parametrize("mode", ["pipeline", "chat"])
def test_terminal_tool_ends_the_run_at_once(host: Host, mode: str) -> None:
    script = [turn(call("fetch", url="a")), turn(call("finish_job")), say("never asked")]
    result = run(host, script, [fetch, finish_job], mode=mode)
    assert (result.status, result.completed, result.turn_count) == ("completed", True, 2)
    assert result.final_content == ""


def test_failed_terminal_tool_does_not_end_the_run(host: Host) -> None:
    def refuse() -> dict[str, Any]:
        return {"success": False, "error": "not yet"}

    stubborn = Tool(name="finish_job", description="Finish.", function=refuse,
                    parameters={"type": "object", "properties": {}},
                    runtime={"completion_signal": "terminal"})
    result = run(host, [turn(call("finish_job")), say("Gave up.")], [stubborn])
    assert (result.turn_count, result.final_content) == (2, "Gave up.")


def test_terminal_tool_with_missing_assertions_ends_incomplete(host: Host) -> None:
    result = run(host, [turn(call("finish_job")), say("never asked")], [finish_job, save_note],
                 completion_assertions={"required_tool_names": ["save_note"]})
    assert (result.status, result.completed, result.turn_count) == ("incomplete", False, 1)
    assert result.completion_assertions_missing == {"tool_names": ["save_note"]}
    assert "tool_names: save_note" in (result.warning or "")


# -- pipeline handlers -----------------------------------------------------------------------
def test_every_configured_handler_must_fire_before_the_run_completes(host: Host) -> None:
    events = Events()
    wordpress, twitter = handler_tool("wordpress"), handler_tool("twitter")
    script = [turn(call("post_to_wordpress", text="hi")), say("Posted to the blog."),
              turn(call("post_to_twitter", text="hi")), say("never asked")]
    result = run(host, script, [wordpress, twitter],
                 configured_handler_slugs=["wordpress", " twitter ", "wordpress"],
                 event_sink=events)
    assert (result.status, result.completed, result.turn_count) == ("completed", True, 3)
    assert result.remaining_handlers == []
    [added] = events.named("completion_nudge_added")
    assert added["remaining_handlers"] == ["twitter"]
    assert added["reason"] == "waiting_for_handlers"
    assert user_texts(result) == [REQUEST, NUDGE]


def test_remaining_handlers_are_reported_when_turns_run_out(host: Host) -> None:
    wordpress, twitter = handler_tool("wordpress"), handler_tool("twitter")
    script = [turn(call("post_to_wordpress", text="hi")), say("All done.")]
    result = run(host, script, [wordpress, twitter], max_turns=2,
                 configured_handler_slugs=["wordpress", "twitter"])
    assert result.status == "budget_exceeded"
    assert result.remaining_handlers == ["twitter"]
    assert result.warning == ("Maximum conversation turns (2) reached before completion "
                              "policy was satisfied.")


def test_without_configured_handlers_the_first_handler_ends_the_run(host: Host) -> None:
    script = [turn(call("fetch", url="a")), turn(call("post_to_wordpress", text="x")),
              say("never asked")]
    result = run(host, script, [fetch, handler_tool("wordpress")])
    assert (result.status, result.turn_count) == ("completed", 2)


def test_handler_waits_for_assertions_without_injecting_policy_text(host: Host) -> None:
    script = [turn(call("post_to_wordpress", text="x")), say("Posted."),
              turn(call("save_note", text="n")), say("Noted.")]
    result = run(host, script, [handler_tool("wordpress"), save_note],
                 completion_assertions={"required_tool_names": ["save_note"]})
    assert (result.status, result.turn_count) == ("completed", 4)
    # Only the request and one generic nudge reach the model: no internal policy messages.
    assert user_texts(result) == [REQUEST, NUDGE]


def test_handler_after_assertions_hold_ends_the_run(host: Host) -> None:
    script = [turn(call("save_note", text="n")), turn(call("post_to_wordpress", text="x")),
              say("never asked")]
    result = run(host, script, [handler_tool("wordpress"), save_note],
                 completion_assertions={"required_tool_names": ["save_note"]})
    assert (result.status, result.turn_count, result.completed) == ("completed", 2, True)


def test_outcome_reached_by_a_non_handler_tool_ends_a_pipeline_run(host: Host) -> None:
    assertions = {"complete_when_any": [{"name": "live", "tools": [
        {"name": "publish", "required_parameters": {"status": "publish"}}]}]}
    script = [turn(call("publish", title="t", status="publish")), say("never asked")]
    result = run(host, script, [publish], completion_assertions=assertions)
    assert (result.status, result.turn_count) == ("completed", 1)
    assert result.completion_assertions_satisfied == {"complete_when_any": ["live"]}


def test_configured_handlers_without_a_handler_tool_are_ignored_with_a_warning(
    host: Host,
) -> None:
    result = run(host, [turn(call("post_to_wordpress", text="x")), say("never")],
                 [handler_tool("wordpress")], configured_handler_slugs=["wordpress", "fax"])
    assert (result.status, result.turn_count) == ("completed", 1)
    assert any("fax" in w and "ignored" in w for w in result.warnings)


def test_configured_handlers_switch_a_chat_run_to_the_pipeline_policy(host: Host) -> None:
    script = [say("Done."), turn(call("post_to_wordpress", text="x")), say("never")]
    result = run(host, script, [handler_tool("wordpress")], mode="chat",
                 configured_handler_slugs="wordpress")
    assert (result.status, result.turn_count, result.completion_nudge_count) == (
        "completed", 2, 1)


# -- custom policies -----------------------------------------------------------------------
class CountingPolicy:
    """Done after two successful fetches; asks for more in its own words before that."""

    def __init__(self) -> None:
        self.fetches = 0
        self.contexts: list[dict[str, Any]] = []
        self.natural: list[tuple[list[Message], str]] = []

    def record_tool_result(self, tool_name: str, tool: Tool | None, result: dict[str, Any],
                           context: dict[str, Any]) -> Decision:
        self.contexts.append(context)
        if tool_name == "fetch" and result["success"]:
            self.fetches += 1
        return Decision(complete=self.fetches >= 2)

    def record_natural_completion(self, messages: list[Message], content: str,
                                  context: dict[str, Any]) -> Decision:
        self.natural.append((messages, content))
        return Decision(complete=False, message="Read one more page before answering.")


def test_custom_policy_replaces_the_built_in_policies(host: Host) -> None:
    policy = CountingPolicy()
    script = [turn(call("fetch", url="a")), say("One page is enough."),
              turn(call("fetch", url="b")), say("never asked")]
    result = run(host, script, [fetch], completion_policy=policy, job_id=None, agent_slug="x")
    assert (result.status, result.completed, result.turn_count) == ("completed", True, 3)
    assert user_texts(result) == [REQUEST, "Read one more page before answering."]
    assert result.completion_nudge_count == 1
    context = policy.contexts[0]
    assert context["mode"] == "pipeline"
    assert context["turn"] == 1
    assert context["payload"]["agent_slug"] == "x"
    assert context["parameters"] == {"url": "a"}
    messages, content = policy.natural[0]
    assert content == "One page is enough."
    assert (messages[-1].role, messages[-1].content) == ("assistant", content)


def test_custom_policy_message_on_a_tool_result_is_appended_for_the_model(host: Host) -> None:
    class Reminder:
        def record_tool_result(self, tool_name: str, tool: Tool | None,
                               result: dict[str, Any], context: dict[str, Any]) -> Decision:
            return Decision(complete=False, message="Cite the page title in your answer.")

    result = run(host, [turn(call("fetch", url="a")), say("Title of a.")], [fetch],
                 completion_policy=Reminder())
    assert user_texts(result) == [REQUEST, "Cite the page title in your answer."]
    assert result.status == "completed"


def test_custom_policy_still_feeds_assertion_diagnostics(host: Host) -> None:
    class Lenient:
        def record_natural_completion(self, messages: list[Message], content: str,
                                      context: dict[str, Any]) -> Decision:
            return Decision(complete=True)

    result = run(host, [say("Done.")], [save_note], completion_policy=Lenient(),
                 completion_assertions={"required_tool_names": ["save_note"]})
    assert (result.status, result.completed) == ("incomplete", False)
    assert result.completion_assertions_missing == {"tool_names": ["save_note"]}


def test_custom_policy_incomplete_without_message_gets_the_generic_nudge(host: Host) -> None:
    class Strict:
        calls = 0

        def record_natural_completion(self, messages: list[Message], content: str,
                                      context: dict[str, Any]) -> dict[str, Any] | None:
            Strict.calls += 1
            return None if Strict.calls == 1 else {"complete": True}

    result = run(host, [say("first"), say("second")], [], completion_policy=Strict())
    assert user_texts(result) == [REQUEST, NUDGE]
    assert (result.status, result.completion_nudge_count) == ("completed", 1)


def test_custom_policy_returning_something_else_is_a_clear_error(host: Host) -> None:
    class Wrong:
        def record_natural_completion(self, messages: list[Message], content: str,
                                      context: dict[str, Any]) -> Any:
            return "done"

    with pytest.raises(InvalidCompletionPolicy, match="returned str"):
        run(host, [say("x")], [], completion_policy=Wrong())


def test_async_custom_policy_is_refused(host: Host) -> None:
    class Async:
        async def record_natural_completion(self, messages: list[Message], content: str,
                                            context: dict[str, Any]) -> Decision:
            return Decision(complete=True)

    with pytest.raises(InvalidCompletionPolicy, match="synchronously"):
        run(host, [say("x")], [], completion_policy=Async())


def test_custom_policy_nudge_is_cut_at_2000_characters_in_the_result(host: Host) -> None:
    long_message = "Keep going. " * 250

    class Chatty:
        seen = 0

        def record_natural_completion(self, messages: list[Message], content: str,
                                      context: dict[str, Any]) -> Decision:
            Chatty.seen += 1
            return Decision(complete=Chatty.seen > 1, message=long_message)

    result = run(host, [say("a"), say("b")], [], completion_policy=Chatty())
    assert result.completion_nudge is not None
    assert len(result.completion_nudge) == 2000
    assert result.completion_nudge.endswith("...")
    assert user_texts(result)[1] == long_message.strip()
