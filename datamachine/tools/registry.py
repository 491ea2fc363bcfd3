"""The host's tools, collected from plugins: :class:`ToolRegistry`, and :func:`normalize_tools`.

Plugins offer tools through the ``register_tools()`` hook; the registry collects them once at
boot, tags each with the plugin that registered it, and refuses two plugins claiming one name
(a model can only call a name, so a silent winner would run the wrong code). ``normalize_tools``
turns what a caller passes as ``tools=`` (a mapping, a list of tools or functions, or names of
registered tools) into the name → Tool mapping a run uses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from datamachine.errors import DuplicateToolError, PluginLoadError, UsageError
from datamachine.tools.decorator import tool as make_tool
from datamachine.tools.definition import Tool

if TYPE_CHECKING:
    import pluggy

__all__ = ["ToolRegistry", "normalize_tools"]


class ToolRegistry:
    """Tools by name, each tagged with the plugin that registered it."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}

    @classmethod
    def from_plugin_manager(cls, pm: pluggy.PluginManager) -> ToolRegistry:
        """Collect every plugin's ``register_tools()`` answer (called once, at boot).

        Raises :class:`PluginLoadError` for an item that is not a Tool, and
        :class:`DuplicateToolError` naming both plugins when two claim one name.
        """
        from datamachine.plugins import collect

        registry = cls()
        for plugin_name, item in collect(pm, "register_tools"):
            if not isinstance(item, Tool):
                raise PluginLoadError(
                    f"Plugin {plugin_name!r}: register_tools() items must be Tool objects "
                    f"(decorate the function with @datamachine.tool), got {item!r}."
                )
            registry.register(item, plugin=plugin_name)
        return registry

    def register(self, tool: Tool, plugin: str | None = None, *, replace: bool = False) -> Tool:
        """Add ``tool`` (tagged with ``plugin`` when given) and return the stored copy.

        A second tool with the same name raises :class:`DuplicateToolError` unless
        ``replace=True`` (useful in tests that swap a tool for a fake).
        """
        if not isinstance(tool, Tool):
            raise UsageError(f"ToolRegistry.register() takes a Tool, got {type(tool).__name__}.")
        stored = tool.model_copy(update={"plugin": plugin}) if plugin is not None else tool
        existing = self._tools.get(tool.name)
        if existing is not None and not replace:
            first = existing.plugin or "an unnamed registration"
            second = plugin or tool.plugin or "an unnamed registration"
            raise DuplicateToolError(
                f"Tool {tool.name!r} is registered by both {first!r} and {second!r}; rename one "
                "of them (tool names are global to a host, and a model can only call a name)."
            )
        self._tools[tool.name] = stored
        return stored

    def get(self, name: str) -> Tool | None:
        """The tool called ``name``, or None."""
        return self._tools.get(name)

    def owner(self, name: str) -> str | None:
        """The plugin (pluggy name) that registered ``name``, or None."""
        found = self._tools.get(name)
        return found.plugin if found is not None else None

    def names(self) -> list[str]:
        """Registered tool names, in registration order."""
        return list(self._tools)

    def tools(self) -> dict[str, Tool]:
        """A copy of the name → Tool mapping (safe to hand to a run)."""
        return dict(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)


ToolsArgument = Mapping[str, Any] | Iterable[Any] | None


def normalize_tools(tools: ToolsArgument, registry: ToolRegistry | None = None) -> dict[str, Tool]:
    """The name → Tool mapping of one run, from what a caller passed as ``tools``.

    Accepts a mapping of name → Tool, or an iterable of Tools, plain functions (wrapped with
    ``@tool``) and names of tools in ``registry``. Raises :class:`UsageError` naming the bad
    entry: a non-tool, an unknown name, a key that differs from its tool's name, a name used twice.
    """
    if tools is None:
        return {}
    if isinstance(tools, Tool):
        tools = [tools]
    if isinstance(tools, str | bytes):
        raise UsageError(
            "tools must be a list of Tool objects (or a mapping name -> Tool), not a string; "
            f"did you mean tools=[{tools!r}]?"
        )
    if isinstance(tools, Mapping):
        result: dict[str, Tool] = {}
        for key, value in tools.items():
            item = _as_tool(value, f"tools[{key!r}]", registry)
            if item.name != key:
                raise UsageError(
                    f"tools[{key!r}] is the tool named {item.name!r}; use the tool's own name as "
                    "its key (the model calls tools by that name)."
                )
            result[key] = item
        return result
    if not isinstance(tools, Iterable):
        raise UsageError(
            f"tools must be a list of Tool objects or a mapping name -> Tool, got "
            f"{type(tools).__name__}."
        )
    result = {}
    for index, value in enumerate(tools):
        item = _as_tool(value, f"tools[{index}]", registry)
        if item.name in result:
            raise UsageError(
                f"tools[{index}]: a tool named {item.name!r} is already in the list; tool names "
                "must be unique within a run."
            )
        result[item.name] = item
    return result


def _as_tool(value: Any, where: str, registry: ToolRegistry | None) -> Tool:
    if isinstance(value, Tool):
        return value
    if isinstance(value, str):
        found = registry.get(value) if registry is not None else None
        if found is None:
            known = ", ".join(registry.names()) if registry is not None and len(registry) else ""
            hint = f" Registered tools: {known}." if known else " No tools are registered."
            raise UsageError(f"{where}: unknown tool {value!r}.{hint}")
        return found
    if callable(value):
        function: Callable[..., Any] = value
        try:
            return make_tool(function)
        except UsageError as exc:
            raise type(exc)(f"{where}: {exc}") from None
    raise UsageError(
        f"{where} must be a Tool (or a function to wrap with @datamachine.tool), got "
        f"{type(value).__name__}."
    )
