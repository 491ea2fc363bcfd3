"""run_loop(estimate_request=...): a request that would pass a metered budget is never sent."""

from __future__ import annotations

from typing import Any

import pytest

from agents_api import InvalidLoopArgument, IterationBudget, Message, Pause, TurnResult, run_loop

USER = [{"role": "user", "content": "go"}]


class Metered:
    """A runner that spends ``cost`` tokens per answer (fed into ``tokens``) and calls a tool
    until ``answer_at``; the estimate asks ``estimate`` tokens for every request."""

    def __init__(self, tokens: IterationBudget, *, cost: int = 10, estimate: int = 5,
                 answer_at: int = 99) -> None:
        self.tokens, self.cost, self.estimate, self.answer_at = tokens, cost, estimate, answer_at
        self.sent: list[int] = []
        self.estimated: list[int] = []

    def estimate_request(self, messages: list[Message], context: dict[str, Any]) -> dict[str, int]:
        self.estimated.append(context["turn"])
        assert context["budgets"]["tokens"] is self.tokens
        return {"tokens": self.estimate}

    def __call__(self, messages: list[Message], context: dict[str, Any]) -> TurnResult:
        self.sent.append(context["turn"])
        self.tokens.set_current(self.tokens.current() + self.cost)
        if context["turn"] >= self.answer_at:
            return TurnResult(content="done")
        return TurnResult(content="", tool_calls=[
            {"id": f"c{context['turn']}", "name": "t", "parameters": {}}])


def executor(ran: list[str]) -> Any:
    def run(call: dict[str, Any], context: dict[str, Any]) -> Any:
        ran.append(call["id"])
        return {"success": True, "result": "ok"}
    return run


def test_a_request_that_would_pass_the_ceiling_is_not_sent() -> None:
    tokens = IterationBudget("tokens", 28)
    runner = Metered(tokens, cost=10, estimate=5)
    events: list[tuple[str, dict[str, Any]]] = []
    result = run_loop(USER, runner, turn_budget=IterationBudget("turns", 10), budgets=[tokens],
                      tool_executor=executor([]), estimate_request=runner.estimate_request,
                      on_event=lambda e, p: events.append((e, p)))
    # 10, 20 spent; the third request (20 + 5 <= 28) goes, 30 spent; the fourth is refused.
    assert runner.sent == [1, 2, 3]
    assert result.status == "budget_exceeded"
    assert result.budget == "tokens"
    assert result.flags == ["max_tokens_reached"]
    assert result.turn_count == 3  # the refused request is not a turn
    stop = next(p for e, p in events if e == "budget_exceeded")
    assert stop["budget"] == "tokens"
    assert stop["current"] == 30


def test_the_estimate_alone_stops_a_budget_not_yet_spent() -> None:
    tokens = IterationBudget("tokens", 100)
    runner = Metered(tokens, cost=10, estimate=95)
    events: list[tuple[str, dict[str, Any]]] = []
    result = run_loop(USER, runner, turn_budget=IterationBudget("turns", 10), budgets=[tokens],
                      estimate_request=runner.estimate_request,
                      on_event=lambda e, p: events.append((e, p)))
    assert runner.sent == [1]  # 0 + 95 fits; 10 + 95 does not
    assert result.status == "budget_exceeded"
    assert result.budget == "tokens"
    assert result.budgets["tokens"]["current"] == 10
    stop = next(p for e, p in events if e == "budget_exceeded")
    assert stop["needed"] == 95


def test_an_answer_that_spends_the_budget_runs_none_of_its_calls() -> None:
    tokens = IterationBudget("tokens", 10)
    runner = Metered(tokens, cost=12, estimate=1)
    ran: list[str] = []
    result = run_loop(USER, runner, turn_budget=IterationBudget("turns", 10), budgets=[tokens],
                      tool_executor=executor(ran), estimate_request=runner.estimate_request)
    assert runner.sent == [1]
    assert ran == []
    assert result.status == "budget_exceeded"
    assert result.budget == "tokens"
    assert result.turn_count == 1


def test_without_an_estimate_the_answer_s_calls_run_as_before() -> None:
    tokens = IterationBudget("tokens", 10)
    runner = Metered(tokens, cost=12)
    ran: list[str] = []
    result = run_loop(USER, runner, turn_budget=IterationBudget("turns", 10), budgets=[tokens],
                      tool_executor=executor(ran))
    assert ran == ["c1"]  # checked after each call, as every budget is
    assert result.budget == "tokens"


