"""Exactly once, or in doubt (DESIGN.md 24), in one process: a run dies right after a tool's
side effect (a BaseException nothing catches, so its turn is never stored, as with kill -9;
the real kills are in test_kill_points.py) and every path that goes on is checked."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

import bootstrap
from datamachine import (
    CallNotInDoubt,
    SessionAwaitingConfirmation,
    Tool,
    ToolContext,
    hookimpl,
    tool,
)
from datamachine.host import Host
from tests.exactly_once.crash_tools import CRASH, LEDGER, TOOLS, Crash, Planner
from tests.tools.test_approval import Approver

SEND = {"name": "send", "parameters": {"to": "ada"}}
CHARGE = {"name": "charge", "parameters": {"cents": 500}}
LOOK = {"name": "look", "parameters": {"q": "weather"}}
USER = [{"role": "user", "content": "do it"}]


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    LEDGER.clear()
    CRASH["after_effect"] = False
    yield
    CRASH["after_effect"] = False


def boot(*plugins: object, pause: bool = False, db: str = ":memory:") -> Host:
    host = bootstrap.boot(db, plugins=list(plugins), load_entrypoints=False)
    if pause:
        host.settings.set("confirmation", "pause")
    return host


def crash_run(host: Host, session: str = "s1", tools: list[Any] = TOOLS,
              payload: dict[str, Any] | None = None) -> None:
    """Run until the first effectful call's side effect, and die there."""
    CRASH["after_effect"] = True
    with pytest.raises(Crash):
        host.run_conversation(USER, tools, "scripted", "m",
                              payload={"transcript_session_id": session, **(payload or {})})
    assert not CRASH["after_effect"]


def pending_intents(host: Host, session: str = "s1") -> list[Any]:
    return host.transcripts.unsettled_intents(session)


def results(result: Any) -> list[dict[str, Any]]:
    return [m.payload for m in result.messages if m.type == "tool_result"]


def test_a_settled_call_leaves_no_intent_and_a_read_call_stores_none() -> None:
    with boot(Planner([[LOOK], [SEND]])) as host:
        result = host.run_conversation(USER, TOOLS, "scripted", "m",
                                       payload={"transcript_session_id": "s1"})
        rows = host.db.conn.execute("SELECT tool_name, state FROM tool_intents").fetchall()
        assert pending_intents(host) == []
    assert result.status == "completed"
    assert [tuple(row) for row in rows] == [("send", "settled")]  # look stored nothing


def test_a_write_call_found_unsettled_is_reported_in_doubt_with_nobody_to_ask() -> None:
    planner = Planner([[SEND]])
    with boot(planner) as host:
        crash_run(host)
        [intent] = pending_intents(host)
        assert (intent.tool_name, intent.effects, intent.arguments) == (
            "send", "write", {"to": "ada"})
        result = host.continue_conversation("s1", 3, TOOLS)
        assert pending_intents(host) == []  # the stored result settled it
    assert len(LEDGER) == 1  # never run again
    [told] = results(result)
    assert told["error_type"] == "tool_in_doubt"
    assert told["idempotency_key"] == LEDGER[0]["key"]
    assert "may or may not have run" in result.final_content
    assert result.status == "completed"


def test_pause_mode_pauses_in_doubt_before_the_model_is_asked_and_approve_runs_it_again(
        db_target: str) -> None:
    planner = Planner([[SEND]])
    with boot(planner, pause=True, db=db_target) as host:
        crash_run(host)
        asked_before = planner.requests
        paused = host.continue_conversation("s1", 3, TOOLS)
        assert paused.status == "awaiting_confirmation"
        assert paused.pending is not None
        assert paused.pending["kind"] == "tool_in_doubt"
        assert paused.pending["tool_call"] == {"id": "r1c0", "name": "send",
                                               "parameters": {"to": "ada"}}
        assert paused.pending["effects"] == "write"
        assert planner.requests == asked_before  # the model was not asked
        with pytest.raises(SessionAwaitingConfirmation):
            host.continue_conversation("s1", 3, TOOLS)
        done = host.resume("s1", True, pause_id=paused.pending["pause_id"])
        assert pending_intents(host) == []
    assert done.status == "completed"
    assert [line["key"] for line in LEDGER] == [LEDGER[0]["key"]] * 2  # approved: once more
    assert done.final_content == "final: sent to ada"


