"""Where a run's context window comes from, and how it is configured (DESIGN.md 21): every
bad value is refused with a message naming it, before anything runs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import datamachine
from datamachine.context.window import (
    CompactionConfig,
    answer_reserve,
    parse_compaction,
    parse_context_windows,
    window_for_model,
)
from datamachine.errors import InvalidSetting, UsageError
from datamachine.host import Host
from tests.context.windowed_server import WindowedModel, page, serving


@pytest.fixture
def model() -> Iterator[WindowedModel]:
    with serving(calls=1) as server:
        yield server


@datamachine.tool
def fetch_page(n: int) -> str:
    """Fetch page ``n``."""
    return page(n, 200)


def test_compaction_config_defaults_and_its_errors_name_the_field() -> None:
    assert parse_compaction(None, "x") == CompactionConfig()
    assert parse_compaction("auto", "x") == CompactionConfig(0.8, 3, (
        "clear_tool_results", "summarize", "drop_oldest"))
    assert parse_compaction("off", "x") is None
    assert parse_compaction({"keep_turns": 1, "strategies": ["drop_oldest"]}, "x") == \
        CompactionConfig(0.8, 1, ("drop_oldest",))
    for bad, words in [("sometimes", '"auto", "off" or an object'),
                       ({"compact_at": 2}, "x['compact_at'] must be a fraction"),
                       ({"keep_turns": -1}, "x['keep_turns'] must be a whole number"),
                       ({"strategies": ["shrink"]}, "names 'shrink'; the built-in"),
                       ({"keep": 3}, "unknown key(s) keep")]:
        with pytest.raises(UsageError) as caught:
            parse_compaction(bad, "x")
        assert words in str(caught.value)


def test_context_windows_exact_name_first_then_patterns_in_order() -> None:
    windows = parse_context_windows({"gpt-4o*": 128000, "gpt-4o-mini": 64000,
                                     "*": 8192, "llama*": 4096})
    assert window_for_model(windows, "gpt-4o-mini") == 64000
    assert window_for_model(windows, "gpt-4o-2024") == 128000
    assert window_for_model(windows, "llama3.2") == 8192  # "*" comes before "llama*"
    assert window_for_model({}, "anything") is None
    with pytest.raises(UsageError, match=r"\['m'\] must be a context window in tokens"):
        parse_context_windows({"m": 100})


def test_the_answer_reserve_is_max_tokens_else_the_setting_else_a_quarter_at_most() -> None:
    def setting(value: object) -> Any:
        return lambda key: value

    assert answer_reserve({"max_tokens": 300}, setting(2000), 8192) == 300
    assert answer_reserve({"max_completion_tokens": 400}, setting(None), 8192) == 400
    assert answer_reserve({}, setting(2000), 8192) == 2000
    assert answer_reserve({}, setting(None), 8192) == 1024
    assert answer_reserve({}, setting(None), 1024) == 256


def test_bad_settings_and_endpoints_are_refused_when_set(host: Host) -> None:
    with pytest.raises(InvalidSetting, match="context_windows"):
        host.settings.set("context_windows", {"gpt": "big"})
    with pytest.raises(InvalidSetting, match="keep_turns"):
        host.settings.set("context_compaction", {"keep_turns": "all"})
    with pytest.raises(InvalidSetting, match="context_reserve"):
        host.settings.set("context_reserve", -1)
    with pytest.raises(InvalidSetting, match="context_window"):
        host.settings.set("providers", {"local": {"type": "openai", "context_window": 12}})
    host.settings.set("providers", {"local": {"type": "openai", "context_window": "auto"}})


def test_a_bad_payload_compaction_is_refused_before_anything_runs(host: Host) -> None:
    with pytest.raises(UsageError, match=r"payload\['context_compaction'\]"):
        host.run_conversation([{"role": "user", "content": "hi"}], [], "scripted", "m",
                              payload={"context_compaction": "sometimes",
                                       "script": [{"content": "hi"}]})


def _window(host: Host, model: WindowedModel, provider: str = "openai",
            **payload: Any) -> dict[str, Any]:
    host.settings.set("openai_base_url", model.base_url)
    result = host.run_conversation([{"role": "user", "content": "read"}], [fetch_page],
                                   provider, "windowed", payload=payload)
    assert result.status == "completed", result.error
    return result.budgets.get("context_tokens", {})


def test_without_a_known_window_a_run_has_no_context_budget(host: Host,
                                                           model: WindowedModel) -> None:
    assert _window(host, model) == {}
    assert model.gets == []  # the server is not asked unless an endpoint says "auto"


def test_the_window_is_looked_for_in_order(host: Host, model: WindowedModel) -> None:
    host.settings.set("max_context_tokens", 7000)
    assert _window(host, model)["ceiling"] == 7000
    host.settings.set("context_windows", {"wind*": 6000, "windowed": 5000})
    assert _window(host, model)["ceiling"] == 5000
    host.settings.set("providers", {"local": {"type": "openai", "base_url": model.base_url,
                                              "context_window": 4000}})
    assert _window(host, model, "local")["ceiling"] == 4000
    overridden = _window(host, model, "local", budget_ceilings={"context_tokens": 3000})
    assert overridden["ceiling"] == overridden["hard_ceiling"] == 3000


def test_a_window_below_the_minimum_is_clamped_and_reported(host: Host,
                                                            model: WindowedModel) -> None:
    host.settings.set("openai_base_url", model.base_url)
    result = host.run_conversation([{"role": "user", "content": "read"}], [fetch_page],
                                   "openai", "windowed",
                                   payload={"budget_ceilings": {"context_tokens": 100}})
    assert result.budgets["context_tokens"]["ceiling"] == 256
    assert any("context_tokens" in w and "256" in w for w in result.warnings)


def test_an_auto_endpoint_asks_llama_cpp_for_its_window_once(host: Host,
                                                            model: WindowedModel) -> None:
    model.flavour, model.window = "llama.cpp", 6144
    host.settings.set("providers", {"llama": {"type": "openai", "base_url": model.base_url,
                                              "context_window": "auto"}})
    assert _window(host, model, "llama")["ceiling"] == 6144
    model.issued = 0
    assert _window(host, model, "llama")["ceiling"] == 6144
    assert model.gets == ["/props"]


def test_an_auto_endpoint_whose_server_does_not_say_has_no_window(host: Host,
                                                                 model: WindowedModel) -> None:
    host.settings.set("providers", {"other": {"type": "openai", "base_url": model.base_url,
                                              "context_window": "auto"}})
    assert _window(host, model, "other") == {}
    assert model.gets == ["/props"]