def test_a_final_answer_past_the_ceiling_still_completes() -> None:
    tokens = IterationBudget("tokens", 10)
    runner = Metered(tokens, cost=12, answer_at=1)
    result = run_loop(USER, runner, turn_budget=IterationBudget("turns", 10), budgets=[tokens],
                      estimate_request=runner.estimate_request)
    assert result.status == "completed"
    assert result.final_content == "done"
    assert result.budgets["tokens"]["current"] == 12


def test_an_extension_that_makes_room_lets_the_request_go() -> None:
    tokens = IterationBudget("tokens", 20)
    runner = Metered(tokens, cost=10, estimate=5, answer_at=3)
    asked: list[tuple[str, int, int]] = []

    def extend(budget: IterationBudget, context: dict[str, Any]) -> bool:
        asked.append((budget.name(), budget.current(), budget.ceiling()))
        budget.extend(20)
        return True

    result = run_loop(USER, runner, turn_budget=IterationBudget("turns", 10), budgets=[tokens],
                      tool_executor=executor([]), estimate_request=runner.estimate_request,
                      on_budget_exhausted=extend)
    # After two answers (20 spent) the budget is spent: extended before the third request.
    assert asked == [("tokens", 20, 20)]
    assert result.status == "completed"
    assert runner.sent == [1, 2, 3]


def test_an_extension_too_small_stops_the_run_asked_once() -> None:
    tokens = IterationBudget("tokens", 100)
    runner = Metered(tokens, cost=10, estimate=95)
    asked: list[int] = []

    def extend(budget: IterationBudget, context: dict[str, Any]) -> bool:
        asked.append(budget.ceiling())
        budget.extend(1)
        return True

    result = run_loop(USER, runner, turn_budget=IterationBudget("turns", 10), budgets=[tokens],
                      tool_executor=executor([]), estimate_request=runner.estimate_request,
                      on_budget_exhausted=extend)
    assert asked == [100]
    assert runner.sent == [1]
    assert result.status == "budget_exceeded"


def test_a_request_past_the_hard_ceiling_is_never_offered() -> None:
    tokens = IterationBudget("tokens", 50, hard_ceiling=100)
    runner = Metered(tokens, cost=10, estimate=105)
    asked: list[int] = []

    def extend(budget: IterationBudget, context: dict[str, Any]) -> bool:
        asked.append(1)
        return False

    result = run_loop(USER, runner, turn_budget=IterationBudget("turns", 10), budgets=[tokens],
                      estimate_request=runner.estimate_request, on_budget_exhausted=extend)
    assert asked == []
    assert runner.sent == []
    assert result.status == "budget_exceeded"
    assert result.turn_count == 0


def test_a_pause_for_a_refused_request_waits_for_a_person() -> None:
    tokens = IterationBudget("tokens", 100)
    runner = Metered(tokens, cost=10, estimate=95)
    result = run_loop(USER, runner, turn_budget=IterationBudget("turns", 10), budgets=[tokens],
                      tool_executor=executor([]), estimate_request=runner.estimate_request,
                      on_budget_exhausted=lambda b, c: Pause({"kind": "budget",
                                                              "budget": b.name()}))
    assert result.status == "awaiting_confirmation"
    assert result.pending is not None
    assert result.pending["budget"] == "tokens"


def test_a_failing_estimate_ends_the_run_as_an_error() -> None:
    def broken(messages: list[Message], context: dict[str, Any]) -> dict[str, int]:
        raise RuntimeError("meter down")

    result = run_loop(USER, lambda m, c: TurnResult(content="x"),
                      turn_budget=IterationBudget("turns", 10), estimate_request=broken)
    assert result.status == "error"
    assert result.error_code == "request_estimate_failed"
    assert "meter down" in (result.error or "")


@pytest.mark.parametrize(("needed", "words"), [({"nope": 1}, "not a budget"),
                                           ({"turns": -1}, "non-negative integer")])
def test_a_bad_estimate_names_what_is_wrong(needed: dict[str, int], words: str) -> None:
    result = run_loop(USER, lambda m, c: TurnResult(content="x"),
                      turn_budget=IterationBudget("turns", 10),
                      estimate_request=lambda m, c: needed)
    assert result.status == "error"
    assert words in (result.error or "")


