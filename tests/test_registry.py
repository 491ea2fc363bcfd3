"""IterationBudgetRegistry: registration, resolution order, clamps and validation."""

from __future__ import annotations

import pytest

from datamachine import (
    BudgetSpec,
    InvalidBudgetSpec,
    InvalidBudgetValue,
    IterationBudgetRegistry,
    validate_budget_value,
)
from datamachine.host import Host


def test_register_with_config_dict_exposes_config() -> None:
    registry = IterationBudgetRegistry()
    registry.register("x", {"default": 7, "min": 2, "max": 12})
    assert registry.is_registered("x")
    config = registry.get_config("x")
    assert config is not None
    assert (config["default"], config["min"], config["max"]) == (7, 2, 12)
    assert registry.registered_names() == ["x"]


def test_register_again_overwrites() -> None:
    registry = IterationBudgetRegistry()
    registry.register(BudgetSpec(name="x", default=8, min=1, max=20))
    registry.register(BudgetSpec(name="x", default=4, min=1, max=20))
    assert registry.create("x").ceiling() == 4


def test_create_uses_default_without_override_or_setting() -> None:
    registry = IterationBudgetRegistry()
    registry.register("x", {"default": 8, "min": 1, "max": 20})
    budget = registry.create("x")
    assert (budget.ceiling(), budget.current(), budget.hard_ceiling()) == (8, 0, 20)


@pytest.mark.parametrize(("override", "expected"), [(15, 15), (999, 20), (0, 3), (-4, 3)])
def test_override_always_wins_then_is_clamped(override: int, expected: int) -> None:
    registry = IterationBudgetRegistry()
    registry.register("x", {"default": 8, "min": 3, "max": 20})
    warnings: list[str] = []
    assert registry.create("x", ceiling_override=override, warnings=warnings).ceiling() == expected
    assert bool(warnings) is (override != expected)


def test_clamp_warning_reports_requested_and_applied_ceiling() -> None:
    registry = IterationBudgetRegistry()
    registry.register("x", {"default": 8, "min": 1, "max": 20})
    warnings: list[str] = []
    registry.create("x", ceiling_override=500, warnings=warnings)
    assert warnings == ["Budget 'x': requested ceiling 500 (from override) is outside "
                        "its range [1, 20]; using 20."]


def test_create_seeds_current() -> None:
    registry = IterationBudgetRegistry()
    registry.register("x", {"default": 8, "min": 1, "max": 20})
    assert registry.create("x", 4).current() == 4


def test_unregistered_name_gives_permissive_budget() -> None:
    budget = IterationBudgetRegistry().create("nobody_registered_this")
    assert budget.ceiling() == 10
    assert budget.current() == 0
    assert not budget.exceeded()
    assert budget.hard_ceiling() == 100


def test_setting_feeds_ceiling_and_is_clamped(host: Host) -> None:
    host.settings.set("max_turns", 40)
    assert host.budgets.create("conversation_turns").ceiling() == 40
    host.settings.set("max_turns", 500)
    warnings: list[str] = []
    assert host.budgets.create("conversation_turns", warnings=warnings).ceiling() == 200
    assert "requested ceiling 500 (from setting)" in warnings[0]
    assert host.budgets.create("conversation_turns", ceiling_override=12).ceiling() == 12


def test_resolve_says_where_the_ceiling_came_from(host: Host) -> None:
    assert host.budgets.resolve("chain_depth").source == "default"
    host.settings.set("max_chain_depth", 5)
    resolved = host.budgets.resolve("chain_depth")
    assert (resolved.ceiling, resolved.source, resolved.clamped) == (5, "setting", False)
    assert host.budgets.resolve("chain_depth", 99).clamped


