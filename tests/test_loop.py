"""agents_api.run_loop: turn sequencing, budgets at their boundaries, locks, persistence, events."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
from freezegun import freeze_time
from pydantic import ValidationError

from agents_api import (
    Decision,
    InvalidLoopArgument,
    InvalidMessage,
    IterationBudget,
    LockLost,
    LoopResult,
    Message,
    RunStop,
    StopVerdict,
    TurnResult,
    arun_loop,
    run_loop,
)
from agents_api.records import ToolRecord

USER = [{"role": "user", "content": "go"}]


def calling_runner(calls_per_turn: int = 1, answer_on: int | None = None,
                   tool: str = "double") -> Callable[[list[Message], dict[str, Any]], TurnResult]:
    """A model that calls ``tool`` every turn, and answers in text on turn ``answer_on``."""

    def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        turn = context["turn"]
        if answer_on is not None and turn >= answer_on:
            return TurnResult(content=f"done after {turn}", usage={"total_tokens": 1})
        return TurnResult(
            tool_calls=[{"id": f"c{turn}-{i}", "name": tool, "parameters": {"n": turn * 10 + i}}
                        for i in range(calls_per_turn)],
            usage={"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
        )

    return runner


def double(call: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
    return {"success": True, "result": call["parameters"]["n"] * 2}


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, payload: dict[str, Any]) -> None:
        self.seen.append((event, payload))

    def names(self) -> list[str]:
        return [name for name, _ in self.seen]


def test_natural_answer_completes_after_one_turn() -> None:
    result = run_loop(USER, lambda m, c: TurnResult(content="hello"),
                      turn_budget=IterationBudget("turns", 5))
    assert (result.status, result.completed, result.turn_count) == ("completed", True, 1)
    assert result.final_content == "hello"
    assert [m.role for m in result.messages] == ["user", "assistant"]


def test_tool_calls_run_through_executor_and_usage_is_summed() -> None:
    result = run_loop(USER, calling_runner(answer_on=3), turn_budget=IterationBudget("turns", 5),
                      tool_executor=double)
    assert result.status == "completed"
    assert result.turn_count == 3
    records = cast("list[ToolRecord]", result.tool_execution_results)
    assert [r["result"]["result"] for r in records] == [20, 40]
    assert result.usage == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 7}
    types = [m.type for m in result.messages]
    assert types == ["text", "tool_call", "tool_result", "tool_call", "tool_result", "text"]
    assert result.messages[2].content == "20"
    assert result.messages[2].metadata == {"tool_call_id": "c1-0"}


@pytest.mark.parametrize(("ceiling", "answer_on", "status", "turns"), [
    (3, 2, "completed", 2),          # N-1: finishes with a turn to spare
    (3, 3, "completed", 3),          # N: answering on the last allowed turn still completes
    (3, 4, "budget_exceeded", 3),    # N+1: would need one more turn
    (3, None, "budget_exceeded", 3),
])
def test_turn_budget_stops_at_ceiling_inclusive(
    ceiling: int, answer_on: int | None, status: str, turns: int
) -> None:
    runner_calls: list[int] = []
    inner = calling_runner(answer_on=answer_on)

    def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        runner_calls.append(context["turn"])
        return inner(messages, context)

    budget = IterationBudget("conversation_turns", ceiling)
    result = run_loop(USER, runner, turn_budget=budget, tool_executor=double)
    assert (result.status, result.turn_count) == (status, turns)
    assert runner_calls == list(range(1, turns + 1))
    if status == "budget_exceeded":
        assert result.budget == "conversation_turns"
        assert result.flags == ["max_conversation_turns_reached"]
        assert result.warning == "Maximum conversation turns (3) reached."
        assert not result.completed
    assert result.budgets["conversation_turns"]["current"] == turns


@pytest.mark.parametrize(("ceiling", "executed"), [(2, 2), (3, 3), (4, 4)])
def test_tool_call_budget_stops_after_the_ceiling_call(ceiling: int, executed: int) -> None:
    ran: list[int] = []

    def executor(call: dict[str, Any], context: dict[str, Any]) -> int:
        ran.append(call["parameters"]["n"])
        return 1

    result = run_loop(USER, calling_runner(calls_per_turn=3),
                      turn_budget=IterationBudget("turns", 50),
                      budgets=[IterationBudget("tool_calls", ceiling)], tool_executor=executor)
    assert result.status == "budget_exceeded"
    assert result.budget == "tool_calls"
    assert len(ran) == executed
    assert result.flags == ["max_tool_calls_reached"]


def test_spent_tool_budget_runs_no_tool_at_all() -> None:
    ran: list[str] = []
    result = run_loop(USER, calling_runner(), turn_budget=IterationBudget("turns", 5),
                      budgets=[IterationBudget("tool_calls", 2, 2)],
                      tool_executor=lambda c, ctx: ran.append(cast(str, c["name"])))
    assert result.status == "budget_exceeded"
    assert result.turn_count == 0
    assert ran == []


def test_per_tool_budget_stops_only_that_tool_name() -> None:
    def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        return TurnResult(tool_calls=[{"name": "other", "parameters": {}},
                                      {"name": "search", "parameters": {"q": context["turn"]}}])

    result = run_loop(USER, runner, turn_budget=IterationBudget("turns", 10),
                      budgets=[IterationBudget("tool_calls_search", 2)],
                      tool_executor=lambda c, ctx: "ok")
    assert (result.status, result.budget, result.turn_count) == (
        "budget_exceeded", "tool_calls_search", 2)
    names = [r["tool_name"] for r in result.tool_execution_results]
    assert names == ["other", "search", "other", "search"]


def test_extension_budget_spent_by_a_tool_stops_after_that_call() -> None:
    fetches = IterationBudget("http_fetches", 2)

    def executor(call: dict[str, Any], context: dict[str, Any]) -> str:
        context["budgets"]["http_fetches"].increment()
        return "page"

    result = run_loop(USER, calling_runner(calls_per_turn=3), turn_budget=IterationBudget("t", 9),
                      budgets=[fetches], tool_executor=executor)
    assert (result.status, result.budget) == ("budget_exceeded", "http_fetches")
    assert len(result.tool_execution_results) == 2
    assert result.flags == ["max_http_fetches_reached"]


def test_budget_added_mid_run_is_checked() -> None:
    def executor(call: dict[str, Any], context: dict[str, Any]) -> str:
        budgets = context["budgets"]
        budgets.setdefault("late", IterationBudget("late", 1)).increment()
        return "ok"

    result = run_loop(USER, calling_runner(), turn_budget=IterationBudget("t", 9),
                      tool_executor=executor)
    assert (result.status, result.budget, result.turn_count) == ("budget_exceeded", "late", 1)
    assert "late" in result.budgets


def test_wall_clock_budget_is_checked_before_each_turn() -> None:
    with freeze_time("2026-01-01") as frozen:
        def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
            frozen.tick(4)
            return TurnResult(tool_calls=[{"name": "double", "parameters": {"n": 1}}])

        events = Events()
        result = run_loop(USER, runner, turn_budget=IterationBudget("turns", 50),
                          budgets=[IterationBudget("wall_clock_seconds", 10)],
                          tool_executor=double, on_event=events)
    # 4 s per turn: before turn 3 the clock reads 8 s, before turn 4 it reads 12 s.
    assert (result.status, result.budget, result.turn_count) == (
        "budget_exceeded", "wall_clock_seconds", 3)
    exceeded = [p for name, p in events.seen if name == "budget_exceeded"]
    assert exceeded[0]["dimension"] == "wall_clock"
    assert exceeded[0]["current"] == 12


def test_time_rail_on_the_turn_budget_stops_the_run() -> None:
    now = [0.0]

    def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        now[0] += 5
        return TurnResult(tool_calls=[{"name": "double", "parameters": {"n": 1}}])

    budget = IterationBudget("turns", 50, max_seconds=12, clock=lambda: now[0])
    result = run_loop(USER, runner, turn_budget=budget, tool_executor=double)
    assert (result.status, result.turn_count) == ("budget_exceeded", 3)
    assert result.budgets["turns"]["rail"] == "time"


def test_runner_failure_keeps_earlier_turns_and_emits_failed() -> None:
    def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        if context["turn"] == 2:
            raise RuntimeError("provider exploded")
        return TurnResult(tool_calls=[{"name": "double", "parameters": {"n": 1}}])

    events = Events()
    result = run_loop(USER, runner, turn_budget=IterationBudget("turns", 5),
                      tool_executor=double, on_event=events)
    assert (result.status, result.completed, result.turn_count) == ("error", False, 2)
    assert result.error == "provider exploded"
    assert len(result.tool_execution_results) == 1
    assert len(result.messages) == 3
    assert events.names()[-1] == "failed"
    assert [n for n in events.names() if n in ("failed", "completed")] == ["failed"]
    terminal = events.seen[-1][1]
    assert (terminal["status"], terminal["turn"], terminal["error"]) == (
        "error", 2, "provider exploded")


def test_runner_returning_garbage_is_an_error_result() -> None:
    result = run_loop(USER, lambda m, c: 42, turn_budget=IterationBudget("turns", 5))  # type: ignore[arg-type,return-value]
    assert result.status == "error"
    assert "must return a TurnResult" in (result.error or "")


def test_runner_may_return_a_plain_dict() -> None:
    result = run_loop(USER, lambda m, c: {"content": "fine"}, turn_budget=IterationBudget("t", 2))
    assert result.final_content == "fine"


def test_tool_failures_never_end_the_run() -> None:
    def executor(call: dict[str, Any], context: dict[str, Any]) -> Any:
        if context["turn"] == 1:
            raise ValueError("bad input")
        return {"success": False, "error": "nope"}

    result = run_loop(USER, calling_runner(answer_on=3), turn_budget=IterationBudget("t", 5),
                      tool_executor=executor)
    assert result.status == "completed"
    first, second = cast("list[ToolRecord]", result.tool_execution_results)
    assert first["result"]["error_type"] == "executor_exception"
    error = first["result"]["error"]
    assert isinstance(error, str)
    assert "bad input" in error
    assert second["result"] == {"success": False, "error": "nope"}


def test_without_executor_tool_calls_get_a_readable_failure() -> None:
    result = run_loop(USER, calling_runner(answer_on=2), turn_budget=IterationBudget("t", 5))
    failed = cast("list[ToolRecord]", result.tool_execution_results)[0]["result"]
    assert failed["error_type"] == "executor_unavailable"


def test_event_sink_that_raises_never_changes_the_result() -> None:
    def sink(event: str, payload: dict[str, Any]) -> None:
        raise RuntimeError("observer bug")

    result = run_loop(USER, calling_runner(answer_on=2), turn_budget=IterationBudget("t", 5),
                      tool_executor=double, on_event=sink)
    assert result.status == "completed"


def test_every_run_ends_with_exactly_one_terminal_event() -> None:
    for runner, status in ((calling_runner(answer_on=2), "completed"),
                           (calling_runner(), "budget_exceeded")):
        events = Events()
        result = run_loop(USER, runner, turn_budget=IterationBudget("t", 3),
                          tool_executor=double, on_event=events)
        terminal = [(n, p) for n, p in events.seen if n in ("completed", "failed")]
        assert len(terminal) == 1
        name, payload = terminal[0]
        assert name == "completed"
        assert payload["status"] == status == result.status
        assert payload["budgets"]["t"]["current"] == result.turn_count


def test_event_order_for_one_tool_turn() -> None:
    events = Events()
    run_loop(USER, calling_runner(answer_on=2), turn_budget=IterationBudget("t", 3),
             tool_executor=double, on_event=events)
    assert events.names() == ["turn_started", "tool_call", "tool_result", "turn_started",
                              "completed"]


def test_should_continue_overrides_the_default_rule() -> None:
    result = run_loop(USER, calling_runner(), turn_budget=IterationBudget("t", 9),
                      tool_executor=double, should_continue=lambda r, c: cast(int, c["turn"]) < 2)
    assert (result.status, result.turn_count) == ("completed", 2)


def test_complete_flag_ends_the_run_even_with_tool_calls() -> None:
    def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        return TurnResult(tool_calls=[{"name": "double", "parameters": {"n": 1}}], complete=True)

    result = run_loop(USER, runner, turn_budget=IterationBudget("t", 9), tool_executor=double)
    assert (result.status, result.turn_count) == ("completed", 1)
    assert len(result.tool_execution_results) == 1


def test_continuation_messages_are_appended_and_keep_the_loop_going() -> None:
    def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        if context["turn"] == 1:
            return TurnResult(content="I think I'm done",
                              continuation_messages=[Message(role="user", content="keep going")])
        return TurnResult(content="now done")

    result = run_loop(USER, runner, turn_budget=IterationBudget("t", 9))
    assert [m.content for m in result.messages] == ["go", "I think I'm done", "keep going",
                                                    "now done"]


def test_on_tool_result_decision_can_complete_or_nudge() -> None:
    def policy(call: dict[str, Any], result: dict[str, Any], ctx: dict[str, Any]) -> Decision:
        if ctx["turn"] == 2:
            return Decision(complete=True)
        return Decision(complete=False, message="one more please")

    result = run_loop(USER, calling_runner(), turn_budget=IterationBudget("t", 9),
                      tool_executor=double, on_tool_result=policy)
    assert (result.status, result.turn_count) == ("completed", 2)
    assert "one more please" in [m.content for m in result.messages]


class Lock:
    def __init__(self, grant: bool = True) -> None:
        self.grant = grant
        self.acquired: list[tuple[str, int]] = []
        self.released: list[tuple[str, str]] = []
        self.renewed: list[tuple[str, str, int]] = []

    def acquire(self, session_id: str, ttl: int) -> str | None:
        self.acquired.append((session_id, ttl))
        return "tok" if self.grant else None

    def release(self, session_id: str, token: str) -> bool:
        self.released.append((session_id, token))
        return True

    def renew(self, session_id: str, token: str, ttl: int) -> bool:
        self.renewed.append((session_id, token, ttl))
        return True


class Persister:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.persisted: list[LoopResult] = []
        self.turns: list[tuple[str, int, list[str]]] = []

    def append_turn(self, session_id: str, turn: int, messages: list[Message]) -> None:
        self.turns.append((session_id, turn, [m.type for m in messages]))

    def persist(self, messages: list[Message], request: dict[str, Any], result: LoopResult) -> str:
        if self.fail:
            raise OSError("disk full")
        self.persisted.append(result)
        return "stored-" + str(request.get("provider"))


def test_lock_contention_returns_without_runner_or_persister() -> None:
    ran: list[int] = []
    persister, events = Persister(), Events()
    result = run_loop(USER, lambda m, c: ran.append(1), turn_budget=IterationBudget("t", 3),  # type: ignore[arg-type,return-value]
                      transcript_lock=Lock(grant=False), transcript_persister=persister,
                      transcript_session_id="s1", on_event=events)
    assert result.status == "transcript_lock_contention"
    assert not result.completed
    assert ran == []
    assert persister.persisted == []
    assert persister.turns == []
    assert events.names() == ["transcript_lock_contention", "completed"]
    assert events.seen[0][1] == {"session_id": "s1"}


def test_lock_is_acquired_renewed_per_turn_and_released() -> None:
    lock = Lock()
    run_loop(USER, calling_runner(answer_on=3), turn_budget=IterationBudget("t", 5),
             tool_executor=double, transcript_lock=lock, transcript_session_id="s1",
             transcript_lock_ttl=42)
    assert lock.acquired == [("s1", 42)]
    assert lock.renewed == [("s1", "tok", 42)] * 3
    assert lock.released == [("s1", "tok")]


@pytest.mark.parametrize("failure", [RuntimeError("boom"), KeyboardInterrupt()])
def test_lock_is_released_on_every_exit_path(failure: BaseException) -> None:
    lock = Lock()

    def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        raise failure

    if isinstance(failure, KeyboardInterrupt):
        with pytest.raises(KeyboardInterrupt):
            run_loop(USER, runner, turn_budget=IterationBudget("t", 5), transcript_lock=lock,
                     transcript_session_id="s1")
    else:
        run_loop(USER, runner, turn_budget=IterationBudget("t", 5), transcript_lock=lock,
                 transcript_session_id="s1")
    assert lock.released == [("s1", "tok")]


def test_persister_called_once_per_run_also_on_failure() -> None:
    persister = Persister()

    def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        if context["turn"] == 2:
            raise RuntimeError("down")
        return TurnResult(tool_calls=[{"name": "double", "parameters": {"n": 1}}])

    result = run_loop(USER, runner, turn_budget=IterationBudget("t", 5), tool_executor=double,
                      transcript_persister=persister, request={"provider": "p"})
    assert len(persister.persisted) == 1
    assert persister.persisted[0].status == "error"
    assert result.transcript_session_id == "stored-p"
    # Only the finished turn was appended; the failed one wrote nothing.
    assert [(turn, kinds) for _, turn, kinds in persister.turns] == [
        (1, ["tool_call", "tool_result"])]


def test_persister_failure_is_reported_as_a_warning() -> None:
    result = run_loop(USER, lambda m, c: TurnResult(content="x"),
                      turn_budget=IterationBudget("t", 5), transcript_persister=Persister(True))
    assert result.status == "completed"
    assert result.warnings == ["Transcript could not be stored: disk full"]


def test_session_id_is_generated_for_a_persister_without_one() -> None:
    persister = Persister()
    run_loop(USER, lambda m, c: TurnResult(content="x"), turn_budget=IterationBudget("t", 5),
             transcript_persister=persister)
    session_id, turn, kinds = persister.turns[0]
    assert len(session_id) == 32
    assert turn == 1
    assert kinds == ["text"]


def test_budget_exhausted_hook_extends_soft_ceiling_only() -> None:
    asked: list[str] = []

    def hook(budget: IterationBudget, context: dict[str, Any]) -> bool:
        asked.append(budget.name())
        budget.extend(2)
        return True

    events = Events()
    budget = IterationBudget("turns", 2, hard_ceiling=6)
    result = run_loop(USER, calling_runner(), turn_budget=budget, tool_executor=double,
                      on_budget_exhausted=hook, on_event=events)
    # 2 turns, +2, +2 reaches the hard ceiling of 6: never asked again.
    assert (result.status, result.turn_count) == ("budget_exceeded", 6)
    assert asked == ["turns", "turns"]
    assert events.names().count("budget_extended") == 2
    assert result.budgets["turns"]["rail"] == "hard_ceiling"


def test_budget_exhausted_hook_declining_stops() -> None:
    result = run_loop(USER, calling_runner(), turn_budget=IterationBudget("t", 2, hard_ceiling=9),
                      tool_executor=double, on_budget_exhausted=lambda b, c: False)
    assert (result.status, result.turn_count) == ("budget_exceeded", 2)


def test_async_runner_and_executor_under_arun_loop() -> None:
    async def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        await asyncio.sleep(0)
        if context["turn"] == 3:
            return TurnResult(content="async done")
        return TurnResult(tool_calls=[{"name": "double", "parameters": {"n": 2}}])

    async def executor(call: dict[str, Any], context: dict[str, Any]) -> int:
        await asyncio.sleep(0)
        return 4

    result = asyncio.run(arun_loop(USER, runner, turn_budget=IterationBudget("t", 5),
                                   tool_executor=executor))
    assert (result.status, result.final_content, result.turn_count) == ("completed",
                                                                        "async done", 3)


def test_sync_run_loop_accepts_an_async_runner() -> None:
    async def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        await asyncio.sleep(0)
        return TurnResult(content="ok")

    assert run_loop(USER, runner, turn_budget=IterationBudget("t", 5)).final_content == "ok"


def test_sync_run_loop_inside_running_loop_with_async_runner_says_use_arun() -> None:
    async def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        return TurnResult(content="ok")

    async def main() -> None:
        with pytest.raises(InvalidLoopArgument, match="arun_loop"):
            run_loop(USER, runner, turn_budget=IterationBudget("t", 5))

    asyncio.run(main())


def test_many_concurrent_async_runs_are_independent() -> None:
    async def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        await asyncio.sleep(0)
        return TurnResult(tool_calls=[{"name": "double", "parameters": {"n": 1}}])

    async def main() -> list[LoopResult]:
        return await asyncio.gather(*[
            arun_loop(USER, runner, turn_budget=IterationBudget("t", 3 + i % 3),
                      tool_executor=double) for i in range(30)])

    results = asyncio.run(main())
    assert [r.turn_count for r in results] == [3 + i % 3 for i in range(30)]


@pytest.mark.parametrize("messages", ["hello", [42], [{"content": "no role"}],
                                      [{"role": "user", "content": "x", "type": "weird"}]])
def test_bad_messages_are_refused_before_any_turn(messages: Any) -> None:
    ran: list[int] = []
    with pytest.raises(InvalidMessage):
        run_loop(messages, lambda m, c: ran.append(1), turn_budget=IterationBudget("t", 2))  # type: ignore[arg-type,return-value]
    assert ran == []


@pytest.mark.parametrize(("key", "value"), [("payload", "abc"), ("payload", [["a", 1]]),
                                            ("payload", [1, 2]), ("payload", True),
                                            ("metadata", ["x"]), ("metadata", "")])
def test_a_message_payload_or_metadata_that_is_not_a_dict_is_an_invalid_message(
        key: str, value: Any) -> None:
    # dict(value) used to raise a bare ValueError/TypeError, or turn [["a", 1]] into {"a": 1}.
    message = {"role": "user", "content": "x", "type": "tool_call", key: value}
    with pytest.raises(InvalidMessage, match=rf"messages\[0\]: '{key}' must be a dict"):
        run_loop([message], lambda m, c: TurnResult(), turn_budget=IterationBudget("t", 2))


def test_budget_that_starts_spent_runs_no_turn() -> None:
    result = run_loop(USER, lambda m, c: TurnResult(content="x"),
                      turn_budget=IterationBudget("t", 3, 3))
    assert (result.status, result.turn_count) == ("budget_exceeded", 0)


def test_non_budget_in_budgets_is_refused() -> None:
    with pytest.raises(InvalidLoopArgument, match="IterationBudget"):
        run_loop(USER, lambda m, c: TurnResult(), turn_budget=IterationBudget("t", 3),
                 budgets=["turns"])  # type: ignore[list-item]


def test_hung_async_provider_call_is_cut_by_the_wall_clock() -> None:
    async def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        if context["turn"] == 1:
            return TurnResult(tool_calls=[{"name": "double", "parameters": {"n": 1}}])
        await asyncio.sleep(30)  # a provider that never answers
        return TurnResult(content="too late")

    events = Events()
    # A real deadline of a few tenths of a second: the only way to show a call is cut.
    budget = IterationBudget("turns", 10, max_seconds=0.2)
    result = run_loop(USER, runner, turn_budget=budget, tool_executor=double, on_event=events)
    assert result.status == "budget_exceeded"
    assert result.budget == "turns"
    assert result.budgets["turns"]["rail"] == "time"
    assert "turn_interrupted" in events.names()
    assert len(result.tool_execution_results) == 1


def test_hung_sync_tool_is_abandoned_at_the_wall_clock() -> None:
    import threading

    release = threading.Event()

    def executor(call: dict[str, Any], context: dict[str, Any]) -> str:
        release.wait(10)  # hangs until the test lets it go
        return "late"

    try:
        result = run_loop(USER, calling_runner(), turn_budget=IterationBudget("turns", 10),
                          budgets=[IterationBudget("wall_clock_seconds", 1)],
                          tool_executor=executor)
    finally:
        release.set()
    assert result.status == "budget_exceeded"
    assert result.budget == "wall_clock_seconds"
    failed = cast("list[ToolRecord]", result.tool_execution_results)[0]["result"]
    assert failed["error_type"] == "deadline_exceeded"


def test_on_stop_verdict_is_applied_once_before_persistence() -> None:
    persister, events = Persister(), Events()
    seen: list[RunStop] = []

    def on_stop(stop: RunStop, context: dict[str, Any]) -> StopVerdict:
        seen.append(stop)
        return StopVerdict(messages=[Message.text("assistant", "summary")],
                           final_content="summary", status="incomplete",
                           warning="not done", usage={"total_tokens": 5},
                           metadata={"why": "tested"})

    result = run_loop(USER, calling_runner(), turn_budget=IterationBudget("t", 2),
                      tool_executor=double, on_stop=on_stop, transcript_persister=persister,
                      on_event=events)
    [stop] = seen
    assert (stop.status, stop.budget, stop.turn_count) == ("budget_exceeded", "t", 2)
    assert (result.status, result.completed, result.final_content, result.warning) == (
        "incomplete", False, "summary", "not done")
    # Fields the verdict left out keep the loop's.
    assert (result.budget, result.flags) == ("t", ["max_t_reached"])
    assert result.usage["total_tokens"] == 3 * 2 + 5
    assert result.metadata == {"why": "tested"}
    stored = persister.persisted[0]
    assert stored.messages[-1].content == "summary"
    assert (stored.status, stored.final_content) == ("incomplete", "summary")
    assert events.seen[-1][1]["status"] == "incomplete"
    with pytest.raises(ValidationError):
        result.status = "completed"  # type: ignore[misc]  # built once, never changed


def test_a_stop_handler_returning_something_else_is_reported_and_ignored() -> None:
    result = run_loop(USER, calling_runner(), turn_budget=IterationBudget("t", 2),
                      tool_executor=double, on_stop=lambda stop, context: "done")  # type: ignore[arg-type,return-value]
    assert result.status == "budget_exceeded"
    assert result.warnings == ["The run's stop handler returned str, not a StopVerdict; ignored."]


def test_tool_result_hook_that_raises_ends_the_run_as_an_error_keeping_the_turn() -> None:
    def policy(call: dict[str, Any], result: dict[str, Any], ctx: dict[str, Any]) -> Decision:
        raise ValueError("policy bug")

    persister, events = Persister(), Events()
    result = run_loop(USER, calling_runner(), turn_budget=IterationBudget("t", 5),
                      tool_executor=double, on_tool_result=policy,
                      transcript_persister=persister, on_event=events)
    assert (result.status, result.error, result.error_code) == (
        "error", "policy bug", "tool_result_hook_failed")
    assert result.turn_count == 1
    assert [m.type for m in result.messages] == ["text", "tool_call", "tool_result"]
    assert events.names()[-1] == "failed"
    assert persister.turns[0][1] == 1


class SpyLock(Lock):
    """A lock that can be probed from inside the persister and the stop handler."""

    def __init__(self) -> None:
        super().__init__()
        self.held = False

    def acquire(self, session_id: str, ttl: int) -> str | None:
        if self.held:
            return None
        self.held = True
        return super().acquire(session_id, ttl)

    def release(self, session_id: str, token: str) -> bool:
        self.held = False
        return super().release(session_id, token)


def test_stop_handler_and_persister_run_under_the_lock() -> None:
    lock = SpyLock()
    seen: list[tuple[str, bool]] = []

    class Probe(Persister):
        def persist(self, messages: list[Message], request: dict[str, Any],
                    result: LoopResult) -> str:
            seen.append(("persist", lock.acquire("s", 1) is None))
            return super().persist(messages, request, result)

    def on_stop(stop: RunStop, context: dict[str, Any]) -> None:
        seen.append(("on_stop", lock.acquire("s", 1) is None))

    run_loop(USER, calling_runner(), turn_budget=IterationBudget("t", 2), tool_executor=double,
             transcript_lock=lock, transcript_session_id="s", transcript_persister=Probe(),
             on_stop=on_stop)
    assert seen == [("on_stop", True), ("persist", True)]
    assert not lock.held
    # The lock is renewed before the stop handler, which may make one more provider call.
    assert len(lock.renewed) == 3


def test_failing_begin_releases_the_lock_and_reports_an_error() -> None:
    lock = SpyLock()

    class BadBegin(Persister):
        def begin(self, session_id: str, messages: list[Message], request: dict[str, Any]) -> None:
            raise OSError("disk full")

    persister, events = BadBegin(), Events()
    ran: list[int] = []
    result = run_loop(USER, lambda m, c: ran.append(1), turn_budget=IterationBudget("t", 2),  # type: ignore[arg-type,return-value]
                      transcript_lock=lock, transcript_session_id="s",
                      transcript_persister=persister, on_event=events)
    assert (result.status, result.error_code, result.error) == (
        "error", "transcript_write_failed", "disk full")
    assert ran == []
    assert not lock.held
    assert events.names() == ["failed"]
    assert persister.persisted == []  # after a failed write, nothing more is written


def test_a_turn_that_cannot_be_stored_ends_the_run_as_an_error() -> None:
    class BadAppend(Persister):
        def append_turn(self, session_id: str, turn: int, messages: list[Message]) -> None:
            if turn == 2:
                raise OSError("disk full")
            super().append_turn(session_id, turn, messages)

    persister, events = BadAppend(), Events()
    result = run_loop(USER, calling_runner(), turn_budget=IterationBudget("t", 5),
                      tool_executor=double, transcript_persister=persister, on_event=events)
    assert (result.status, result.error_code, result.turn_count) == (
        "error", "transcript_write_failed", 2)
    # Nothing more is written: what is stored stays whole turns (turn 1), with their counts.
    assert persister.persisted == []
    assert [turn for _, turn, _ in persister.turns] == [1]
    assert events.names()[-1] == "failed"


def test_a_lost_lock_stops_the_run() -> None:
    class Expiring(Lock):
        def renew(self, session_id: str, token: str, ttl: int) -> bool:
            super().renew(session_id, token, ttl)
            return len(self.renewed) < 2

    result = run_loop(USER, calling_runner(), turn_budget=IterationBudget("t", 5),
                      tool_executor=double, transcript_lock=Expiring(),
                      transcript_session_id="s")
    assert (result.status, result.error_code, result.turn_count) == (
        "error", "transcript_lock_lost", 2)


def test_a_confirmation_hook_that_raises_ends_the_run_as_an_error() -> None:
    def hook(budget: IterationBudget, context: dict[str, Any]) -> bool:
        raise RuntimeError("ui crashed")

    persister, events = Persister(), Events()
    result = run_loop(USER, calling_runner(), turn_budget=IterationBudget("t", 2, hard_ceiling=9),
                      tool_executor=double, on_budget_exhausted=hook,
                      transcript_persister=persister, on_event=events)
    assert (result.status, result.error_code, result.error) == (
        "error", "budget_hook_failed", "ui crashed")
    assert persister.persisted[0].status == "error"
    assert events.names()[-1] == "failed"


def test_a_lock_lost_at_the_final_write_is_the_runs_verdict() -> None:
    class LosesAtTheEnd(Persister):
        def persist(self, messages: list[Message], request: dict[str, Any],
                    result: LoopResult) -> str:
            raise LockLost("taken over")

    def on_stop(stop: RunStop, context: dict[str, Any]) -> StopVerdict:
        return StopVerdict(messages=[Message.text("assistant", "summary")],
                           final_content="summary", warnings=["kept"])

    result = run_loop(USER, calling_runner(), turn_budget=IterationBudget("t", 2),
                      tool_executor=double, transcript_persister=LosesAtTheEnd(),
                      on_stop=on_stop)
    assert (result.status, result.error_code, result.budget, result.flags) == (
        "error", "transcript_lock_lost", None, [])
    assert result.final_content == ""  # the summary was never stored: it is not the answer
    assert result.warnings == ["kept"]


@pytest.mark.parametrize("ttl", [0, -5, 86_401, float("inf"), 1.5, True])
def test_a_lock_ttl_outside_one_second_to_a_day_is_refused(ttl: Any) -> None:
    with pytest.raises(InvalidLoopArgument, match="transcript_lock_ttl"):
        run_loop(USER, lambda m, c: TurnResult(content="x"), turn_budget=IterationBudget("t", 2),
                 transcript_lock=Lock(), transcript_session_id="s", transcript_lock_ttl=ttl)


def test_a_writer_that_loses_its_lock_mid_run_stops_it_without_raising() -> None:
    class Writer:
        session_id = "s"

        def __init__(self) -> None:
            self.appended: list[int] = []
            self.persisted = False
            self.released = False

        def begin(self, messages: Any, request: Any) -> None:
            return None

        def append_turn(self, turn: int, messages: Any) -> None:
            if turn == 2:
                raise LockLost("taken over")
            self.appended.append(turn)

        def renew(self) -> None:
            return None

        def persist(self, messages: Any, request: Any, result: Any) -> str:
            self.persisted = True
            return "s"

        def release(self) -> bool:
            self.released = True
            return False

    writer, events = Writer(), Events()
    result = run_loop(USER, calling_runner(), turn_budget=IterationBudget("t", 5),
                      tool_executor=double, transcript_writer=writer, on_event=events)
    assert (result.status, result.error_code, result.turn_count) == (
        "error", "transcript_lock_lost", 2)
    assert writer.appended == [1]
    assert writer.persisted is False  # a run that lost its lock writes nothing more
    assert writer.released is True
    assert events.names()[-1] == "failed"


def test_a_writer_cannot_come_with_a_persister_or_a_lock() -> None:
    with pytest.raises(InvalidLoopArgument, match="transcript_writer"):
        run_loop(USER, lambda m, c: TurnResult(content="x"), turn_budget=IterationBudget("t", 2),
                 transcript_writer=object(), transcript_lock=Lock())  # type: ignore[arg-type]


BAD_ARGUMENTS = ["budgets", "context", "request", "pending_tool_calls", "tool_executor",
                 "on_event", "should_continue", "on_tool_result", "on_budget_exhausted",
                 "on_stop", "transcript_persister", "transcript_lock", "transcript_session_id"]


def arun_loop_to_the_end(*args: Any, **kwargs: Any) -> LoopResult:
    """``arun_loop`` on a new event loop, so one test can take either entry point."""
    return asyncio.run(arun_loop(*args, **kwargs))


@pytest.mark.parametrize("entry", [run_loop, arun_loop_to_the_end], ids=["run_loop", "arun_loop"])
@pytest.mark.parametrize("argument", BAD_ARGUMENTS)
def test_each_bad_argument_is_refused_by_name_before_anything_runs_or_is_stored(
        entry: Callable[..., LoopResult], argument: str) -> None:
    ran: list[int] = []
    persister = Persister()

    def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        ran.append(context["turn"])
        return TurnResult(content="x")

    # A persister on every run, so "nothing is stored" is checked too (the lock needs one).
    arguments: dict[str, Any] = {"transcript_persister": persister, argument: 5}
    with pytest.raises(InvalidLoopArgument, match=rf"^{argument} must be .+, got 5\.$"):
        entry(USER, runner, turn_budget=IterationBudget("t", 2), **arguments)
    assert (ran, persister.persisted) == ([], [])


def test_an_event_sink_may_be_an_object_with_an_emit_method() -> None:
    class Sink:
        def __init__(self) -> None:
            self.names: list[str] = []

        def emit(self, event: str, payload: dict[str, Any]) -> None:
            self.names.append(event)

    sink = Sink()
    result = run_loop(USER, lambda m, c: TurnResult(content="x"),
                      turn_budget=IterationBudget("t", 2), on_event=sink)  # type: ignore[arg-type]
    assert (result.status, sink.names[-1]) == ("completed", "completed")


def test_should_continue_that_raises_is_an_error() -> None:
    def broken(result: TurnResult, context: dict[str, Any]) -> bool:
        raise KeyError("oops")

    result = run_loop(USER, calling_runner(), turn_budget=IterationBudget("t", 5),
                      tool_executor=double, should_continue=broken)
    assert (result.status, result.error_code) == ("error", "should_continue_failed")


def test_a_runners_usage_that_cannot_be_true_is_left_out_and_warned_once(
        caplog: pytest.LogCaptureFixture) -> None:
    turns: Iterator[TurnResult | dict[str, Any]] = iter([
        TurnResult(tool_calls=[{"id": "a", "name": "t"}],
                   usage={"prompt_tokens": -3, "completion_tokens": 4, "note": "x"}),
        {"content": "done", "usage": {"prompt_tokens": float("nan"), "completion_tokens": 1}}])
    with caplog.at_level("WARNING", logger="agents_api"):
        result = run_loop(USER, lambda m, c: next(turns), turn_budget=IterationBudget("t", 5),
                          tool_executor=lambda call, context: "ok")
    # Left out means not reported: None, never a 0 that reads as "cost nothing".
    assert result.usage == {"prompt_tokens": None, "completion_tokens": 5, "total_tokens": None,
                            "note": "x"}
    warned = [r for r in caplog.records if "cannot be true" in r.getMessage()]
    assert len(warned) == 1
    assert "prompt_tokens=-3" in warned[0].getMessage()


@pytest.mark.parametrize(("usage", "kept", "ignored"), [
    ({"prompt_tokens": 12, "cost": 0.5}, {"prompt_tokens": 12, "cost": 0.5}, {}),
    ({"prompt_tokens": 12.0}, {"prompt_tokens": 12}, {}),
    ({"prompt_tokens": 1.5}, {}, {"prompt_tokens": 1.5}),
    ({"prompt_tokens": True}, {}, {"prompt_tokens": True}),
    ({"prompt_tokens": 10**12 + 1}, {}, {"prompt_tokens": 10**12 + 1}),
    ({"cost": -0.1}, {}, {"cost": -0.1}),
    ({"prompt_tokens_details": {"cached_tokens": 3}}, {}, {}),
])
def test_plausible_usage_keeps_what_can_be_true(usage: dict[str, Any], kept: dict[str, Any],
                                                ignored: dict[str, Any]) -> None:
    from agents_api.usage import plausible_usage

    assert plausible_usage(usage) == (kept, ignored)
