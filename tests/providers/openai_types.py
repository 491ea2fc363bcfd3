"""Request bodies checked against the official ``openai`` package's request types.

The package describes a Chat Completions request as TypedDicts (``CompletionCreateParams...``).
pydantic validates TypedDicts, but leaves their ``Iterable[...]`` fields (``messages``,
``tools``, ``tool_calls``) as lazy generators and ignores unknown keys, so :func:`wire_problems`
walks those itself: every message by its role's type, every tool call, every tool, and every key
checked against the keys the type declares.
"""

from __future__ import annotations

from typing import Any

from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionDeveloperMessageParam,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionSystemMessageParam,
    ChatCompletionToolMessageParam,
    ChatCompletionUserMessageParam,
)
from openai.types.chat.completion_create_params import (
    CompletionCreateParamsNonStreaming,
    CompletionCreateParamsStreaming,
)
from openai.types.shared_params import FunctionDefinition
from pydantic import TypeAdapter, ValidationError

__all__ = ["wire_problems"]

_MESSAGE_TYPES: dict[str, Any] = {
    "system": ChatCompletionSystemMessageParam,
    "developer": ChatCompletionDeveloperMessageParam,
    "user": ChatCompletionUserMessageParam,
    "assistant": ChatCompletionAssistantMessageParam,
    "tool": ChatCompletionToolMessageParam,
}
_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def _keys(kind: Any) -> frozenset[str]:
    return frozenset(kind.__required_keys__) | frozenset(kind.__optional_keys__)


def _check(kind: Any, value: Any, where: str, problems: list[str]) -> bool:
    if not isinstance(value, dict):
        problems.append(f"{where}: not an object")
        return False
    unknown = sorted(set(value) - _keys(kind))
    if unknown:
        problems.append(f"{where}: keys {unknown} are not in {kind.__name__}")
    adapter = _ADAPTERS.get(kind)
    if adapter is None:
        adapter = _ADAPTERS[kind] = TypeAdapter(kind)
    try:
        adapter.validate_python(value, strict=True)
    except ValidationError as exc:
        problems.append(f"{where}: {exc.errors()[0]['loc']} {exc.errors()[0]['msg']}")
        return False
    return True


def _message(index: int, message: Any, problems: list[str]) -> None:
    where = f"messages[{index}]"
    role = message.get("role") if isinstance(message, dict) else None
    kind = _MESSAGE_TYPES.get(role) if isinstance(role, str) else None
    if kind is None:
        problems.append(f"{where}: role {role!r} is not a chat role")
        return
    if not _check(kind, message, where, problems):
        return
    if role != "tool" and message.get("content") is None and not message.get("tool_calls"):
        problems.append(f"{where}: no content")
    for number, call in enumerate(message.get("tool_calls") or []):
        call_where = f"{where}.tool_calls[{number}]"
        if _check(ChatCompletionMessageFunctionToolCallParam, call, call_where, problems):
            function = call["function"]
            unknown = sorted(set(function) - {"name", "arguments"})
            if unknown:
                problems.append(f"{call_where}.function: keys {unknown} are not allowed")


def wire_problems(body: Any) -> list[str]:
    """What in ``body`` the official request types refuse (an empty list: nothing)."""
    problems: list[str] = []
    kind = (CompletionCreateParamsStreaming if isinstance(body, dict) and body.get("stream")
            else CompletionCreateParamsNonStreaming)
    if not _check(kind, body, "body", problems):
        return problems
    for key in ("model", "messages"):
        if key not in body:
            problems.append(f"body: {key} is required")
    for index, message in enumerate(body.get("messages") or []):
        _message(index, message, problems)
    for index, tool in enumerate(body.get("tools") or []):
        where = f"tools[{index}]"
        if _check(ChatCompletionFunctionToolParam, tool, where, problems):
            _check(FunctionDefinition, tool["function"], f"{where}.function", problems)
    return problems
