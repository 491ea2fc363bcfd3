"""What a caller may ask a run for: message roles, a model id and tool definitions (and, in
:mod:`datamachine.modes`, mode names).

One set of rules for every entry point. ``run_conversation`` and its siblings, ``host.chat`` and
the ``/chat`` endpoint must refuse the same things: a mode such as ``"Chat!"`` or a message with
role ``"wizard"`` used to be refused over HTTP (422) and quietly rewritten or sent on by the
Python API, where the provider then failed mid-run. The rules live here, outside the web
layer, so the HTTP request models can read the same values (``modes.MODE_PATTERN``,
``TEXT_ROLES``, ``MAX_MODEL_LENGTH``) instead of a copy.

The Python API accepts more *shapes* than a ``/chat`` body can carry (several modes at once,
tool-call and tool-result envelopes, content parts); what both accept follows one rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, get_args

from agents_api import Message
from agents_api.errors import brief_repr
from datamachine.errors import InvalidToolDefinition, UsageError
from datamachine.tools import Tool
from datamachine.tools.definition import tool_problem

__all__ = ["MAX_MODEL_LENGTH", "ROLE_OF_TYPE", "TEXT_ROLES", "TextRole", "check_model",
           "check_on_text", "check_roles", "check_tools"]

# The roles of a text message (a /chat body's messages are text messages; budget pressure
# notices are text messages too).
TextRole = Literal["system", "user", "assistant"]
TEXT_ROLES: tuple[str, ...] = get_args(TextRole)
# The one role each tool envelope has (what Message.tool_call / tool_result write); every
# other type (text, final_result, error) takes one of TEXT_ROLES.
ROLE_OF_TYPE = {"tool_call": "assistant", "tool_result": "tool"}
# The longest model id (what the /chat body's ``model`` accepts).
MAX_MODEL_LENGTH = 200


def check_roles(messages: Sequence[Message]) -> None:
    """Every message's role fits its type: a text message is ``system``, ``user`` or
    ``assistant``; a ``tool_call`` envelope is ``assistant``, a ``tool_result`` is ``tool``.

    A provider has no other role (a text message as ``tool`` needs the id of the call it
    answers: that is a ``tool_result``), so a run refuses them up front, naming the index,
    instead of failing at the provider after turns were spent.
    """
    for index, message in enumerate(messages):
        role, kind = message.role, message.type
        expected = ROLE_OF_TYPE.get(kind)
        if expected is not None:
            if role != expected:
                raise UsageError(f"messages[{index}].role: a {kind} message has role "
                                 f"{expected!r}, got {brief_repr(role)}.")
        elif role not in TEXT_ROLES:
            hint = (" (a tool's answer is a tool_result envelope: type 'tool_result' with "
                    "metadata.tool_call_id)" if role == "tool" else "")
            raise UsageError(f"messages[{index}].role must be one of "
                             f"{', '.join(TEXT_ROLES)}, got {brief_repr(role)}{hint}.")


def check_model(model: object) -> str:
    """The model id: a string (``""`` for the provider's default) of at most 200 characters."""
    if model is None:
        return ""
    if not isinstance(model, str) or len(model) > MAX_MODEL_LENGTH:
        raise UsageError(f"model must be the provider's model id, a string of at most "
                         f"{MAX_MODEL_LENGTH} characters, got {brief_repr(model)}.")
    return model


def check_on_text(on_text: object) -> None:
    """``on_text`` is None or callable: checked before a chat stores its message, so a wrong
    value is refused up front rather than failing the first streamed piece and leaving the
    message stored without its answer."""
    if on_text is not None and not callable(on_text):
        raise UsageError(f"on_text must be a function taking each piece of the model's text "
                         f"(a str), or None; got {brief_repr(on_text)}.")


def check_tools(tools: Mapping[str, Tool]) -> None:
    """Every tool still fits the rules it was defined under (a provider-safe name, a
    JSON-schema object of parameters, a known runtime).

    ``Tool`` checks itself when it is built, but ``model_copy(update=...)`` and
    ``model_construct`` skip that, and its ``parameters`` dict can be changed afterwards; a run
    checks again (once per run, not per turn) so such a tool is refused before the first
    request rather than by the provider.
    """
    for key, candidate in tools.items():
        problem = tool_problem(candidate)
        if problem is not None:
            raise InvalidToolDefinition(f"tools[{key!r}]: {problem}.")
