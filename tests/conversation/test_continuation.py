"""Headless continue and chat sessions with turn limits (DESIGN.md sections 6 and 10)."""

from __future__ import annotations

from typing import Any

import pytest

import bootstrap
import datamachine
from datamachine import ProviderRequest, SessionAborted, hookimpl
from datamachine.api import reset_default_host
from datamachine.host import Host
from tests.conversation.work import USER, step


class Worker:
    """A model that calls ``step`` until it has seen ``finish_after`` tool results."""

    def __init__(self, finish_after: int = 10**6) -> None:
        self.finish_after = finish_after
        self.requests: list[ProviderRequest] = []

    @hookimpl
    def text_result(self, request: ProviderRequest) -> dict[str, Any]:
        self.requests.append(request)
        if not request.tools:
            return {"content": "summary"}
        done = sum(1 for m in request.messages if m["role"] == "tool")
        if done >= self.finish_after:
            return {"content": f"finished after {done} steps"}
        return {"content": "", "tool_calls": [{"name": "step", "parameters": {"n": done + 1}}]}


class Confirm:
    def __init__(self, answers: list[bool | None]) -> None:
        self.answers = list(answers)
        self.asked: list[dict[str, Any]] = []

    @hookimpl
    def confirm_continuation(self, budget: Any, context: dict[str, Any]) -> bool | None:
        self.asked.append({"budget": budget.name(), "current": budget.current(),
                           "ceiling": budget.ceiling(), **context})
        return self.answers.pop(0) if self.answers else None


def boot(*plugins: object) -> Host:
    return bootstrap.boot(":memory:", plugins=list(plugins), load_entrypoints=False)


def _sid(result: datamachine.ConversationResult) -> str:
    assert result.transcript_session_id is not None
    return result.transcript_session_id


def test_continue_runs_at_most_extend_by_turns_and_reports_both_counts() -> None:
    worker = Worker(finish_after=20)
    with boot(worker) as host:
        first = host.run_conversation(USER, [step], "scripted", "m", max_turns=5)
        assert (first.status, first.turn_count) == ("budget_exceeded", 5)
        again = host.continue_conversation(_sid(first), extend_by=3,
                                           tools=[step])
    assert again.turn_count <= 3
    assert again.turn_count == 3
    assert again.cumulative_turn_count == 8
    assert again.transcript_session_id == first.transcript_session_id
    # Context kept: the first request of the continued run already holds 5 tool results.
    continued = [r for r in worker.requests if r.tools][5]
    assert len([m for m in continued.messages if m["role"] == "tool"]) == 5


def test_continue_reuses_recorded_provider_and_model_and_defaults_to_no_tools() -> None:
    worker = Worker(finish_after=20)
    with boot(worker) as host:
        first = host.run_conversation(USER, [step], "scripted", "recorded-model", max_turns=2)
        again = host.continue_conversation(_sid(first), extend_by=2)
    last = worker.requests[-1]
    assert (last.provider, last.model, last.tools) == ("scripted", "recorded-model", [])
    assert again.status == "completed"


def test_continue_validates_extend_by_and_the_session_id() -> None:
    from datamachine import InvalidBudgetValue
    from datamachine.errors import TranscriptNotFound

    with boot() as host:
        first = host.run_conversation(USER, None, "scripted", "m")
        with pytest.raises(InvalidBudgetValue, match="extend_by"):
            host.continue_conversation(_sid(first), extend_by=0)
        with pytest.raises(TranscriptNotFound):
            host.continue_conversation("no-such-session", extend_by=2)


def test_module_level_continue_conversation() -> None:
    reset_default_host()
    try:
        first = datamachine.run_conversation(USER, provider="scripted", model="m")
        again = datamachine.continue_conversation(_sid(first), extend_by=1)
        assert again.cumulative_turn_count == 2
    finally:
        reset_default_host()


def test_chat_turn_limit_confirm_resets_and_decline_aborts() -> None:
    confirm = Confirm([True, False])
    with boot(confirm) as host:
        session = host.chat_sessions.create(max_turns=2)
        host.chat(session.id, "one")
        assert host.chat_sessions.get(session.id).turn_count == 1
        second = host.chat(session.id, "two")  # reaches 2/2: asked, confirmed, reset to 0
        assert second.status == "completed"
        assert host.chat_sessions.get(session.id).turn_count == 0
        host.chat(session.id, "three")
        fourth = host.chat(session.id, "four")  # reaches 2/2 again: declined
        assert fourth.status == "aborted"
        assert fourth.completed is False
        assert host.chat_sessions.get(session.id).status == "aborted"
        assert host.transcripts.get_transcript(session.id).status == "aborted"
        with pytest.raises(SessionAborted):
            host.chat(session.id, "five")
    assert [(a["kind"], a["session_id"], a["current"], a["ceiling"]) for a in confirm.asked] == [
        ("chat_turn_limit", session.id, 2, 2), ("chat_turn_limit", session.id, 2, 2)]


def test_chat_without_ui_aborts_at_the_limit() -> None:
    with boot() as host:
        session = host.chat_sessions.create(max_turns=1)
        result = host.chat(session.id, "hi")
        assert result.status == "aborted"
        assert result.final_content == "echo: hi"
        with pytest.raises(SessionAborted, match=session.id):
            host.chat(session.id, "again")


def test_chat_counts_every_provider_turn_of_a_run() -> None:
    worker = Worker(finish_after=3)
    with boot(worker, Confirm([True])) as host:
        session = host.chat_sessions.create(max_turns=10)
        result = host.chat(session.id, "do three steps", tools=[step])
        assert result.turn_count == 4
        assert host.chat_sessions.get(session.id).turn_count == 4


