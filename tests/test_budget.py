"""IterationBudget: the source primitive's cases, plus the hard and time rails."""

from __future__ import annotations

import pytest
from freezegun import freeze_time

from agents_api import AgentsAPIError, IterationBudget


def test_fresh_budget_reports_name_ceiling_and_remaining() -> None:
    budget = IterationBudget("turns", 5)
    assert (budget.name(), budget.ceiling(), budget.current()) == ("turns", 5, 0)
    assert not budget.exceeded()
    assert budget.remaining() == 5


@pytest.mark.parametrize(("increments", "exceeded", "remaining"),
                         [(2, False, 1), (3, True, 0), (4, True, 0)])
def test_exceeded_is_inclusive_at_n_minus_1_n_and_n_plus_1(
    increments: int, exceeded: bool, remaining: int
) -> None:
    budget = IterationBudget("tool_calls", 3)
    for _ in range(increments):
        budget.increment()
    assert budget.current() == increments
    assert budget.exceeded() is exceeded
    assert budget.remaining() == remaining


@pytest.mark.parametrize("ceiling", [0, -5])
def test_ceiling_below_one_becomes_one(ceiling: int) -> None:
    assert IterationBudget("x", ceiling).ceiling() == 1


def test_negative_current_becomes_zero_and_current_at_ceiling_is_kept() -> None:
    assert IterationBudget("retries", 5, -3).current() == 0
    started_spent = IterationBudget("x", 3, 7)
    assert started_spent.current() == 7
    assert started_spent.exceeded()
    assert started_spent.remaining() == 0


def test_set_current_stores_zero_for_negative_values() -> None:
    budget = IterationBudget("wall_clock_seconds", 10)
    budget.set_current(3)
    assert budget.current() == 3
    budget.set_current(-10)
    assert budget.current() == 0


def test_response_flag_and_warning_name_the_budget() -> None:
    budget = IterationBudget("conversation_turns", 25)
    assert budget.to_response_flag() == "max_conversation_turns_reached"
    assert budget.to_warning() == "Maximum conversation turns (25) reached."


def test_extend_raises_soft_ceiling_but_never_past_hard_ceiling() -> None:
    budget = IterationBudget("turns", 5, 5, hard_ceiling=8)
    assert budget.extendable()
    assert budget.extend(2) == 7
    assert not budget.exceeded()
    assert budget.extend(5) == 8
    budget.set_current(8)
    assert budget.exhausted_rail() == "hard_ceiling"
    assert not budget.extendable()
    assert budget.extend(3) == 8


def test_extend_rejects_non_positive_amounts() -> None:
    budget = IterationBudget("turns", 5)
    with pytest.raises(AgentsAPIError, match="positive integer"):
        budget.extend(0)
    with pytest.raises(AgentsAPIError, match="must be an integer"):
        budget.extend(True)


def test_not_extendable_before_the_ceiling_is_spent() -> None:
    budget = IterationBudget("turns", 5, 4, hard_ceiling=10)
    assert budget.exhausted_rail() is None
    assert not budget.extendable()


def test_ceiling_above_hard_ceiling_is_refused() -> None:
    with pytest.raises(AgentsAPIError, match="hard_ceiling"):
        IterationBudget("turns", 20, hard_ceiling=10)


@pytest.mark.parametrize("bad", ["5", 5.0, None])
def test_non_integer_ceiling_is_refused(bad: object) -> None:
    with pytest.raises(AgentsAPIError, match="ceiling must be an integer"):
        IterationBudget("turns", bad)  # type: ignore[arg-type]


def test_empty_name_is_refused() -> None:
    with pytest.raises(AgentsAPIError, match="name"):
        IterationBudget("  ", 3)


def test_time_rail_spends_the_budget_when_the_clock_passes_max_seconds() -> None:
    with freeze_time("2026-01-01 00:00:00") as frozen:
        budget = IterationBudget("turns", 100, hard_ceiling=200, max_seconds=30)
        frozen.tick(29)
        assert not budget.exceeded()
        assert budget.seconds_left() == pytest.approx(1)
        frozen.tick(1)
        assert budget.exceeded()
        assert budget.exhausted_rail() == "time"
        assert not budget.extendable()


def test_time_rail_is_reported_before_hard_and_soft_ceilings() -> None:
    now = [0.0]
    budget = IterationBudget("turns", 3, 3, hard_ceiling=3, max_seconds=5, clock=lambda: now[0])
    assert budget.exhausted_rail() == "hard_ceiling"
    now[0] = 5.0
    assert budget.exhausted_rail() == "time"


def test_injected_clock_is_read_at_call_time() -> None:
    now = [100.0]
    budget = IterationBudget("x", 10, max_seconds=2, clock=lambda: now[0])
    assert budget.elapsed_seconds() == 0
    now[0] = 101.5
    assert budget.elapsed_seconds() == pytest.approx(1.5)
    assert not budget.exceeded()
    now[0] = 102.0
    assert budget.exceeded()


def test_snapshot_is_json_ready() -> None:
    budget = IterationBudget("turns", 3, 1, hard_ceiling=6)
    assert budget.snapshot() == {"current": 1, "ceiling": 3, "remaining": 2, "exceeded": False,
                                 "hard_ceiling": 6, "rail": None}
