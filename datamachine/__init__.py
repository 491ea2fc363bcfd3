"""datamachine: bounded LLM agent loops with named, pluggable budgets.

Public names are loaded lazily (PEP 562) so ``import datamachine`` stays cheap: the plugin
manager, pydantic models, the HTTP client and the web server load only when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agents_api._lazy import lazy_exports

if TYPE_CHECKING:
    from agents_api import Decision
    from datamachine.api import (
        acontinue_conversation,
        arun_conversation,
        astream_conversation,
        continue_conversation,
        run_conversation,
        stream_conversation,
    )
    from datamachine.completion import (
        CompletionAssertions,
        CompletionPolicy,
        DefaultCompletionPolicy,
        PipelineCompletionPolicy,
    )
    from datamachine.conversation.result import ConversationResult
    from datamachine.conversation.stream import StreamEvent
    from datamachine.default_host import get_default_host
    from datamachine.errors import (
        BootError,
        ChainCycle,
        ChainDepthExceeded,
        ChatSessionExists,
        ChatSessionNotFound,
        DatabaseError,
        DataMachineError,
        DuplicateBudgetError,
        DuplicateProviderError,
        DuplicateTokenName,
        DuplicateToolError,
        InvalidBudgetSpec,
        InvalidBudgetValue,
        InvalidCallerContext,
        InvalidCompletionAssertions,
        InvalidCompletionPolicy,
        InvalidJobTransition,
        InvalidScript,
        InvalidSetting,
        InvalidTokenName,
        InvalidToolDefinition,
        InvalidToolRuntimeRule,
        JobNotFound,
        PluginLoadError,
        ProviderError,
        RecordNotFound,
        RequestTooLarge,
        ScriptExhausted,
        SessionAborted,
        TranscriptNotFound,
        UnknownProvider,
        UsageError,
    )
    from datamachine.hookspecs import hookimpl
    from datamachine.providers.base import ProviderRequest, ProviderResponse
    from datamachine.registry import BudgetSpec, IterationBudgetRegistry, validate_budget_value
    from datamachine.tools import Tool, ToolContext, tool

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "PipelineCompletionPolicy": "datamachine.completion",
    "DefaultCompletionPolicy": "datamachine.completion",
    "CompletionPolicy": "datamachine.completion",
    "CompletionAssertions": "datamachine.completion",
    "InvalidCompletionPolicy": "datamachine.errors",
    "InvalidCompletionAssertions": "datamachine.errors",
    "BootError": "datamachine.errors",
    "ChainCycle": "datamachine.errors",
    "ChainDepthExceeded": "datamachine.errors",
    "ChatSessionExists": "datamachine.errors",
    "ChatSessionNotFound": "datamachine.errors",
    "DataMachineError": "datamachine.errors",
    "DatabaseError": "datamachine.errors",
    "DuplicateBudgetError": "datamachine.errors",
    "DuplicateProviderError": "datamachine.errors",
    "DuplicateTokenName": "datamachine.errors",
    "DuplicateToolError": "datamachine.errors",
    "InvalidBudgetSpec": "datamachine.errors",
    "InvalidBudgetValue": "datamachine.errors",
    "InvalidCallerContext": "datamachine.errors",
    "InvalidJobTransition": "datamachine.errors",
    "InvalidScript": "datamachine.errors",
    "InvalidSetting": "datamachine.errors",
    "InvalidTokenName": "datamachine.errors",
    "InvalidToolDefinition": "datamachine.errors",
    "InvalidToolRuntimeRule": "datamachine.errors",
    "JobNotFound": "datamachine.errors",
    "PluginLoadError": "datamachine.errors",
    "ProviderError": "datamachine.errors",
    "RecordNotFound": "datamachine.errors",
    "RequestTooLarge": "datamachine.errors",
    "ScriptExhausted": "datamachine.errors",
    "SessionAborted": "datamachine.errors",
    "TranscriptNotFound": "datamachine.errors",
    "UnknownProvider": "datamachine.errors",
    "UsageError": "datamachine.errors",
    "run_conversation": "datamachine.api",
    "arun_conversation": "datamachine.api",
    "continue_conversation": "datamachine.api",
    "acontinue_conversation": "datamachine.api",
    "stream_conversation": "datamachine.api",
    "astream_conversation": "datamachine.api",
    "StreamEvent": "datamachine.conversation.stream",
    "ConversationResult": "datamachine.conversation.result",
    "Tool": "datamachine.tools",
    "ToolContext": "datamachine.tools",
    "tool": "datamachine.tools",
    "Decision": "agents_api",
    "hookimpl": "datamachine.hookspecs",
    "BudgetSpec": "datamachine.registry",
    "IterationBudgetRegistry": "datamachine.registry",
    "validate_budget_value": "datamachine.registry",
    "ProviderRequest": "datamachine.providers.base",
    "ProviderResponse": "datamachine.providers.base",
    "get_default_host": "datamachine.default_host",
}

__all__ = [
    "BootError",
    "BudgetSpec",
    "ChainCycle",
    "ChainDepthExceeded",
    "ChatSessionExists",
    "ChatSessionNotFound",
    "CompletionAssertions",
    "CompletionPolicy",
    "ConversationResult",
    "DataMachineError",
    "DatabaseError",
    "Decision",
    "DefaultCompletionPolicy",
    "DuplicateBudgetError",
    "DuplicateProviderError",
    "DuplicateTokenName",
    "DuplicateToolError",
    "InvalidBudgetSpec",
    "InvalidBudgetValue",
    "InvalidCallerContext",
    "InvalidCompletionAssertions",
    "InvalidCompletionPolicy",
    "InvalidJobTransition",
    "InvalidScript",
    "InvalidSetting",
    "InvalidTokenName",
    "InvalidToolDefinition",
    "InvalidToolRuntimeRule",
    "IterationBudgetRegistry",
    "JobNotFound",
    "PipelineCompletionPolicy",
    "PluginLoadError",
    "ProviderError",
    "ProviderRequest",
    "ProviderResponse",
    "RecordNotFound",
    "RequestTooLarge",
    "ScriptExhausted",
    "SessionAborted",
    "StreamEvent",
    "Tool",
    "ToolContext",
    "TranscriptNotFound",
    "UnknownProvider",
    "UsageError",
    "__version__",
    "acontinue_conversation",
    "arun_conversation",
    "astream_conversation",
    "continue_conversation",
    "get_default_host",
    "hookimpl",
    "run_conversation",
    "stream_conversation",
    "tool",
    "validate_budget_value",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), __all__)
