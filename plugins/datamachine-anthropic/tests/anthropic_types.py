"""Request bodies checked against the official ``anthropic`` package's request types.

As with ``tests/providers/openai_types.py``: pydantic validates the TypedDicts but leaves
``Iterable`` fields lazy and ignores unknown keys, so messages, content blocks, tools and the
tool choice are walked here, each checked against the type its ``type`` (or role) names.
"""

from __future__ import annotations

import itertools
from typing import Any

from anthropic.types import (
    TextBlockParam,
    ToolChoiceAnyParam,
    ToolChoiceAutoParam,
    ToolChoiceNoneParam,
    ToolChoiceToolParam,
    ToolParam,
    ToolResultBlockParam,
    ToolUseBlockParam,
)
from anthropic.types.assistant_message_param import AssistantMessageParam
from anthropic.types.message_create_params import (
    MessageCreateParamsNonStreaming,
    MessageCreateParamsStreaming,
)
from anthropic.types.user_message_param import UserMessageParam
from pydantic import TypeAdapter, ValidationError

__all__ = ["messages_problems"]

_BLOCKS: dict[str, Any] = {"text": TextBlockParam, "tool_use": ToolUseBlockParam,
                           "tool_result": ToolResultBlockParam}
_MESSAGES: dict[str, Any] = {"user": UserMessageParam, "assistant": AssistantMessageParam}
_CHOICES: dict[str, Any] = {"auto": ToolChoiceAutoParam, "any": ToolChoiceAnyParam,
                            "none": ToolChoiceNoneParam, "tool": ToolChoiceToolParam}


def _check(kind: Any, value: Any, where: str, problems: list[str]) -> bool:
    if not isinstance(value, dict):
        problems.append(f"{where}: not an object")
        return False
    keys = frozenset(kind.__required_keys__) | frozenset(kind.__optional_keys__)
    unknown = sorted(set(value) - keys)
    if unknown:
        problems.append(f"{where}: keys {unknown} are not in {kind.__name__}")
    try:
        TypeAdapter(kind).validate_python(value, strict=True)
    except ValidationError as exc:
        problems.append(f"{where}: {exc.errors()[0]['loc']} {exc.errors()[0]['msg']}")
        return False
    return True


def messages_problems(body: Any) -> list[str]:
    """What in ``body`` the official Messages request types refuse (empty: nothing)."""
    problems: list[str] = []
    kind = (MessageCreateParamsStreaming if isinstance(body, dict) and body.get("stream")
            else MessageCreateParamsNonStreaming)
    if not _check(kind, body, "body", problems):
        return problems
    for key in ("model", "messages", "max_tokens"):
        if key not in body:
            problems.append(f"body: {key} is required")
    roles = [message.get("role") for message in body.get("messages", [])]
    if any(a == b for a, b in itertools.pairwise(roles)):
        problems.append(f"messages: roles do not alternate: {roles}")
    for index, message in enumerate(body.get("messages", [])):
        where = f"messages[{index}]"
        kind = _MESSAGES.get(message.get("role")) if isinstance(message, dict) else None
        if kind is None:
            problems.append(f"{where}: role must be user or assistant, got {message!r}")
            continue
        if not _check(kind, message, where, problems):
            continue
        content = message["content"]
        for number, block in enumerate([] if isinstance(content, str) else content):
            kind = _BLOCKS.get(block.get("type")) if isinstance(block, dict) else None
            if kind is None:
                problems.append(f"{where}.content[{number}]: unknown block {block!r}")
            else:
                _check(kind, block, f"{where}.content[{number}]", problems)
    for index, tool in enumerate(body.get("tools") or []):
        _check(ToolParam, tool, f"tools[{index}]", problems)
    choice = body.get("tool_choice")
    if choice is not None:
        kind = _CHOICES.get(choice.get("type")) if isinstance(choice, dict) else None
        if kind is None:
            problems.append(f"tool_choice: unknown {choice!r}")
        else:
            _check(kind, choice, "tool_choice", problems)
    return problems