def test_decline_records_the_call_as_not_done() -> None:
    with boot(Planner([[SEND]]), pause=True) as host:
        crash_run(host)
        paused = host.continue_conversation("s1", 3, TOOLS)
        done = host.resume("s1", False)
        assert pending_intents(host) == []
    assert paused.status == "awaiting_confirmation"
    assert len(LEDGER) == 1
    assert results(done)[-1]["error_type"] == "tool_not_done"
    assert done.status == "completed"


def test_resolve_records_what_happened_and_goes_on_like_resume(db_target: str) -> None:
    with boot(Planner([[SEND]]), pause=True, db=db_target) as host:
        crash_run(host)
        paused = host.continue_conversation("s1", 3, TOOLS)
        assert paused.pending is not None
        call_id = paused.pending["tool_call"]["id"]
        done = host.resolve("s1", call_id, "sent to ada at 10:02 (seen in the outbox)")
        assert pending_intents(host) == []
        with pytest.raises(CallNotInDoubt, match="is not in doubt") as refused:
            host.resolve("s1", call_id, "again")
    assert refused.value.in_doubt == []
    assert len(LEDGER) == 1
    assert results(done)[-1]["resolved"] is True
    assert done.final_content == "final: sent to ada at 10:02 (seen in the outbox)"


def test_resolve_works_on_a_session_a_run_died_on_before_anyone_paused_it() -> None:
    with boot(Planner([[SEND]])) as host:
        crash_run(host)
        [intent] = pending_intents(host)
        done = host.resolve("s1", intent.call_id, {"success": True, "result": "sent"})
    assert done.status == "completed"
    assert len(LEDGER) == 1


def test_an_idempotent_call_runs_again_with_its_key_even_in_pause_mode(db_target: str) -> None:
    with boot(Planner([[CHARGE]]), pause=True, db=db_target) as host:
        crash_run(host)
        done = host.continue_conversation("s1", 3, TOOLS)
        assert pending_intents(host) == []
    assert done.status == "completed"
    assert [line["tool"] for line in LEDGER] == ["charge", "charge"]
    assert LEDGER[0]["key"] == LEDGER[1]["key"]


class Reconciler:
    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.asked: list[tuple[Any, dict[str, Any], str]] = []

    @hookimpl
    def reconcile_tool_call(self, tool: Tool | None, call: dict[str, Any],
                            idempotency_key: str) -> Any:
        self.asked.append((tool, call, idempotency_key))
        return self.answer


def test_the_reconcile_hook_settles_a_call_without_running_it() -> None:
    reconciler = Reconciler("sent to ada (found in the provider's log)")
    with boot(Planner([[SEND]]), reconciler, pause=True) as host:
        crash_run(host)
        done = host.continue_conversation("s1", 3, TOOLS)
        assert pending_intents(host) == []
    [(tool, call, key)] = reconciler.asked
    assert tool is not None
    assert tool.name == "send"
    assert call == {"id": "r1c0", "name": "send", "parameters": {"to": "ada"}}
    assert key == LEDGER[0]["key"]
    assert len(LEDGER) == 1
    assert done.status == "completed"  # settled: never in doubt, nobody asked
    assert results(done)[-1]["reconciled"] is True


def test_a_reconcile_hook_without_an_answer_leaves_the_call_in_doubt() -> None:
    with boot(Planner([[SEND]]), Reconciler(None), pause=True) as host:
        crash_run(host)
        paused = host.continue_conversation("s1", 3, TOOLS)
    assert paused.pending is not None
    assert paused.pending["kind"] == "tool_in_doubt"


@pytest.mark.parametrize(("answer", "runs", "error_type"), [
    (True, 2, None), (False, 1, "tool_not_done"), (None, 1, "tool_in_doubt")])
def test_ask_mode_asks_confirm_continuation_with_kind_tool_in_doubt(
        answer: bool | None, runs: int, error_type: str | None) -> None:
    person = Approver(answer)
    with boot(Planner([[SEND]]), person) as host:
        crash_run(host)
        done = host.continue_conversation("s1", 3, TOOLS)
    [asked] = person.asked
    assert asked["kind"] == "tool_in_doubt"
    assert asked["tool_call"]["name"] == "send"
    assert asked["idempotency_key"] == LEDGER[0]["key"]
    assert len(LEDGER) == runs
    assert results(done)[-1].get("error_type") == error_type


