"""agents_api.Pause: a run that stops to wait for a person, and the run that resumes it."""

from __future__ import annotations

from typing import Any

import pytest

from agents_api import (
    InvalidLoopArgument,
    IterationBudget,
    LoopResult,
    Message,
    Pause,
    RunStop,
    StopVerdict,
    TurnResult,
    arun_loop,
    run_loop,
)

USER = [{"role": "user", "content": "go"}]


class Recorder:
    """An executor that pauses on calls to ``guarded`` unless their id was approved."""

    def __init__(self, approved: set[str] | None = None) -> None:
        self.approved = approved or set()
        self.ran: list[str] = []

    def __call__(self, call: dict[str, Any], context: dict[str, Any]) -> Any:
        if call["name"] == "guarded" and call["id"] not in self.approved:
            return Pause({"kind": "tool_approval", "tool_call": dict(call)})
        self.ran.append(call["id"])
        return {"success": True, "result": f"ran {call['id']}"}


def three_calls(messages: list[Message], context: dict[str, Any]) -> TurnResult:
    if context["turn"] > 1:
        return TurnResult(content="all done")
    return TurnResult(content="working", tool_calls=[
        {"id": "a", "name": "free", "parameters": {}},
        {"id": "b", "name": "guarded", "parameters": {"x": 1}},
        {"id": "c", "name": "free", "parameters": {}}])


class Store:
    """A persister and lock in memory (the loop's plain protocols)."""

    def __init__(self) -> None:
        self.stored: dict[str, tuple[list[Message], LoopResult]] = {}
        self.held: set[str] = set()

    def acquire(self, session_id: str, ttl: int) -> str | None:
        if session_id in self.held:
            return None
        self.held.add(session_id)
        return "token"

    def release(self, session_id: str, token: str) -> bool:
        self.held.discard(session_id)
        return True

    def persist(self, messages: list[Message], request: dict[str, Any],
                result: LoopResult) -> str:
        assert result.transcript_session_id is not None
        self.stored[result.transcript_session_id] = (list(messages), result)
        return result.transcript_session_id


def test_an_executor_pause_stops_the_run_with_the_call_and_later_ones_waiting() -> None:
    executor, store, events = Recorder(), Store(), []
    result = run_loop(USER, three_calls, turn_budget=IterationBudget("turns", 5),
                      tool_executor=executor, transcript_persister=store, transcript_lock=store,
                      transcript_session_id="s1",
                      on_event=lambda event, payload: events.append((event, payload)))
    assert (result.status, result.completed) == ("awaiting_confirmation", False)
    assert executor.ran == ["a"]
    assert result.pending == {
        "kind": "tool_approval", "tool_call": {"id": "b", "name": "guarded",
                                               "parameters": {"x": 1}},
        "tool_calls": [{"id": "b", "name": "guarded", "parameters": {"x": 1}, "turn": 1},
                       {"id": "c", "name": "free", "parameters": {}, "turn": 1}]}
    # The waiting call's envelope was taken back: no call is left without its result.
    assert [(m.type, m.metadata.get("tool_call_id")) for m in result.messages] == [
        ("text", None), ("text", None), ("tool_call", "a"), ("tool_result", "a")]
    assert result.turn_count == 1
    assert store.stored["s1"][1].pending == result.pending
    assert not store.held  # a paused run holds no lock
    terminal = events[-1]
    assert terminal[0] == "completed"
    assert terminal[1]["status"] == "awaiting_confirmation"
    assert terminal[1]["pending"] == result.pending


def test_the_resumed_run_runs_the_waiting_calls_before_its_first_turn() -> None:
    first = run_loop(USER, three_calls, turn_budget=IterationBudget("turns", 5),
                     tool_executor=Recorder())
    assert first.pending is not None
    seen: list[list[str]] = []

    def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        seen.append([m.type for m in messages])
        return TurnResult(content="all done")

    executor = Recorder(approved={"b"})
    waiting = first.pending["tool_calls"]
    assert isinstance(waiting, list)
    result = run_loop(first.messages, runner, turn_budget=IterationBudget("turns", 5),
                      tool_executor=executor, pending_tool_calls=waiting)
    assert result.status == "completed"
    assert executor.ran == ["b", "c"]
    assert seen == [["text", "text", "tool_call", "tool_result", "tool_call", "tool_result",
                     "tool_call", "tool_result"]]
    assert result.turn_count == 1
    assert result.final_content == "all done"
    assert [r["tool_call_id"] for r in result.tool_execution_results] == ["b", "c"]
    # The waiting calls keep their own turn's number.
    assert result.messages[4].payload["turn"] == 1


