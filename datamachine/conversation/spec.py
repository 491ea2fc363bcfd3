"""A run's arguments, validated: :class:`RunSpec`.

Everything a caller passes to ``run_conversation`` is checked here, before anything runs: each
bad argument raises a :class:`~datamachine.errors.UsageError` naming it and the fix.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from agents_api import InvalidMessage, Message, normalize_messages
from agents_api.errors import brief_repr
from datamachine.conversation.inputs import check_model, check_roles, check_tools
from datamachine.conversation.payload import split_payload
from datamachine.errors import UsageError
from datamachine.modes import check_known_modes, check_modes
from datamachine.payload_keys import RuntimeOptions
from datamachine.registry import validate_budget_value
from datamachine.tools import Tool

__all__ = ["RunSpec", "normalize_tools"]


# Never changed once made; slotted, not frozen (see agents_api.records).
@dataclass(slots=True)
class RunSpec:
    """What one run was asked to do (DESIGN.md 5.1), checked."""

    messages: list[Message]
    tools: dict[str, Tool]
    provider: str
    model: str
    modes: list[str]
    payload: dict[str, Any]
    runtime: RuntimeOptions
    max_turns: int | None
    single_turn: bool

    @property
    def mode(self) -> str:
        """The run's mode label: ``chat``, or ``cluckin,chat`` for several modes."""
        return ",".join(self.modes)

    @classmethod
    def build(cls, messages: Any, tools: Any, provider: Any, model: Any, mode: Any = "pipeline",
              payload: Any = None, max_turns: Any = None, single_turn: Any = False, *,
              known_modes: Collection[str] | None = None) -> RunSpec:
        """Validate ``run_conversation``'s arguments; a UsageError names the first bad one.
        ``known_modes``: the modes the host accepts (None: any well-formed name)."""
        _check_contents(messages)
        try:
            normalized = normalize_messages(messages)
        except InvalidMessage as exc:
            raise UsageError(f"messages: {exc}") from None
        if not normalized:
            raise UsageError("messages is empty: give at least one message, such as "
                             "{'role': 'user', 'content': '...'}.")
        check_roles(normalized)
        if not isinstance(provider, str) or not provider.strip():
            raise UsageError(f"provider must be a provider name such as 'scripted', got "
                             f"{brief_repr(provider)}.")
        model = check_model(model)
        if not isinstance(single_turn, bool):
            raise UsageError(f"single_turn must be True or False, got {brief_repr(single_turn)}.")
        if max_turns is not None:
            validate_budget_value("max_turns", max_turns)
        modes = check_modes(mode)
        if known_modes is not None:
            check_known_modes(modes, known_modes)
        clean, runtime = split_payload(payload)
        checked_tools = normalize_tools(tools)
        check_tools(checked_tools)
        return cls(messages=normalized, tools=checked_tools, provider=provider, model=model,
                   modes=modes, payload=clean, runtime=runtime, max_turns=max_turns,
                   single_turn=single_turn)


def _check_contents(messages: object) -> None:
    """A plain text message names its ``content``: left out (or None), it used to become an
    empty message the model was asked to answer."""
    if not isinstance(messages, list | tuple):
        return  # normalize_messages names what a list of messages must be
    for index, item in enumerate(messages):
        if not isinstance(item, Mapping):
            continue
        metadata = item.get("metadata")
        kind = item.get("type") or (metadata.get("type") if isinstance(metadata, Mapping)
                                    else None) or "text"
        if kind == "text" and item.get("content") is None:
            raise UsageError(f"messages[{index}] has no 'content': a text message needs its "
                             "text (a string, or a list of content parts), such as "
                             "{'role': 'user', 'content': 'Hello'}.")


def normalize_tools(tools: object) -> dict[str, Tool]:
    """A run's tools as ``{name: Tool}``, from a mapping or a list; every entry checked."""
    if tools is None:
        return {}
    items: list[tuple[str | None, object]]
    if isinstance(tools, Mapping):
        items = list(tools.items())
    elif isinstance(tools, list | tuple):
        items = [(None, t) for t in tools]
    else:
        raise UsageError(
            f"tools must be a dict of name -> Tool or a list of Tool, got {type(tools).__name__}."
        )
    normalized: dict[str, Tool] = {}
    for key, candidate in items:
        if not isinstance(candidate, Tool):
            where = f"tools[{brief_repr(key)}]" if key is not None else "tools"
            raise UsageError(
                f"{where} must be a datamachine.Tool (build one with Tool(...) or "
                f"@datamachine.tool), got {type(candidate).__name__}."
            )
        if key is not None and key != candidate.name:
            raise UsageError(
                f"tools[{brief_repr(key)}] is a Tool named {brief_repr(candidate.name)}; use the "
                "same name."
            )
        if candidate.name in normalized:
            raise UsageError(f"tools lists {candidate.name!r} twice.")
        normalized[candidate.name] = candidate
    return normalized