APPROVED_READ = Tool(name="publish", description="Publish a post.",
                     function=lambda title: _published(title),
                     runtime={"requires_approval": True})


def _published(title: str) -> str:
    LEDGER.append({"tool": "publish", "value": title, "key": ""})
    if CRASH["after_effect"]:
        CRASH["after_effect"] = False
        raise Crash("died after publish")
    return f"published {title}"


def test_an_approval_is_used_up_when_its_call_starts(db_target: str) -> None:
    """A read tool that needs approval: approved, it starts, the process dies; answering the
    stale question again does not run it a second time: it is in doubt."""
    publish = {"name": "publish", "parameters": {"title": "hello"}}
    with boot(Planner([[publish]]), pause=True, db=db_target) as host:
        first = host.run_conversation(USER, [APPROVED_READ], "scripted", "m",
                                      payload={"transcript_session_id": "s1"})
        assert first.pending is not None
        assert first.pending["kind"] == "tool_approval"
        CRASH["after_effect"] = True
        with pytest.raises(Crash):
            host.resume("s1", True)
        assert len(LEDGER) == 1
        # The same answer, given again (the tools again: the process that held them died).
        again = host.resume("s1", True, tools=[APPROVED_READ])
        assert len(LEDGER) == 1  # not run twice on one approval
        assert again.status == "awaiting_confirmation"
        assert again.pending is not None
        assert again.pending["kind"] == "tool_in_doubt"
        done = host.resume("s1", True, tools=[APPROVED_READ])  # for the in-doubt question
    assert len(LEDGER) == 2
    assert done.final_content == "final: published hello"


def test_a_chat_message_to_a_session_left_in_doubt_handles_the_call_first() -> None:
    planner = Planner([[SEND]])
    with boot(planner, pause=True) as host:
        host.chat_sessions.create(session_id="c1")
        CRASH["after_effect"] = True
        with pytest.raises(Crash):
            host.chat("c1", "send it", TOOLS)
        paused = host.chat("c1", "did it go?", TOOLS)
        assert paused.status == "awaiting_confirmation"
        assert paused.pending is not None
        assert paused.pending["kind"] == "tool_in_doubt"
        with pytest.raises(SessionAwaitingConfirmation):
            host.chat("c1", "hello?", TOOLS)
        done = host.resume("c1", False)
    assert len(LEDGER) == 1
    assert done.status == "completed"


def test_a_call_id_the_provider_reuses_after_a_crash_gets_its_own_key_and_intent() -> None:
    """Calls without ids are numbered call_<turn>_<n> in every run, and a turn that died is
    not counted: the next run's first call has the dead one's id and turn. Its key and its
    intent must still be its own."""
    plan = [[SEND], [{"name": "send", "parameters": {"to": "bob"}}]]
    with boot(Planner(plan, ids=None)) as host:
        crash_run(host)
        [ada] = pending_intents(host)
        CRASH["after_effect"] = True
        with pytest.raises(Crash):  # reports ada's call in doubt, then dies in bob's
            host.continue_conversation("s1", 3, TOOLS)
        [bob] = pending_intents(host)
    assert ada.call_id == bob.call_id == "call_1_1"
    assert ada.idempotency_key != bob.idempotency_key
    assert bob.arguments == {"to": "bob"}
    assert [line["key"] for line in LEDGER] == [ada.idempotency_key, bob.idempotency_key]


def test_calls_of_one_turn_that_share_an_id_are_each_settled() -> None:
    plan = [[SEND, CHARGE]]
    with boot(Planner(plan, ids="same")) as host:
        result = host.run_conversation(USER, TOOLS, "scripted", "m",
                                       payload={"transcript_session_id": "s1"})
        assert pending_intents(host) == []
    assert result.status == "completed"
    assert len({line["key"] for line in LEDGER}) == 2


def test_the_second_of_two_calls_in_doubt_can_be_resolved_first() -> None:
    plan = [[SEND, {"name": "send", "parameters": {"to": "bob"}}]]
    with boot(Planner(plan), pause=True) as host:
        CRASH["after_effect"] = True
        with pytest.raises(Crash):
            host.run_conversation(USER, TOOLS, "scripted", "m",
                                  payload={"transcript_session_id": "s1"})
        # Dies in ada's call; continue pauses on it. Bob's call never started (no intent).
        paused = host.continue_conversation("s1", 3, TOOLS)
        assert paused.pending is not None
        [ada] = pending_intents(host)
        done = host.resolve("s1", ada.call_id, "sent to ada")
        assert pending_intents(host) == []
    assert done.status == "completed"
    assert [line["value"] for line in LEDGER] == ["ada", "bob"]


