"""A run records its rare events (pressure, extensions, the stop, the final summary, nudges) in
its stored result as ``timeline``, for the run viewer, whether or not anyone listens."""

from __future__ import annotations

from typing import Any

import pytest

import bootstrap
from agents_api import IterationBudget
from datamachine import hookimpl
from datamachine.conversation.timeline import MAX_ENTRIES, RunTimeline
from datamachine.host import Host
from tests.completion.helpers import call, save_note, say, turn
from tests.conversation.work import USER, step


class ExtendOnce:
    @hookimpl
    def confirm_continuation(self, budget: Any, context: dict[str, Any]) -> bool:
        return bool(budget.ceiling() < 5)


def _looping(turns: int) -> list[dict[str, Any]]:
    return [{"tool_calls": [{"id": f"c{i}", "name": "step", "parameters": {"n": i}}]}
            for i in range(turns)]


def _stored_timeline(host: Host, session_id: str) -> list[dict[str, Any]]:
    timeline = host.transcripts.timeline(session_id)
    assert "timeline" not in host.transcripts.summary(session_id).result  # its own column
    return timeline


@pytest.mark.parametrize("listening", [False, True])
def test_pressure_extension_stop_and_summary_are_stored_in_order(listening: bool) -> None:
    events: list[str] = []
    payload: dict[str, Any] = {"script": _looping(20), "budget_pressure": True,
                               "transcript_session_id": "s", "extend_by": 2}
    if listening:
        payload["event_sink"] = lambda event, _: events.append(event)
    with bootstrap.boot(":memory:", plugins=[ExtendOnce()], load_entrypoints=False) as host:
        result = host.run_conversation(USER, [step], "scripted", "m", max_turns=3,
                                       payload=payload)
        timeline = _stored_timeline(host, "s")
    assert result.status == "budget_exceeded"
    assert [(e["event"], e["turn"], e.get("tier"), e.get("ceiling")) for e in timeline] == [
        ("budget_pressure", 1, "caution", 3),
        ("budget_pressure", 2, "warning", 3),
        ("budget_extended", 3, None, 5),
        ("budget_exceeded", 5, None, 5),
        ("final_summary", 5, None, None),
    ]
    assert timeline[3]["rail"] == "ceiling"
    assert timeline[4]["source"] == "fallback"
    if listening:  # the sink saw the very same events
        assert [e for e in events if e in {t["event"] for t in timeline}] == [
            t["event"] for t in timeline]


def test_a_completion_nudge_is_on_the_timeline(host: Host) -> None:
    script = [say("I will file them shortly."), turn(call("save_note", text="n")), say("Done.")]
    result = host.run_conversation(
        USER, [save_note], "scripted", "m", mode="chat",
        payload={"script": script, "transcript_session_id": "n",
                 "completion_assertions": {"required_tool_names": ["save_note"]}})
    assert result.status == "completed"
    [nudge] = _stored_timeline(host, "n")
    assert (nudge["event"], nudge["turn"], nudge["completion_nudge_count"]) == (
        "completion_nudge_added", 1, 1)


def test_a_plain_run_stores_no_timeline(host: Host) -> None:
    host.run_conversation(USER, payload={"transcript_session_id": "p"})
    assert host.transcripts.timeline("p") == []


def test_the_timeline_keeps_its_first_entries_and_short_values() -> None:
    turns = IterationBudget("conversation_turns", 10)
    timeline = RunTimeline(turns)
    turns.set_current(7)  # seven turns finished since the run started
    timeline.record("turn_started", {"turn": 1})  # per-turn events are never kept
    for _ in range(MAX_ENTRIES + 5):
        timeline.record("completion_nudge_added", {"completion_nudge": "n" * 2000,
                                                   "completion_nudge_count": 1})
    assert len(timeline.entries) == MAX_ENTRIES
    assert timeline.entries[0]["turn"] == 7
    assert len(timeline.entries[0]["completion_nudge"]) == 500


