"""The message envelope every transcript is made of: :class:`Message`.

Plain ``{"role", "content"}`` dicts are accepted everywhere and normalized here, so the loop, the
transcript store and the providers all see one shape. Tool calls and tool results are their own
envelope types (not text the model must re-parse), which is what lets duplicate checks and
completion assertions read a transcript reliably.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents_api.errors import InvalidMessage, brief_repr
from agents_api.jsontext import compact_json

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

__all__ = ["MESSAGE_SCHEMA", "MESSAGE_TYPES", "Message", "normalize_message", "normalize_messages"]

MESSAGE_SCHEMA: Literal["agents-api.message"] = "agents-api.message"
MessageType = Literal["text", "tool_call", "tool_result", "final_result", "error"]
MESSAGE_TYPES: frozenset[str] = frozenset(get_args(MessageType))

# Keys promoted from a plain message's metadata into the envelope payload, per type.
_PAYLOAD_KEYS = {
    "tool_call": ("tool_name", "parameters", "turn"),
    "tool_result": ("tool_name", "success", "turn", "result", "error"),
}


class Message(BaseModel):
    """One transcript entry: ``{"schema", "version", "type", "role", "content", "payload",
    "metadata"}``.

    ``Message(role="user", content="hi")`` builds a text message. Constructing one with an
    unsupported ``type`` (or any other invalid field) raises :class:`InvalidMessage`, an
    ``AgentsAPIError``.
    """

    # serialize_by_alias: model_dump() gives the wire envelope, with "schema" spelled out.
    model_config = ConfigDict(defer_build=True, populate_by_name=True, extra="forbid",
                              serialize_by_alias=True)

    schema_: Literal["agents-api.message"] = Field(default=MESSAGE_SCHEMA, alias="schema")
    version: Literal[1] = 1
    type: MessageType = "text"
    # At least one character that is not whitespace (checked by pydantic-core, not in Python).
    role: str = Field(pattern=r"\S")
    content: str | list[object] = ""
    payload: dict[str, object] = Field(default_factory=dict)
    metadata: dict[str, object] = Field(default_factory=dict)

    def __init__(self, **data: object) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise InvalidMessage(_explain(exc)) from None

    @classmethod
    def model_validate(cls, obj: object, *args: Any, **kwargs: Any) -> Message:
        """Validate an envelope dict; an invalid one raises :class:`InvalidMessage`."""
        # Any: pydantic's own keyword arguments (strict, context...), passed on as they come.
        try:
            return super().model_validate(obj, *args, **kwargs)
        except ValidationError as exc:
            # The custom __init__ already explained it; do not wrap the explanation twice.
            for error in exc.errors():
                inner = error.get("ctx", {}).get("error")
                if isinstance(inner, InvalidMessage):
                    raise inner from None
            raise InvalidMessage(_explain(exc)) from None

    # -- builders used by the loop (trusted values: not validated) ------------------------
    # The loop builds two or three messages per turn from values it made itself; validating
    # them cost more than anything else it does per message. So a builder sets the instance's
    # state directly, as pydantic's model_copy does (see agents_api.results.built; a subclass
    # with fields of its own is copied from a validated template instead), always with fresh
    # dicts so nothing is shared.
    @classmethod
    def text(cls, role: str, content: str, metadata: dict[str, object] | None = None) -> Message:
        """A plain text message."""
        return _trusted(cls, "text", role, content, {},
                        metadata if metadata is not None else {})

    @classmethod
    def tool_call(
        cls, tool_name: str, parameters: object, turn: int, tool_call_id: str
    ) -> Message:
        """The assistant's request to run one tool."""
        return _trusted(cls, "tool_call", "assistant", "",
                        {"tool_name": tool_name, "parameters": parameters, "turn": turn},
                        {"tool_call_id": tool_call_id})

    @classmethod
    def tool_result(
        cls, tool_name: str, result: Mapping[str, object], turn: int, tool_call_id: str,
        content: str,
    ) -> Message:
        """The outcome of one tool call; ``content`` is what the model reads."""
        return _trusted(cls, "tool_result", "tool", content,
                        {**result, "tool_name": tool_name, "turn": turn},
                        {"tool_call_id": tool_call_id})

    def to_json(self) -> str:
        """The envelope as compact JSON: what the transcript store writes. Values JSON cannot
        hold are written as pydantic's JSON mode writes them (datetimes in ISO 8601, other
        objects as their ``str()``; see :mod:`agents_api.jsontext`)."""
        return compact_json(self.to_dict())

    def to_dict(self) -> dict[str, object]:
        """The JSON envelope, with ``schema`` spelled as on the wire."""
        return {
            "schema": MESSAGE_SCHEMA,
            "version": 1,
            "type": self.type,
            "role": self.role,
            "content": self.content,
            "payload": self.payload,
            "metadata": self.metadata,
        }


_set_state = object.__setattr__
_TRUSTED_SET = frozenset({"type", "role", "content", "payload", "metadata"})


