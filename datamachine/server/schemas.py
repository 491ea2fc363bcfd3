"""Request bodies of ``/chat``, validated with pydantic before anything runs.

Validation is strict (``"10"`` is not a turn count, ``true`` is not a number) and unknown fields
are refused, so a typo such as ``max_turn`` is an error naming it instead of a silently ignored
limit. ``max_turns`` follows the rule for every user-supplied ceiling: a positive integer no
larger than 10,000, else refused; a valid value above the budget's clamp is accepted, clamped by
the run and reported in the result's ``warnings``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from datamachine.conversation.inputs import MAX_MODEL_LENGTH, TextRole
from datamachine.errors import InvalidBudgetValue
from datamachine.modes import MODE_PATTERN
from datamachine.registry import validate_budget_value

__all__ = ["ChatMessageIn", "ChatRequest", "FieldProblem", "ResumeIn",
           "describe_validation_error"]

SESSION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$"


class ChatMessageIn(BaseModel):
    """One plain message of a ``/chat`` body."""

    model_config = ConfigDict(defer_build=True, extra="forbid", strict=True)

    role: TextRole
    content: str


def _ceiling(field: str, value: Any) -> Any:
    """A turn count in a body: None, or a positive integer <= 10,000 (a ValueError for
    pydantic, which names the field)."""
    if value is None:
        return None
    try:
        return validate_budget_value(field, value)
    except InvalidBudgetValue as exc:
        raise ValueError(str(exc)) from None


class ResumeIn(BaseModel):
    """A person's answer to a paused session (``{"approve": bool}``, DESIGN.md 16)."""

    model_config = ConfigDict(defer_build=True, extra="forbid", strict=True)

    approve: bool
    extend_by: int | None = None

    @field_validator("extend_by", mode="before")
    @classmethod
    def _check_extend_by(cls, value: Any) -> Any:
        return _ceiling("extend_by", value)


class ChatRequest(BaseModel):
    """The ``POST /chat`` body: ``messages``, ``message`` or ``resume`` (exactly one), and run
    options.

    ``session_id`` continues a stored chat session (the id a previous answer returned as
    ``transcript_session_id``); without it a new session starts. ``resume`` answers a session
    whose run paused (status ``awaiting_confirmation``) and needs ``session_id``.
    ``confirmation``: ``"pause"`` to pause where the run would ask a person (the site's
    setting ``confirmation`` otherwise). ``provider`` and ``model`` default to the site's
    settings ``default_provider`` and ``default_model``.
    """

    model_config = ConfigDict(defer_build=True, extra="forbid", strict=True)

    messages: list[ChatMessageIn] | None = Field(default=None, min_length=1, max_length=1000)
    message: str | None = Field(default=None, min_length=1)
    session_id: str | None = Field(default=None, pattern=SESSION_ID_PATTERN)
    mode: str = Field(default="chat", pattern=MODE_PATTERN)
    max_turns: int | None = None
    provider: str | None = Field(default=None, min_length=1, max_length=100)
    model: str | None = Field(default=None, max_length=MAX_MODEL_LENGTH)
    # Server-Sent Events instead of one JSON answer (also when the request accepts only
    # text/event-stream).
    stream: bool = False
    resume: ResumeIn | None = None
    confirmation: Literal["ask", "pause"] | None = None

    @field_validator("max_turns", mode="before")
    @classmethod
    def _check_max_turns(cls, value: Any) -> Any:
        return _ceiling("max_turns", value)

    @model_validator(mode="after")
    def _exactly_one_input(self) -> ChatRequest:
        given = [self.messages is not None, self.message is not None, self.resume is not None]
        if sum(given) != 1:
            raise ValueError(
                "send exactly one of 'messages' (a list of {role, content}), 'message' "
                "(a string) or 'resume' ({\"approve\": true|false}, with 'session_id')"
            )
        if self.resume is not None and self.session_id is None:
            raise ValueError("'resume' answers a paused session: send its 'session_id' too")
        return self

    def conversation_messages(self) -> list[dict[str, str]]:
        """The new messages this request adds, as plain ``{role, content}`` dicts."""
        if self.message is not None:
            return [{"role": "user", "content": self.message}]
        return [m.model_dump() for m in self.messages or []]


class FieldProblem(BaseModel):
    """One validation failure: the field (dotted path, ``body`` for the whole body) and why."""

    field: str
    message: str


def describe_validation_error(exc: ValidationError) -> tuple[bool, list[FieldProblem]]:
    """``(is_malformed_json, problems)`` for a failed ``ChatRequest.model_validate_json``."""
    problems: list[FieldProblem] = []
    malformed = False
    for error in exc.errors(include_url=False):
        if error["type"] == "json_invalid":
            malformed = True
        field = ".".join(str(part) for part in error["loc"]) or "body"
        message = str(error["msg"])
        if message.startswith("Value error, "):
            message = message[len("Value error, "):]
        problems.append(FieldProblem(field=field, message=message))
    return malformed, problems