def test_a_finished_run_is_freed_at_once_not_by_the_cycle_collector(host: Host) -> None:
    """The timeline once held a method of its run: every run became a reference cycle that
    lived until the cyclic collector ran (and cost every collection a walk through it)."""
    import gc

    from datamachine.conversation.conversation_run import ConversationRun

    gc.collect()
    gc.disable()
    try:
        host.run_conversation(USER, [step], "scripted", "m", max_turns=2,
                              payload={"script": _looping(3), "budget_pressure": True})
        alive = [o for o in gc.get_objects() if isinstance(o, ConversationRun)]
    finally:
        gc.enable()
    assert alive == []


def test_a_resumed_run_keeps_the_paused_runs_entries_numbered_as_its_messages(
        host: Host) -> None:
    paused = host.run_conversation(
        USER, [step], "scripted", "m", max_turns=3,
        payload={"script": _looping(20), "budget_pressure": True, "confirmation": "pause",
                 "transcript_session_id": "r"})
    assert paused.status == "awaiting_confirmation"
    before = _stored_timeline(host, "r")
    assert [(e["event"], e["turn"], e["run_base"]) for e in before] == [
        ("budget_pressure", 1, 0), ("budget_pressure", 2, 0)]
    declined = host.resume("r", False, payload={"script": _looping(20)})
    assert declined.status == "budget_exceeded"
    after = _stored_timeline(host, "r")
    assert after[:2] == before  # the paused run's entries are still there
    # The declining run made no turn of its own: its stop is on its turn 0, after 3 turns.
    assert [(e["event"], e["turn"], e["run_base"]) for e in after[2:]] == [
        ("budget_exceeded", 0, 3), ("final_summary", 0, 3)]


def test_every_run_of_a_chat_session_keeps_its_entries(host: Host) -> None:
    session = host.chat_sessions.create()
    for _ in range(2):
        result = host.chat(session.id, "go", [step], "scripted", "m",
                           payload={"script": _looping(4),
                                    "budget_ceilings": {"conversation_turns": 2}})
        assert result.status == "budget_exceeded"
    timeline = _stored_timeline(host, session.id)
    assert [(e["event"], e["turn"], e["run_base"]) for e in timeline] == [
        ("budget_exceeded", 2, 0), ("final_summary", 2, 0),
        ("budget_exceeded", 2, 2), ("final_summary", 2, 2)]


def test_a_run_with_no_turns_keeps_its_events_when_the_session_goes_on(host: Host) -> None:
    host.run_conversation(USER, [step], "scripted", "m", max_turns=1,
                          payload={"script": _looping(5), "confirmation": "pause",
                                   "transcript_session_id": "z"})
    declined = host.resume("z", False, payload={"script": _looping(5)})
    assert (declined.status, declined.turn_count) == ("budget_exceeded", 0)
    events = [(e["event"], e["run_base"]) for e in _stored_timeline(host, "z")]
    assert events == [("budget_exceeded", 1), ("final_summary", 1)]
    continued = host.continue_conversation("z", 1, [step], "scripted", "m")
    assert continued.status == "completed"
    after = [(e["event"], e["run_base"]) for e in _stored_timeline(host, "z")]
    assert after == events  # the declined run (no turns of its own) keeps its events


class OwnPersister:
    """A caller's own transcript persister: it gets the run's result, metadata and all."""

    def __init__(self) -> None:
        self.results: list[Any] = []

    def append_turn(self, session_id: str, turn: int, messages: list[Any]) -> None:
        pass

    def persist(self, messages: list[Any], request: dict[str, Any], result: Any) -> str:
        self.results.append(result)
        return "own"


def test_a_caller_s_persister_gets_the_timeline_and_a_run_that_stores_nothing_keeps_none(
        host: Host) -> None:
    from datamachine.conversation.conversation_run import ConversationRun

    persister = OwnPersister()
    payload = {"script": [*_looping(2), {"content": "Done."}], "transcript_persister": persister}
    result = host.run_conversation(USER, [step], "scripted", "m", payload=payload)
    assert result.status == "completed"
    [stored] = persister.results
    assert [(e["event"], e["turn"]) for e in stored.metadata["timeline"]] == [
        ("request", 1), ("request", 2), ("request", 3)]
    # Nothing stores what a run keeps for the viewer: it keeps nothing, not even per request.
    unstored = ConversationRun.create(host, USER, [step], "scripted", "m",
                                      payload={"persist_transcript": False})
    assert unstored.timeline is None
    assert unstored.provider_turn.timeline is None