def test_a_resolve_is_never_lost_behind_another_call_in_doubt() -> None:
    plan = [[SEND, {"name": "send", "parameters": {"to": "bob"}}]]
    with boot(Planner(plan), pause=True) as host:
        CRASH["after_effect"] = 2
        with pytest.raises(Crash):  # ada's mail goes out, bob's too, and the process dies
            host.run_conversation(USER, TOOLS, "scripted", "m",
                                  payload={"transcript_session_id": "s1"})
        ada, bob = pending_intents(host)
        assert (ada.arguments, bob.arguments) == ({"to": "ada"}, {"to": "bob"})
        # The person answers for bob first; ada, still in doubt, pauses the run again.
        answered = host.resolve("s1", bob.call_id, "sent to bob")
        assert answered.status == "awaiting_confirmation"
        assert answered.pending is not None
        assert answered.pending["tool_call"]["id"] == ada.call_id
        assert [i.call_id for i in pending_intents(host)] == [ada.call_id]
        done = host.resolve("s1", ada.call_id, "sent to ada")
    assert done.status == "completed"
    assert [line["value"] for line in LEDGER] == ["ada", "bob"]


def test_a_crash_after_a_budget_extension_is_not_stuck_on_the_budget() -> None:
    with boot(Planner([[LOOK, SEND]]), pause=True) as host:
        paused = host.run_conversation(
            USER, TOOLS, "scripted", "m",
            payload={"transcript_session_id": "s1", "budget_ceilings": {"tool_calls": 1}})
        assert paused.pending is not None
        assert paused.pending["kind"] == "budget"
        CRASH["after_effect"] = True
        with pytest.raises(Crash):  # extended; send runs and the process dies
            host.resume("s1", True, extend_by=5, tools=TOOLS)
        again = host.resume("s1", True, extend_by=5, tools=TOOLS)
        assert again.pending is not None
        assert again.pending["kind"] == "tool_in_doubt"  # not the budget again
        done = host.resume("s1", False, tools=TOOLS)
    assert done.status == "completed"
    assert len(LEDGER) == 1


class Broken:
    @hookimpl
    def reconcile_tool_call(self, tool: Any, call: Any, idempotency_key: str) -> Any:
        raise ConnectionError("the mail log is down")


def test_a_reconcile_hook_that_raises_leaves_the_call_to_a_person() -> None:
    planner = Planner([[SEND]])
    with boot(planner, Broken(), pause=True) as host:
        crash_run(host)
        asked = planner.requests
        paused = host.continue_conversation("s1", 3, TOOLS)
    assert paused.pending is not None
    assert paused.pending["kind"] == "tool_in_doubt"
    assert planner.requests == asked


def test_a_call_whose_intent_cannot_be_stored_does_not_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from datamachine.errors import DatabaseError
    from datamachine.storage.transcript_writer import TranscriptWriter

    def refuse(self: TranscriptWriter, intent: Any) -> None:
        raise DatabaseError("disk full")

    monkeypatch.setattr(TranscriptWriter, "record_intent", refuse)
    with boot(Planner([[SEND]])) as host:
        result = host.run_conversation(USER, TOOLS, "scripted", "m",
                                       payload={"transcript_session_id": "s1"})
    assert LEDGER == []
    assert results(result)[0]["error_type"] == "intent_not_stored"


async def _post(to: str, context: ToolContext) -> str:
    LEDGER.append({"tool": "post", "value": to, "key": context.idempotency_key})
    if CRASH["after_effect"]:
        CRASH["after_effect"] = False
        raise Crash("died after post")
    return f"posted to {to}"


POST = Tool(name="post", description="Post a message.", function=_post,
            runtime={"effects": "write"})