def test_chat_limit_reached_mid_run_stops_the_run_when_declined() -> None:
    worker = Worker()
    with boot(worker, Confirm([False])) as host:
        session = host.chat_sessions.create(max_turns=3)
        result = host.chat(session.id, "work forever", tools=[step])
    assert result.status == "aborted"
    assert result.turn_count == 3


def test_unlimited_still_counts_and_switching_to_an_integer_resets() -> None:
    confirm = Confirm([])
    with boot(confirm) as host:
        session = host.chat_sessions.create(max_turns="unlimited")
        for text in ("a", "b", "c"):
            assert host.chat(session.id, text).status == "completed"
        assert host.chat_sessions.get(session.id).turn_count == 3
        assert confirm.asked == []
        host.chat_sessions.set_limit(session.id, 5)
        assert host.chat_sessions.get(session.id).turn_count == 0


def test_chat_session_keeps_its_history_and_cumulative_count() -> None:
    worker = Worker(finish_after=0)
    with boot(worker) as host:
        session = host.chat_sessions.create()
        host.chat(session.id, "first")
        result = host.chat(session.id, "second")
    texts = [m["content"] for m in worker.requests[-1].messages]
    assert texts[0] == "first"
    assert texts[-1] == "second"
    assert result.cumulative_turn_count == 2
    assert result.mode == "chat"


def test_chat_limit_default_comes_from_the_setting() -> None:
    with boot() as host:
        host.settings.set("chat_max_turns", 7)
        assert host.chat_sessions.create().max_turns == 7


def test_chat_rejects_an_empty_message() -> None:
    from datamachine import UsageError

    with boot() as host:
        session = host.chat_sessions.create()
        with pytest.raises(UsageError, match="message"):
            host.chat(session.id, "  ")


def test_chat_abort_is_what_the_terminal_event_and_the_transcript_say() -> None:
    worker = Worker()
    events: list[tuple[str, dict[str, Any]]] = []
    with boot(worker, Confirm([False])) as host:
        session = host.chat_sessions.create(max_turns=2)
        result = host.chat(session.id, "work", tools=[step],
                           payload={"event_sink": lambda e, p: events.append((e, p))})
        stored = host.transcripts.get_transcript(session.id)
    assert result.status == "aborted"
    assert result.final_content  # never empty, even when the model was mid-tools
    assert events[-1][0] == "completed"
    assert events[-1][1]["status"] == "aborted"
    assert stored.status == "aborted"
    # The declined turn's tool calls did not run.
    assert len(result.tool_execution_results) == 1


def test_chat_declined_before_the_run_still_emits_a_terminal_event() -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    with boot(Confirm([True, False])) as host:
        session = host.chat_sessions.create(max_turns=1)
        host.chat(session.id, "one")  # reaches 1/1: confirmed, reset
        host.chat_sessions.add_turns(session.id, 1)  # at the limit again before the next run
        result = host.chat(session.id, "two",
                           payload={"event_sink": lambda e, p: events.append((e, p))})
    assert result.status == "aborted"
    assert [(e, p["status"]) for e, p in events] == [("completed", "aborted")]


def test_an_aborted_session_refuses_chat_and_continue_and_keeps_no_lock() -> None:
    with boot() as host:
        session = host.chat_sessions.create(max_turns=1)
        host.chat(session.id, "one")  # reaches 1/1 with no UI: aborted
        with pytest.raises(SessionAborted):
            host.chat(session.id, "two")
        assert host.transcripts.locks.held() == []
        with pytest.raises(SessionAborted):
            host.continue_conversation(session.id, extend_by=1)
        assert host.transcripts.locks.held() == []


def test_continue_on_a_chat_session_counts_toward_its_limit() -> None:
    worker = Worker(finish_after=0)
    with boot(worker, Confirm([False])) as host:
        session = host.chat_sessions.create(max_turns=2)
        host.chat(session.id, "one")
        result = host.continue_conversation(session.id, extend_by=3)  # reaches 2/2: declined
        assert result.status == "aborted"
        assert host.chat_sessions.get(session.id).status == "aborted"
        assert host.chat_sessions.get(session.id).turn_count == 2


def test_contention_reports_the_sessions_turns_and_both_events() -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    with boot() as host:
        session = host.chat_sessions.create()
        host.chat(session.id, "one")
        token = host.transcripts.acquire(session.id, 60)  # another run holds the session
        assert token is not None
        busy = host.chat(session.id, "two",
                         payload={"event_sink": lambda e, p: events.append((e, p))})
        again = host.continue_conversation(session.id, extend_by=1)
    assert (busy.status, busy.cumulative_turn_count) == ("transcript_lock_contention", 1)
    assert (again.status, again.cumulative_turn_count) == ("transcript_lock_contention", 1)
    assert [e for e, _ in events] == ["transcript_lock_contention", "completed"]


def test_a_confirmation_hook_that_raises_before_the_run_is_an_error_result() -> None:
    class Broken:
        @hookimpl
        def confirm_continuation(self, budget: Any, context: dict[str, Any]) -> bool:
            raise RuntimeError("ui crashed")

    events: list[tuple[str, dict[str, Any]]] = []
    with boot(Broken()) as host:
        session = host.chat_sessions.create(max_turns=1)
        host.chat_sessions.add_turns(session.id, 1)  # at its limit before the run
        result = host.chat(session.id, "hi",
                           payload={"event_sink": lambda e, p: events.append((e, p))})
        assert (result.status, result.error_code, result.error) == (
            "error", "budget_hook_failed", "ui crashed")
        assert host.chat_sessions.get(session.id).status == "active"
        assert host.transcripts.locks.held() == []
    assert [e for e, _ in events] == ["failed"]