def test_estimate_request_must_be_callable() -> None:
    with pytest.raises(InvalidLoopArgument, match="estimate_request"):
        run_loop(USER, lambda m, c: TurnResult(content="x"),
                 turn_budget=IterationBudget("turns", 10),
                 estimate_request="no")  # type: ignore[arg-type]


def test_an_extension_granted_after_the_answer_runs_its_waiting_calls_once() -> None:
    tokens = IterationBudget("tokens", 10)
    runner = Metered(tokens, cost=12, estimate=1, answer_at=2)
    ran: list[str] = []

    def extend(budget: IterationBudget, context: dict[str, Any]) -> bool:
        budget.extend(100)
        return True

    result = run_loop(USER, runner, turn_budget=IterationBudget("turns", 10), budgets=[tokens],
                      tool_executor=executor(ran), estimate_request=runner.estimate_request,
                      on_budget_exhausted=extend)
    assert ran == ["c1"]  # the first answer's call ran after the extension, in its own turn
    assert runner.sent == [1, 2]  # and the first request was not sent again
    assert result.status == "completed"
    assert len([m for m in result.messages if m.type == "tool_call"]) == 1


def test_an_extension_granted_mid_turn_runs_the_rest_of_the_turn_s_calls() -> None:
    calls_budget = IterationBudget("tool_calls", 1)
    ran: list[str] = []

    def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        if context["turn"] > 1:
            return TurnResult(content="done")
        return TurnResult(tool_calls=[{"id": "a", "name": "t", "parameters": {}},
                                      {"id": "b", "name": "t", "parameters": {}}])

    def extend(budget: IterationBudget, context: dict[str, Any]) -> bool:
        budget.extend(5)
        return True

    result = run_loop(USER, runner, turn_budget=IterationBudget("turns", 10),
                      budgets=[calls_budget], tool_executor=executor(ran),
                      on_budget_exhausted=extend)
    assert ran == ["a", "b"]
    assert result.status == "completed"


# -- BudgetSpent: a hook that cannot make the request fit --------------------------------------
def test_a_turn_runner_that_raises_budget_spent_stops_the_run_without_a_turn() -> None:
    from agents_api import BudgetSpent

    window = IterationBudget("window", 100, hard_ceiling=100)
    sent: list[int] = []

    def runner(messages: list[Message], context: dict[str, Any]) -> TurnResult:
        if context["turn"] == 3:
            raise BudgetSpent(window, "the request does not fit")
        sent.append(context["turn"])
        return TurnResult(content="", tool_calls=[{"id": f"c{context['turn']}", "name": "t",
                                                    "parameters": {}}])

    events: list[tuple[str, dict[str, Any]]] = []
    result = run_loop(USER, runner, turn_budget=IterationBudget("turns", 10),
                      tool_executor=executor([]), on_event=lambda e, p: events.append((e, p)))
    assert sent == [1, 2]
    assert result.status == "budget_exceeded"
    assert result.budget == "window"  # a budget the run did not have joins its budgets
    assert result.flags == ["max_window_reached"]
    assert result.turn_count == 2
    assert result.budgets["turns"]["current"] == 2
    assert "window" in result.budgets
    assert [p["budget"] for e, p in events if e == "budget_exceeded"] == ["window"]


def test_an_async_estimate_may_shrink_the_request_or_raise_budget_spent() -> None:
    import asyncio

    from agents_api import BudgetSpent, arun_loop

    window = IterationBudget("window", 100)
    estimated: list[int] = []

    async def estimate(messages: list[Message], context: dict[str, Any]) -> dict[str, int]:
        await asyncio.sleep(0)  # a summary call to a model, say
        estimated.append(context["turn"])
        if context["turn"] == 2:
            raise BudgetSpent(window)
        return {}

    runner = Metered(IterationBudget("tokens", 10**6))
    result = asyncio.run(arun_loop(USER, runner, turn_budget=IterationBudget("turns", 10),
                                   budgets=[window], tool_executor=executor([]),
                                   estimate_request=estimate))
    assert estimated == [1, 2]
    assert runner.sent == [1]
    assert result.status == "budget_exceeded"
    assert result.budget == "window"
    assert result.turn_count == 1