def _trusted(cls: type[Message], kind: str, role: str, content: str,
             payload: dict[str, object], metadata: dict[str, object]) -> Message:
    """A message of the loop's own values, not validated (see the builders)."""
    if cls is not Message:
        return cls(type=kind, role=role).model_copy(update={
            "content": content, "payload": payload, "metadata": metadata})
    message = cls.__new__(cls)
    _set_state(message, "__dict__", {
        "schema_": MESSAGE_SCHEMA, "version": 1, "type": kind, "role": role,
        "content": content, "payload": payload, "metadata": metadata})
    _set_state(message, "__pydantic_fields_set__", set(_TRUSTED_SET))
    _set_state(message, "__pydantic_extra__", None)
    _set_state(message, "__pydantic_private__", None)
    return message


def _explain(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "message"
        parts.append(f"{where}: {_friendly(error)}")
    return "Invalid message: " + "; ".join(parts)


def _friendly(error: ErrorDetails) -> str:
    """pydantic's message, or ours where it reads like the schema and not like the fix."""
    loc = tuple(error["loc"])
    if loc == ("type",) and error["type"] == "literal_error":
        allowed = ", ".join(sorted(MESSAGE_TYPES))
        return f"unsupported message type {brief_repr(error['input'])}; use one of: {allowed}"
    if loc == ("role",) and error["type"] == "string_pattern_mismatch":
        return "role must be a non-empty string"
    return str(error["msg"]).removeprefix("Value error, ")


def _is_envelope(data: Mapping[str, object]) -> bool:
    if data.get("schema") == MESSAGE_SCHEMA:
        return True
    return "version" in data and "type" in data and "payload" in data


def normalize_message(item: Message | Mapping[str, object], index: int | None = None
                      ) -> Message:
    """Turn an envelope, an envelope dict or a plain ``{"role", "content"}`` dict into a Message."""
    if isinstance(item, Message):
        return item
    if type(item) is not dict and not isinstance(item, Mapping):
        raise InvalidMessage(
            f"{_where(index)} must be a dict with 'role' and 'content' or an agents_api.Message, "
            f"got {type(item).__name__}."
        )
    try:
        if _is_envelope(item):
            return Message(**dict(item))
        return _from_plain(item)
    except InvalidMessage as exc:
        raise InvalidMessage(f"{_where(index)}: {exc}") from None


def _where(index: int | None) -> str:
    return f"messages[{index}]" if index is not None else "message"


def _from_plain(item: Mapping[str, object]) -> Message:
    if type(item) is dict and len(item) == 2:
        # The common {"role", "content"} text message: nothing to promote or validate further.
        role, content = item.get("role"), item.get("content")
        if type(role) is str and role.strip() and type(content) is str:
            return Message.text(role, content)
    unknown = set(item) - {"role", "content", "metadata", "type", "payload"}
    if unknown:
        raise InvalidMessage(
            f"unexpected key(s) {', '.join(sorted(unknown))}; a plain message has 'role', "
            "'content' and optional 'metadata'."
        )
    if "role" not in item:
        raise InvalidMessage("missing 'role' (for example 'user' or 'assistant').")
    metadata = _mapping(item, "metadata")
    msg_type = item.get("type") or metadata.get("type") or "text"
    payload = _mapping(item, "payload")
    # A type that is not text is refused by the envelope below; only a known one promotes keys.
    for key in _PAYLOAD_KEYS.get(msg_type if isinstance(msg_type, str) else "", ()):
        if key in metadata and key not in payload:
            payload[key] = metadata[key]
    return Message(
        type=msg_type, role=item["role"], content=item.get("content", ""), payload=payload,
        metadata=metadata,
    )


def _mapping(item: Mapping[str, object], key: str) -> dict[str, object]:
    """A plain message's ``metadata`` or ``payload``: a dict (a copy), ``{}`` when absent.
    Anything else is refused here, naming the key, rather than half-converted by ``dict()``
    (which raises a bare ``ValueError``/``TypeError`` or turns pairs into keys)."""
    value = item.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidMessage(f"'{key}' must be a dict, got {type(value).__name__}.")
    return dict(value)


def normalize_messages(items: Iterable[Message | Mapping[str, object]]) -> list[Message]:
    """Normalize a list of messages; the error names the index of the first bad entry."""
    if type(items) is not list and (isinstance(items, str | bytes | Mapping)
                                    or not isinstance(items, Iterable)):
        raise InvalidMessage(
            "messages must be a list of {'role', 'content'} dicts or agents_api.Message "
            f"envelopes, got {type(items).__name__}."
        )
    return [normalize_message(item, i) for i, item in enumerate(items)]


def messages_as_dicts(messages: Iterable[Message]) -> list[dict[str, object]]:
    """Envelope dicts for storage or JSON output."""
    return [m.to_dict() for m in messages]


# A tiny alias so type checkers accept the literal role names users commonly pass.
Role = Literal["system", "user", "assistant", "tool"]
