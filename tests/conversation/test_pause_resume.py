"""confirmation="pause" and resume (DESIGN.md 16): a run waits for a person without holding a
lock, and a later call answers it on the same transcript with the same counts."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import bootstrap
from datamachine import (
    SessionAborted,
    SessionAwaitingConfirmation,
    SessionNotPaused,
    UsageError,
)
from datamachine.errors import InvalidSetting
from datamachine.host import Host
from datamachine.tools import Tool, ToolContext
from tests.conversation.hitl_tools import DELETE, LOOKUP, RUNS, HitlTools

ROOT = Path(__file__).resolve().parents[2]
PAUSE = {"confirmation": "pause"}
CALL_DELETE = {"tool_calls": [{"id": "d1", "name": "delete_file",
                               "parameters": {"path": "a.txt"}}]}


def lookup_call(n: int) -> dict[str, Any]:
    return {"tool_calls": [{"id": f"l{n}", "name": "lookup", "parameters": {"q": str(n)}}]}


@pytest.fixture
def host() -> Any:
    RUNS.clear()
    with bootstrap.boot(":memory:", plugins=[HitlTools()], load_entrypoints=False) as booted:
        yield booted


def stored_status(host: Host, session_id: str) -> str:
    return host.transcripts.summary(session_id).status


# -- a spent budget -------------------------------------------------------------------------

def test_a_spent_turn_budget_pauses_and_an_approval_extends_it(host: Host) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    paused = host.run_conversation(
        [{"role": "user", "content": "look twice"}], [LOOKUP], "scripted", "m", max_turns=1,
        payload={**PAUSE, "script": [lookup_call(1)],
                 "event_sink": lambda e, p: events.append((e, p))})
    assert (paused.status, paused.completed) == ("awaiting_confirmation", False)
    assert paused.pending is not None
    assert len(paused.pending.pop("pause_id")) == 32
    assert paused.pending == {"kind": "budget", "budget": "conversation_turns",
                              "tool_call": None, "extend_by": 1, "tool_calls": [],
                              "tools": ["lookup"]}
    assert paused.budget == "conversation_turns"
    assert paused.warning is not None
    assert "resume" in paused.warning
    assert events[-1][0] == "completed"
    assert events[-1][1]["status"] == "awaiting_confirmation"
    assert "final_summary" not in [e for e, _ in events]  # a pause is not the end
    session = paused.transcript_session_id
    assert session is not None
    assert stored_status(host, session) == "awaiting_confirmation"
    assert host.transcripts.summary(session).locked_until is None  # no lock is held

    resumed = host.resume(session, True, extend_by=2,
                          payload={"script": [lookup_call(2), {"content": "found both"}]})
    assert (resumed.status, resumed.final_content) == ("completed", "found both")
    assert resumed.pending is None
    # The counts carry on: 1 turn before the pause, 2 after it, under a ceiling of 1 + 2.
    assert resumed.budgets["conversation_turns"]["current"] == 3
    assert resumed.budgets["conversation_turns"]["ceiling"] == 3
    assert resumed.turn_count == 2
    assert resumed.cumulative_turn_count == 3
    contents = [m.content for m in resumed.messages if m.type == "tool_result"]
    assert contents == ["found 1", "found 2"]
    assert stored_status(host, session) == "completed"


def test_a_declined_budget_stops_the_run_with_its_summary(host: Host) -> None:
    paused = host.run_conversation(
        [{"role": "user", "content": "look"}], [LOOKUP], "scripted", "m", max_turns=1,
        payload={**PAUSE, "script": [lookup_call(1)]})
    assert paused.transcript_session_id is not None
    declined = host.resume(paused.transcript_session_id, False,
                           payload={"script": [{"content": "Looked once; found 1."}]})
    assert declined.status == "budget_exceeded"
    assert declined.budget == "conversation_turns"
    assert declined.final_content == "Looked once; found 1."
    assert declined.turn_count == 0


def test_a_spent_tool_budget_keeps_the_calls_it_stopped_until_approved(host: Host) -> None:
    host.settings.set("max_tool_calls", 1)
    two_calls = {"tool_calls": [{"id": "x", "name": "lookup", "parameters": {"q": "x"}},
                                {"id": "y", "name": "lookup", "parameters": {"q": "y"}}]}
    paused = host.run_conversation(
        [{"role": "user", "content": "look"}], [LOOKUP], "scripted", "m",
        payload={**PAUSE, "script": [two_calls]})
    assert paused.status == "awaiting_confirmation"
    assert paused.pending is not None
    assert paused.pending["budget"] == "tool_calls"
    assert [c["id"] for c in paused.pending["tool_calls"]] == ["y"]
    assert paused.transcript_session_id is not None
    resumed = host.resume(paused.transcript_session_id, True, extend_by=5,
                          payload={"script": [{"content": "x and y"}]})
    assert resumed.status == "completed"
    assert [r["tool_call_id"] for r in resumed.tool_execution_results] == ["y"]
    assert resumed.budgets["tool_calls"]["current"] == 2
    assert resumed.budgets["tool_calls"]["ceiling"] == 6


# -- a tool that needs approval -------------------------------------------------------------

def test_an_approved_tool_runs_exactly_once_after_the_pause(host: Host) -> None:
    paused = host.run_conversation(
        [{"role": "user", "content": "delete a.txt"}], [DELETE], "scripted", "m",
        payload={**PAUSE, "script": [{"content": "I will delete it.", **CALL_DELETE}]})
    assert paused.status == "awaiting_confirmation"
    assert RUNS == []
    assert paused.pending is not None
    assert paused.pending["kind"] == "tool_approval"
    assert paused.pending["tool_call"] == {"id": "d1", "name": "delete_file",
                                           "parameters": {"path": "a.txt"}}
    assert paused.final_content == "I will delete it."
    # No call is left without its result in the stored transcript.
    assert [m["type"] for m in host.transcripts.get(str(paused.transcript_session_id))] == [
        "text", "text"]
    assert paused.transcript_session_id is not None
    resumed = host.resume(paused.transcript_session_id, True,
                          payload={"script": [{"content": "Deleted a.txt."}]})
    assert (resumed.status, resumed.final_content) == ("completed", "Deleted a.txt.")
    assert RUNS == ["a.txt"]
    assert resumed.tool_execution_results[0]["result"]["result"] == "deleted a.txt"
    with pytest.raises(SessionNotPaused, match="not waiting for an answer"):
        host.resume(paused.transcript_session_id, True)
    assert RUNS == ["a.txt"]


def test_a_declined_tool_never_runs_and_the_model_reads_why(host: Host) -> None:
    seen: list[str] = []

    def read_refusal(event: str, payload: dict[str, Any]) -> None:
        if event == "tool_result":
            seen.append(payload["result"]["error_type"])

    paused = host.run_conversation(
        [{"role": "user", "content": "delete a.txt"}], [DELETE], "scripted", "m",
        payload={**PAUSE, "script": [CALL_DELETE]})
    assert paused.transcript_session_id is not None
    resumed = host.resume(paused.transcript_session_id, False, payload={
        "script": [{"content": "I did not delete it."}], "event_sink": read_refusal})
    assert (resumed.status, resumed.final_content) == ("completed", "I did not delete it.")
    assert RUNS == []
    assert seen == ["approval_declined"]
    assert resumed.tool_execution_results == []


def test_the_tools_of_a_paused_run_are_found_by_name_when_the_process_lost_them(
        host: Host) -> None:
    from datamachine.conversation.pausing import paused_runs

    paused = host.run_conversation(
        [{"role": "user", "content": "delete"}], [DELETE], "scripted", "m",
        payload={**PAUSE, "script": [CALL_DELETE]})
    session = str(paused.transcript_session_id)
    paused_runs(host).forget(session)  # as if another process resumed it
    resumed = host.resume(session, True, payload={"script": [{"content": "done"}]})
    assert resumed.status == "completed"
    assert RUNS == ["a.txt"]


def test_a_tool_no_process_has_is_a_clear_error_and_leaves_the_run_paused() -> None:
    secret = Tool(name="secret", description="Needs approval.", function=lambda: "ok",
                  runtime={"requires_approval": True})
    with bootstrap.boot(":memory:", load_entrypoints=False) as host:
        paused = host.run_conversation(
            [{"role": "user", "content": "go"}], [secret], "scripted", "m",
            payload={**PAUSE, "script": [{"tool_calls": [{"name": "secret",
                                                           "parameters": {}}]}]})
        session = str(paused.transcript_session_id)
        from datamachine.conversation.pausing import paused_runs

        paused_runs(host).forget(session)
        with pytest.raises(UsageError, match="secret; pass them again"):
            host.resume(session, True)
        assert stored_status(host, session) == "awaiting_confirmation"
        assert host.transcripts.summary(session).locked_until is None
        resumed = host.resume(session, True, tools=[secret],
                              payload={"script": [{"content": "ok"}]})
        assert resumed.status == "completed"


# -- chat sessions ----------------------------------------------------------------------------

def test_a_chat_at_its_turn_limit_pauses_with_the_turns_calls_waiting(host: Host) -> None:
    session = host.chat_sessions.create(max_turns=2)
    paused = host.chat(session.id, "look it up", [LOOKUP], payload={
        **PAUSE, "script": [lookup_call(1), lookup_call(2)]})
    assert paused.status == "awaiting_confirmation"
    assert paused.pending is not None
    assert paused.pending["kind"] == "chat_turn_limit"
    assert [c["id"] for c in paused.pending["tool_calls"]] == ["l2"]
    assert paused.last_tool_calls == [{"id": "l2", "name": "lookup", "parameters": {"q": "2"}}]
    stored = host.chat_sessions.get(session.id)
    assert (stored.status, stored.turn_count) == ("active", 2)
    with pytest.raises(SessionAwaitingConfirmation, match="paused") as caught:
        host.chat(session.id, "hello?")
    assert caught.value.pending["kind"] == "chat_turn_limit"
    with pytest.raises(SessionAwaitingConfirmation):
        host.continue_conversation(session.id, 1)

    resumed = host.resume(session.id, True, payload={"script": [{"content": "found 1, 2"}]})
    assert (resumed.status, resumed.final_content) == ("completed", "found 1, 2")
    assert [r["tool_call_id"] for r in resumed.tool_execution_results] == ["l2"]
    assert host.chat_sessions.get(session.id).turn_count == 1  # reset, then one more turn


def test_a_declined_chat_limit_aborts_the_session_and_refuses_the_waiting_calls(
        host: Host) -> None:
    session = host.chat_sessions.create(max_turns=1)
    host.chat(session.id, "delete", [DELETE], payload={**PAUSE, "script": [CALL_DELETE]})
    declined = host.resume(session.id, False)
    assert declined.status == "aborted"
    assert RUNS == []
    assert declined.last_tool_calls == [{"id": "d1", "name": "delete_file",
                                         "parameters": {"path": "a.txt"}}]
    stored = host.transcripts.get(session.id)
    assert [m["type"] for m in stored][-2:] == ["tool_call", "tool_result"]
    assert stored[-1]["payload"]["error_type"] == "session_aborted"
    assert host.chat_sessions.get(session.id).status == "aborted"
    with pytest.raises(SessionAborted):
        host.chat(session.id, "again")


def test_a_message_to_a_session_already_at_its_limit_waits_before_it_runs(host: Host) -> None:
    session = host.chat_sessions.create(max_turns=1)
    first = host.chat(session.id, "hi", payload={**PAUSE, "script": [{"content": "hello"}]})
    assert first.status == "completed"  # a final answer at the limit ends the run as usual
    waiting = host.chat(session.id, "and now?", payload=PAUSE)
    assert waiting.status == "awaiting_confirmation"
    assert waiting.pending is not None
    assert waiting.pending["kind"] == "chat_turn_limit"
    assert waiting.turn_count == 0
    assert host.transcripts.get(session.id)[-1]["content"] == "and now?"  # kept for resume
    resumed = host.resume(session.id, True)
    assert (resumed.status, resumed.final_content) == ("completed", "echo: and now?")


def test_an_approval_answers_the_waiting_call_only(host: Host) -> None:
    # Providers that send no ids get made-up ones that repeat (call_<turn>_<n>): the approval
    # of the waiting call must not approve a later call that reuses its id.
    no_id = {"tool_calls": [{"name": "delete_file", "parameters": {"path": "a.txt"}}]}
    paused = host.run_conversation(
        [{"role": "user", "content": "delete"}], [DELETE], "scripted", "m",
        payload={**PAUSE, "script": [no_id]})
    again = {"tool_calls": [{"name": "delete_file", "parameters": {"path": "b.txt"}}]}
    resumed = host.resume(str(paused.transcript_session_id), True,
                          payload={"script": [again, {"content": "done"}]})
    assert RUNS == ["a.txt"]
    assert resumed.status == "awaiting_confirmation"
    assert resumed.pending is not None
    assert resumed.pending["tool_call"]["parameters"] == {"path": "b.txt"}


def test_a_declined_call_never_runs_even_under_a_tool_without_approval(host: Host) -> None:
    plain = Tool(name="delete_file", description="Delete.", function=lambda path: RUNS.append(
        path))
    paused = host.run_conversation(
        [{"role": "user", "content": "delete"}], [DELETE], "scripted", "m",
        payload={**PAUSE, "script": [CALL_DELETE]})
    resumed = host.resume(str(paused.transcript_session_id), False, tools=[plain],
                          payload={"script": [{"content": "kept it"}]})
    assert resumed.status == "completed"
    assert RUNS == []


def test_every_budget_of_the_paused_run_carries_on(host: Host) -> None:
    host.settings.set("confirmation", "pause")
    paused = host.run_conversation(
        [{"role": "user", "content": "look"}], [LOOKUP], "scripted", "m",
        payload={"budget_ceilings": {"tool_calls_lookup": 1},
                 "script": [lookup_call(1), lookup_call(2)]})
    assert paused.budget == "tool_calls_lookup"
    from datamachine.conversation.pausing import paused_runs

    session = str(paused.transcript_session_id)
    paused_runs(host).forget(session)  # another process: the payload's ceilings are not here
    resumed = host.resume(session, True, extend_by=1,
                          payload={"script": [lookup_call(3), lookup_call(4)]})
    assert resumed.status == "awaiting_confirmation"
    assert resumed.budgets["tool_calls_lookup"]["current"] == 2
    assert resumed.budgets["tool_calls_lookup"]["ceiling"] == 2


def test_a_pause_answered_elsewhere_is_never_resumed_with_this_processes_old_tools(
        tmp_path: Path) -> None:
    db = str(tmp_path / "dm.db")
    old = Tool(name="delete_file", description="Old.", function=lambda path: "old",
               runtime={"requires_approval": True})
    with bootstrap.boot(db, plugins=[HitlTools()], load_entrypoints=False) as first, \
            bootstrap.boot(db, plugins=[HitlTools()], load_entrypoints=False) as second:
        session = first.chat_sessions.create().id
        first.chat(session, "delete", [old], payload={**PAUSE, "script": [CALL_DELETE]})
        second.resume(session, True, tools=[DELETE], payload={"script": [
            {"tool_calls": [{"id": "d2", "name": "delete_file",
                             "parameters": {"path": "b.txt"}}]}]})
        resumed = first.resume(session, True, payload={"script": [{"content": "ok"}]})
    assert resumed.status == "completed"
    assert resumed.tool_execution_results[0]["result"]["result"] == "deleted b.txt"


# -- refusals and races -----------------------------------------------------------------------

def test_resuming_a_session_that_is_not_paused_is_a_clear_error(host: Host) -> None:
    done = host.run_conversation([{"role": "user", "content": "hi"}], provider="scripted")
    with pytest.raises(SessionNotPaused, match="status is 'completed'") as caught:
        host.resume(str(done.transcript_session_id), True)
    assert caught.value.status == "completed"
    assert host.transcripts.summary(str(done.transcript_session_id)).locked_until is None


@pytest.mark.parametrize(("args", "match"), [
    (("", True), "session_id"), (("s", "yes"), "approve must be True"),
    (("s", True, 0), "extend_by")])
def test_bad_resume_arguments_are_refused_before_anything(host: Host, args: tuple[Any, ...],
                                                          match: str) -> None:
    with pytest.raises(UsageError, match=match):
        host.resume(*args)


def test_the_confirmation_setting_and_payload_key_are_checked(host: Host) -> None:
    with pytest.raises(InvalidSetting, match="'ask'"):
        host.settings.set("confirmation", "later")
    with pytest.raises(UsageError, match="payload\\['confirmation'\\]"):
        host.run_conversation([{"role": "user", "content": "x"}], provider="scripted",
                              payload={"confirmation": True})


def test_the_setting_makes_every_run_pause(host: Host) -> None:
    host.settings.set("confirmation", "pause")
    paused = host.run_conversation(
        [{"role": "user", "content": "delete"}], [DELETE], "scripted", "m",
        payload={"script": [CALL_DELETE]})
    assert paused.status == "awaiting_confirmation"


def test_two_resumes_at_once_one_runs_and_the_other_meets_the_lock(tmp_path: Path) -> None:
    RUNS.clear()
    started, release = threading.Event(), threading.Event()

    def slow_delete(path: str) -> str:
        started.set()
        release.wait(timeout=10)
        RUNS.append(path)
        return "deleted"

    slow = Tool(name="delete_file", description="Delete.", function=slow_delete,
                runtime={"requires_approval": True})
    with bootstrap.boot(str(tmp_path / "dm.db"), load_entrypoints=False) as host:
        paused = host.run_conversation(
            [{"role": "user", "content": "delete"}], [slow], "scripted", "m",
            payload={**PAUSE, "script": [CALL_DELETE]})
        session = str(paused.transcript_session_id)
        results: list[Any] = []
        first = threading.Thread(target=lambda: results.append(
            host.resume(session, True, payload={"script": [{"content": "gone"}]})))
        first.start()
        assert started.wait(timeout=10)
        second = host.resume(session, True)
        release.set()
        first.join(timeout=10)
    assert second.status == "transcript_lock_contention"
    assert results[0].status == "completed"
    assert RUNS == ["a.txt"]


def test_a_pause_survives_the_process_and_another_process_resumes_it(tmp_path: Path) -> None:
    db, log = tmp_path / "dm.db", tmp_path / "runs.log"
    with bootstrap.boot(str(db), plugins=[HitlTools()], load_entrypoints=False) as host:
        paused = host.chat(host.chat_sessions.create().id, "delete a.txt",
                           list(host.tools.tools().values()),
                           payload={**PAUSE, "script": [CALL_DELETE]})
    assert paused.status == "awaiting_confirmation"
    script = (
        "import json, sys\n"
        "import bootstrap\n"
        "from tests.conversation.hitl_tools import HitlTools\n"
        "with bootstrap.boot(sys.argv[1], plugins=[HitlTools()], load_entrypoints=False) as h:\n"
        "    r = h.resume(sys.argv[2], True, payload={'script': [{'content': 'gone'}]})\n"
        "    print(json.dumps({'status': r.status, 'final': r.final_content}))\n")
    done = subprocess.run(
        [sys.executable, "-c", script, str(db), str(paused.transcript_session_id)],
        cwd=ROOT, env={**os.environ, "HITL_LOG": str(log)}, capture_output=True, text=True,
        timeout=60, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"status": "completed",
                                                               "final": "gone"}
    assert log.read_text().splitlines() == ["a.txt"]


def test_aresume_answers_a_pause_inside_an_event_loop(host: Host) -> None:
    async def scenario() -> tuple[str, str]:
        session = host.chat_sessions.create()
        paused = await host.achat(session.id, "delete", [DELETE],
                                  payload={**PAUSE, "script": [CALL_DELETE]})
        resumed = await host.aresume(session.id, True, payload={"script": [{"content": "ok"}]})
        return paused.status, resumed.status

    assert asyncio.run(scenario()) == ("awaiting_confirmation", "completed")
    assert RUNS == ["a.txt"]


def test_a_paused_pipeline_run_settles_its_job_and_the_resume_runs_without_it(
        host: Host) -> None:
    job = host.jobs.create(flow_step_id="step-1")
    paused = host.run_conversation(
        [{"role": "user", "content": "delete"}], [DELETE], "scripted", "m",
        payload={**PAUSE, "job_id": job.id, "script": [CALL_DELETE]})
    assert paused.status == "awaiting_confirmation"
    settled = host.jobs.get(job.id)
    # A job never stays running: it records that its run waits for a person.
    assert (settled.status, settled.failure_reason) == ("failed", "awaiting_confirmation")
    resumed = host.resume(str(paused.transcript_session_id), True,
                          payload={"script": [{"content": "done"}]})
    assert resumed.status == "completed"
    assert host.jobs.get(job.id).status == "failed"  # settled once, by the paused run


def _fetch(q: str, context: ToolContext) -> str:
    """Fetch something, counted by the fetches budget."""
    context.budget("fetches").increment()
    return f"fetched {q}"


FETCH = Tool(name="fetch", description="Fetch something.", function=_fetch)


def test_declining_a_pause_ends_the_run_on_the_declined_budget(host: Host) -> None:
    """A run paused on a plugin budget, with its turn budget spent too: declined, it stops on
    the budget the person declined (with its summary), never pausing again on the turns."""
    host.budgets.register("fetches", {"default": 1, "min": 1, "max": 5})
    script = [{"tool_calls": [{"id": "f1", "name": "fetch", "parameters": {"q": "a"}}]},
              {"content": "Fetched a."}]
    paused = host.run_conversation([{"role": "user", "content": "fetch"}], [FETCH], "scripted",
                                   "m", max_turns=1, payload={**PAUSE, "script": script})
    assert paused.status == "awaiting_confirmation"
    assert paused.pending is not None
    assert paused.pending["budget"] == "fetches"
    assert paused.transcript_session_id is not None
    declined = host.resume(paused.transcript_session_id, False, tools=[FETCH],
                           payload={"script": [{"content": "Fetched a, then stopped."}]})
    assert (declined.status, declined.budget) == ("budget_exceeded", "fetches")
    assert declined.flags == ["max_fetches_reached"]
    assert declined.final_content == "Fetched a, then stopped."
    assert declined.pending is None
    assert stored_status(host, paused.transcript_session_id) == "budget_exceeded"