def test_an_async_write_tool_is_in_doubt_and_runs_again_when_approved() -> None:
    plan = [[{"name": "post", "parameters": {"to": "ada"}}]]
    with boot(Planner(plan), pause=True) as host:
        CRASH["after_effect"] = True
        with pytest.raises(Crash):
            asyncio.run(host.arun_conversation(USER, [POST], "scripted", "m",
                                               payload={"transcript_session_id": "s1"}))
        paused = asyncio.run(host.acontinue_conversation("s1", 3, [POST]))
        assert paused.pending is not None
        assert paused.pending["kind"] == "tool_in_doubt"
        done = asyncio.run(host.aresume("s1", True, tools=[POST]))
    assert done.final_content == "final: posted to ada"
    assert [line["key"] for line in LEDGER] == [LEDGER[0]["key"]] * 2


def test_a_call_the_time_limit_cut_off_stays_in_doubt() -> None:
    """The loop gives up on a call at the run's time limit, but a sync tool may still be
    running in its thread: its stored result ("did not finish") must not settle it."""
    from agents_api import Message
    from datamachine.storage.tool_intents import Intent

    with boot() as host:
        store = host.transcripts
        token = store.acquire("s1", 60)
        assert token is not None
        writer = store.open_writer("s1", token, 60)
        writer.begin([Message.text("user", "go")], {})
        writer.record_intent(Intent("c1", "send", {"to": "ada"}, "dm-1", "write", 1))
        writer.record_intent(Intent("c2", "send", {"to": "bob"}, "dm-2", "write", 1))
        cut = {"success": False, "error": "did not finish", "error_type": "deadline_exceeded"}
        writer.append_turn(1, [
            Message.tool_call("send", {"to": "ada"}, 1, "c1"),
            Message.tool_result("send", cut, 1, "c1", "did not finish"),
            Message.tool_call("send", {"to": "bob"}, 1, "c2"),
            Message.tool_result("send", {"success": True, "result": "sent"}, 1, "c2", "sent")])
        writer.release()
        assert [intent.call_id for intent in store.unsettled_intents("s1")] == ["c1"]


def test_a_run_whose_lock_was_taken_over_does_not_run_its_write_call(tmp_path: Any) -> None:
    """The intent's transaction proves the lock: a run whose lock expired and was taken by
    another run before its write call stores nothing, never runs the call, and stops."""
    import datetime as dt

    from freezegun import freeze_time

    taken: list[str | None] = []

    @tool
    def slow_lookup(q: str) -> str:
        """Look something up, slowly: the run's lock runs out meanwhile.

        Args:
            q: What to look up.
        """
        frozen.tick(dt.timedelta(seconds=120))
        taken.append(host.transcripts.acquire("s1", 60))  # another run takes the session
        return f"found {q}"

    plan = [[{"name": "slow_lookup", "parameters": {"q": "x"}}, SEND]]
    with freeze_time("2026-01-01") as frozen, boot(Planner(plan),
                                                   db=str(tmp_path / "d.db")) as host:
        result = host.run_conversation(USER, [slow_lookup, *TOOLS], "scripted", "m",
                                       payload={"transcript_session_id": "s1",
                                                "transcript_lock_ttl": 60})
        assert pending_intents(host) == []
    assert taken[0] is not None  # the lock had expired: the other run got it
    assert LEDGER == []  # the write call never ran
    assert (result.status, result.error_code) == ("error", "transcript_lock_lost")
    refused = [m.payload for m in result.messages if m.type == "tool_result"]
    assert refused[-1]["error_type"] == "intent_not_stored"


def test_a_session_aborted_at_its_limit_records_a_call_in_doubt_as_in_doubt() -> None:
    """Approved at its turn limit, the chat run started the mail and died; the person then
    declines the (old) limit question. Before, the stored result said the mail "was not
    run": it was."""
    with boot(Planner([[SEND]]), pause=True) as host:
        host.chat_sessions.create(max_turns=1, session_id="c1")
        paused = host.chat("c1", "mail ada", TOOLS)
        assert paused.pending is not None
        assert paused.pending["kind"] == "chat_turn_limit"
        CRASH["after_effect"] = True
        with pytest.raises(Crash):
            host.resume("c1", True, tools=TOOLS)
        aborted = host.resume("c1", False, tools=TOOLS)
        assert pending_intents(host, "c1") == []
    assert aborted.status == "aborted"
    assert len(LEDGER) == 1
    [told] = results(aborted)
    assert told["error_type"] == "tool_in_doubt"
    assert "may or may not have run" in told["error"]