def test_builtin_budgets_match_the_design(host: Host) -> None:
    expected = {
        "conversation_turns": (25, 1, 200, "max_turns"),
        "chain_depth": (3, 1, 10, "max_chain_depth"),
        "tool_calls": (100, 1, 1000, "max_tool_calls"),
    }
    for name, (default, low, high, setting) in expected.items():
        spec = host.budgets.get_spec(name)
        assert spec is not None
        assert (spec.default, spec.min, spec.max, spec.setting) == (default, low, high, setting)
        assert host.budgets.owner(name) == "bootstrap"


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"default": 5, "min": -1, "max": 10}, "min"),
        ({"default": 5, "min": 0, "max": 0}, "max"),
        ({"default": 5, "min": 1, "max": 10, "scope": "galaxy"}, "scope"),
        ({"default": 5, "min": 1, "max": 10, "unit": "minutes"}, "unit"),
        ({"default": 50, "min": 1, "max": 10}, "default=50 must not be above max=10"),
        ({"default": 1, "min": 2, "max": 10}, "min=2 must not be above default=1"),
        ({"default": 5, "min": 1, "max": 10_001}, "max"),
        ({"default": "5", "min": 1, "max": 10}, "default"),
        ({"default": 5, "min": 1, "max": 10, "bogus": 1}, "bogus"),
    ],
)
def test_invalid_spec_names_the_field(config: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidBudgetSpec, match=field):
        IterationBudgetRegistry().register("x", config)


def test_invalid_budget_name_is_refused() -> None:
    with pytest.raises(InvalidBudgetSpec, match="lowercase"):
        BudgetSpec(name="Bad Name", default=1, min=1, max=2)


@pytest.mark.parametrize("value", [1, 200, 10_000])
def test_validate_budget_value_accepts_positive_integers(value: int) -> None:
    assert validate_budget_value("max_turns", value) == value


@pytest.mark.parametrize("value", [0, -1, 10_001, "ten", "10", 10.0, True, None])
def test_validate_budget_value_rejects_and_names_the_knob(value: object) -> None:
    with pytest.raises(InvalidBudgetValue, match="max_turns must be a positive integer"):
        validate_budget_value("max_turns", value)


def test_writing_a_budget_setting_is_validated(host: Host) -> None:
    with pytest.raises(InvalidBudgetValue, match="'max_turns'"):
        host.settings.set("max_turns", 0)
    with pytest.raises(InvalidBudgetValue, match="'max_turns'"):
        host.settings.set("max_turns", "ten")
    host.settings.set("max_turns", 10_000)  # above the clamp: stored, clamped at create
    assert host.settings.get("max_turns") == 10_000
    assert host.budgets.create("conversation_turns").ceiling() == 200


def test_invalid_setting_from_environment_is_reported_at_create(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATAMACHINE_MAX_TURNS", "lots")
    with pytest.raises(InvalidBudgetValue, match="setting 'max_turns'"):
        host.budgets.create("conversation_turns")


def test_a_token_or_microdollar_budget_may_reach_ten_to_the_twelfth() -> None:
    registry = IterationBudgetRegistry()
    spec = registry.register(BudgetSpec(name="prompt_tokens", unit="tokens", default=10**9,
                                        max=10**12))
    assert spec.unit == "tokens"
    assert registry.unit("prompt_tokens") == "tokens"
    assert registry.unit("unregistered") == "count"
    assert registry.create("prompt_tokens").ceiling() == 10**9
    config = registry.get_config("prompt_tokens")
    assert config is not None
    assert config["unit"] == "tokens"
    with pytest.raises(InvalidBudgetSpec, match="between 0 and 10,000 \\(unit 'count'\\)"):
        BudgetSpec(name="turns", default=20_000, max=20_000)
    with pytest.raises(InvalidBudgetSpec, match="between 1 and 1,000,000,000,000"):
        BudgetSpec(name="spend", unit="microdollars", max=10**13)
    with pytest.raises(InvalidBudgetSpec, match="unit"):
        BudgetSpec(name="spend", unit="dollars")


def test_a_metered_budgets_setting_accepts_its_units_range(host: Host) -> None:
    host.budgets.register(BudgetSpec(name="prompt_tokens", unit="tokens", default=1000,
                                     max=10**12, setting="max_prompt_tokens"))
    host.settings.set("max_prompt_tokens", 5 * 10**9)
    assert host.budgets.create("prompt_tokens").ceiling() == 5 * 10**9
    with pytest.raises(InvalidBudgetValue, match="between 1 and 1,000,000,000,000"):
        host.settings.set("max_prompt_tokens", 10**13)
    with pytest.raises(InvalidBudgetValue, match="between 1 and 10,000"):
        host.settings.set("max_turns", 20_000)
    assert validate_budget_value("x", 10**12, maximum=10**12) == 10**12