def test_a_waiting_call_can_pause_the_resumed_run_again_before_any_turn() -> None:
    calls = [{"id": "b", "name": "guarded", "parameters": {}, "turn": 2},
             {"id": "d", "name": "guarded", "parameters": {}, "turn": 2}]

    def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        raise AssertionError("no turn may run")

    executor = Recorder(approved={"b"})
    result = run_loop(USER, runner, turn_budget=IterationBudget("turns", 5),
                      tool_executor=executor, pending_tool_calls=calls)
    assert result.status == "awaiting_confirmation"
    assert (executor.ran, result.turn_count) == (["b"], 0)
    assert result.pending is not None
    assert result.pending["tool_calls"] == [{"id": "d", "name": "guarded", "parameters": {},
                                             "turn": 2}]


def test_a_budget_hook_may_pause_instead_of_answering() -> None:
    def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        return TurnResult(tool_calls=[{"id": f"t{context['turn']}", "name": "free",
                                       "parameters": {}}])

    result = run_loop(USER, runner, turn_budget=IterationBudget("turns", 2),
                      tool_executor=Recorder(),
                      on_budget_exhausted=lambda budget, context: Pause(
                          {"kind": "budget", "budget": budget.name()}))
    assert result.status == "awaiting_confirmation"
    assert result.pending == {"kind": "budget", "budget": "turns", "tool_calls": []}
    assert result.budgets["turns"]["current"] == 2
    assert result.flags == []
    assert result.warning is None


def test_a_tool_budget_pause_keeps_the_calls_it_stopped() -> None:
    def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        return TurnResult(tool_calls=[{"id": i, "name": "free", "parameters": {}}
                                      for i in ("x", "y", "z")])

    executor = Recorder()
    result = run_loop(USER, runner, turn_budget=IterationBudget("turns", 5),
                      budgets=[IterationBudget("tool_calls", 1)], tool_executor=executor,
                      on_budget_exhausted=lambda budget, context: Pause({"kind": "budget"}))
    assert executor.ran == ["x"]
    assert result.pending is not None
    assert isinstance(result.pending["tool_calls"], list)
    assert [c["id"] for c in result.pending["tool_calls"]] == ["y", "z"]


def test_a_runner_pause_keeps_every_call_of_its_turn_waiting() -> None:
    def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        return TurnResult(content="let me check", pause={"kind": "limit"},
                          tool_calls=[{"id": "q", "name": "free", "parameters": {}}])

    executor = Recorder()
    result = run_loop(USER, runner, turn_budget=IterationBudget("turns", 5),
                      tool_executor=executor)
    assert executor.ran == []
    assert result.status == "awaiting_confirmation"
    assert result.pending == {"kind": "limit", "tool_calls": [
        {"id": "q", "name": "free", "parameters": {}, "turn": 1}]}
    assert result.last_tool_calls == [{"id": "q", "name": "free", "parameters": {}}]
    assert result.final_content == "let me check"


def test_a_stop_handler_sees_and_may_add_to_what_the_run_waits_for() -> None:
    seen: list[RunStop] = []

    def on_stop(stop: RunStop, context: dict[str, Any]) -> StopVerdict:
        seen.append(stop)
        assert stop.pending is not None
        return StopVerdict(pending={**stop.pending, "tools": ["free", "guarded"]})

    result = run_loop(USER, three_calls, turn_budget=IterationBudget("turns", 5),
                      tool_executor=Recorder(), on_stop=on_stop)
    assert seen[0].status == "awaiting_confirmation"
    assert result.pending is not None
    assert result.pending["tools"] == ["free", "guarded"]


def test_pending_is_none_unless_the_run_is_paused() -> None:
    result = run_loop(USER, lambda m, c: TurnResult(content="hi"),
                      turn_budget=IterationBudget("turns", 5))
    assert result.pending is None


def test_pause_works_the_same_in_the_async_loop() -> None:
    import asyncio

    async def executor(call: dict[str, Any], context: dict[str, Any]) -> Any:
        return Pause({"kind": "tool_approval"})

    result = asyncio.run(arun_loop(USER, three_calls, turn_budget=IterationBudget("turns", 5),
                                   tool_executor=executor))
    assert result.status == "awaiting_confirmation"
    assert result.pending is not None
    assert isinstance(result.pending["tool_calls"], list)
    assert [c["id"] for c in result.pending["tool_calls"]] == ["a", "b", "c"]


@pytest.mark.parametrize("calls", ["abc", [{"id": "x"}], [{"name": "t", "turn": -1}],
                                   {"name": "t"}])
def test_bad_pending_tool_calls_are_refused_before_anything_runs(calls: Any) -> None:
    with pytest.raises(InvalidLoopArgument, match="pending_tool_calls"):
        run_loop(USER, three_calls, turn_budget=IterationBudget("turns", 5),
                 pending_tool_calls=calls)
