"""Tools: definitions, the ``@tool`` decorator, the per-run executor and the tool registry.

- :class:`Tool` and :func:`tool` define what a model may call.
- :class:`ToolContext` is what a tool function sees of its run (payload, mode, turn, engine
  data, named budgets).
- :class:`ToolExecutor` is the loop's ``tool_executor``: duplicate check, runtime rules,
  argument check, then the tool; every failure is a tool result, never a crashed run.
- :class:`ToolRegistry` collects tools from plugins' ``register_tools()`` hook.

Names load on first use (PEP 562): a plugin that defines tools at boot needs ``Tool``, ``tool``
and ``ToolContext``, not the executor and its runtime-rule models, which a run loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agents_api._lazy import lazy_exports

if TYPE_CHECKING:
    from datamachine.tools.context import ToolContext
    from datamachine.tools.decorator import tool
    from datamachine.tools.definition import Tool
    from datamachine.tools.duplicates import (
        DUPLICATE_ERROR_TYPE,
        DUPLICATE_PREFIX,
        duplicate_message,
        duplicate_mode,
    )
    from datamachine.tools.executor import RUNTIME_PAYLOAD_KEYS, ToolExecutor
    from datamachine.tools.history import canonical_json
    from datamachine.tools.registry import ToolRegistry, normalize_tools
    from datamachine.tools.runtime_rules import (
        POLICY_PREFIX,
        RULE_ERROR_TYPE,
        BlockUntilToolRule,
        InspectionBudgetRule,
        RequirePriorToolRule,
        RuntimeRule,
        parse_runtime_rules,
    )

_EXPORTS: dict[str, str] = {
    "ToolContext": "datamachine.tools.context",
    "tool": "datamachine.tools.decorator",
    "Tool": "datamachine.tools.definition",
    "DUPLICATE_ERROR_TYPE": "datamachine.tools.duplicates",
    "DUPLICATE_PREFIX": "datamachine.tools.duplicates",
    "duplicate_message": "datamachine.tools.duplicates",
    "duplicate_mode": "datamachine.tools.duplicates",
    "RUNTIME_PAYLOAD_KEYS": "datamachine.tools.executor",
    "ToolExecutor": "datamachine.tools.executor",
    "canonical_json": "datamachine.tools.history",
    "ToolRegistry": "datamachine.tools.registry",
    "normalize_tools": "datamachine.tools.registry",
    "POLICY_PREFIX": "datamachine.tools.runtime_rules",
    "RULE_ERROR_TYPE": "datamachine.tools.runtime_rules",
    "BlockUntilToolRule": "datamachine.tools.runtime_rules",
    "InspectionBudgetRule": "datamachine.tools.runtime_rules",
    "RequirePriorToolRule": "datamachine.tools.runtime_rules",
    "RuntimeRule": "datamachine.tools.runtime_rules",
    "parse_runtime_rules": "datamachine.tools.runtime_rules",
}

__all__ = [
    "DUPLICATE_ERROR_TYPE",
    "DUPLICATE_PREFIX",
    "POLICY_PREFIX",
    "RULE_ERROR_TYPE",
    "RUNTIME_PAYLOAD_KEYS",
    "BlockUntilToolRule",
    "InspectionBudgetRule",
    "RequirePriorToolRule",
    "RuntimeRule",
    "Tool",
    "ToolContext",
    "ToolExecutor",
    "ToolRegistry",
    "canonical_json",
    "duplicate_message",
    "duplicate_mode",
    "normalize_tools",
    "parse_runtime_rules",
    "tool",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)
