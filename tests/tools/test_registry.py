"""Collecting tools from plugins, and turning a run's ``tools=`` argument into a mapping."""

from __future__ import annotations

import types
from typing import Any

import pytest

from datamachine import hookimpl
from datamachine.errors import BootError, DuplicateToolError, PluginLoadError, UsageError
from datamachine.plugins import make_plugin_manager
from datamachine.tools import Tool, ToolRegistry, normalize_tools, tool


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@tool
def clock() -> str:
    """The time."""
    return "noon"


def plugin(name: str, *tools: Any) -> types.ModuleType:
    """A plugin module offering ``tools`` through register_tools()."""
    module = types.ModuleType(name)

    @hookimpl
    def register_tools() -> list[Any]:
        return list(tools)

    module.register_tools = register_tools  # type: ignore[attr-defined]
    return module


def registry_for(*plugins: types.ModuleType) -> ToolRegistry:
    pm, _ = make_plugin_manager(plugins, load_entrypoints=False, environ={})
    return ToolRegistry.from_plugin_manager(pm)


def test_tools_from_plugins_are_collected_and_tagged_with_their_plugin() -> None:
    registry = registry_for(plugin("weather_plugin", weather), plugin("clock_plugin", clock))
    # The built-in call_remote_agent tool comes from a default plugin, like any other.
    assert sorted(registry.names()) == ["call_remote_agent", "clock", "weather"]
    assert registry.owner("call_remote_agent") == "datamachine.default_plugins.remote_agent"
    assert registry.owner("weather") == "weather_plugin"
    found = registry.get("clock")
    assert found is not None
    assert found.plugin == "clock_plugin"
    assert found() == "noon"
    # The module-level tool object is not modified by tagging.
    assert clock.plugin is None
    assert "weather" in registry
    assert len(registry) == 3


def test_two_plugins_registering_one_tool_name_is_a_boot_error_naming_both() -> None:
    other_weather = tool(name="weather")(lambda city: "rain")
    with pytest.raises(DuplicateToolError) as info:
        registry_for(plugin("first_plugin", weather), plugin("second_plugin", other_weather))
    assert isinstance(info.value, BootError)
    message = str(info.value)
    assert "'weather'" in message
    assert "first_plugin" in message
    assert "second_plugin" in message


def test_a_plugin_returning_something_other_than_a_tool_fails_loudly() -> None:
    def not_a_tool() -> None:
        """Forgot the decorator."""

    with pytest.raises(PluginLoadError, match=r"'sloppy_plugin'.*must be Tool objects"):
        registry_for(plugin("sloppy_plugin", not_a_tool))


def test_register_can_replace_on_purpose() -> None:
    registry = ToolRegistry()
    registry.register(weather, plugin="a")
    fake = tool(name="weather")(lambda city: "fake")
    with pytest.raises(DuplicateToolError, match="'a' and 'b'"):
        registry.register(fake, plugin="b")
    registry.register(fake, plugin="b", replace=True)
    assert registry.owner("weather") == "b"


def test_normalize_tools_accepts_mappings_lists_functions_and_registered_names() -> None:
    registry = ToolRegistry()
    registry.register(clock, plugin="clock_plugin")

    def shout(text: str) -> str:
        """Shout."""
        return text.upper()

    tools = normalize_tools([weather, shout, "clock"], registry)
    assert list(tools) == ["weather", "shout", "clock"]
    assert isinstance(tools["shout"], Tool)
    assert tools["clock"].plugin == "clock_plugin"
    assert normalize_tools({"weather": weather}) == {"weather": weather}
    assert normalize_tools(None) == {}
    assert normalize_tools(weather) == {"weather": weather}


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        ({"forecast": weather}, r"tools\['forecast'\] is the tool named 'weather'"),
        ([weather, weather], r"tools\[1\]: a tool named 'weather' is already in the list"),
        (["nope"], r"tools\[0\]: unknown tool 'nope'\. No tools are registered\."),
        ([42], r"tools\[0\] must be a Tool"),
        ("weather", r"not a string; did you mean tools=\['weather'\]"),
        ([lambda: None], r"tools\[0\]: Tool '<lambda>'"),
    ],
)
def test_normalize_tools_errors_name_the_entry(tools: Any, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        normalize_tools(tools)
