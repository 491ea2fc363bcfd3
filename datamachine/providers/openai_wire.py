"""The Chat Completions wire format: the request body sent and the answer parsed.

Split from :mod:`datamachine.providers.openai` because its pydantic models are only needed once
a request is made: a host registers the ``openai`` provider at boot, and most hosts never send
it anything. ``openai`` re-exports both public functions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents_api.jsontext import compact_json
from datamachine.errors import ProviderError, first_field_error
from datamachine.providers.base import ProviderRequest, ProviderResponse
from datamachine.providers.chat_messages import ChatMessage
from datamachine.providers.normalize import normalize_response
from datamachine.providers.options import RESERVED_KEYS, without_tool_options
from datamachine.providers.wire_provider import bad_request as _bad_request
from datamachine.providers.wire_provider import stream_broken

__all__ = ["ChatStreamAssembler", "build_chat_body", "parse_chat_completion"]


# -- request ---------------------------------------------------------------------------------

class _ToolSpec(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="ignore")

    name: str = Field(min_length=1)
    description: str = ""
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}})


def _first_error(exc: ValidationError) -> str:
    where, message, _ = first_field_error(exc)
    return f"{where}: {message}" if where else message


def _wire_message(message: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.name:
        out["name"] = message.name
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": call.id, "type": "function",
             "function": {"name": call.name,
                          "arguments": compact_json(call.parameters)}}
            for call in message.tool_calls
        ]
    if out["content"] is None:
        # Never null, even on an assistant message that only calls tools: OpenAI accepts ""
        # there, and llama.cpp's server (and other strict ones) answer 500 to a null.
        out["content"] = ""
    if message.role == "tool":
        out["tool_call_id"] = message.tool_call_id
    return out


_PLAIN_KEYS = frozenset({"role", "content", "tool_calls", "tool_call_id", "name"})


def _plain_wire_message(raw: Any) -> dict[str, Any] | None:
    """The wire form of a message already in the documented shape, without building a model;
    None for anything else (which then goes through ChatMessage and its error messages).

    The history is re-sent on every turn, so validating each message as a model made a run's
    request building grow with the square of its turns; a run's own messages always have
    this shape.
    """
    if type(raw) is not dict or not _PLAIN_KEYS.issuperset(raw):
        return None
    role, content = raw.get("role"), raw.get("content")
    if type(role) is not str or not role or (content is not None and type(content) is not str):
        return None
    out: dict[str, Any] = {"role": role, "content": content or ""}
    calls = raw.get("tool_calls")
    if calls:
        if type(calls) is not list:
            return None
        wire_calls = []
        for call in calls:
            if (type(call) is not dict or type(call.get("id")) is not str or not call["id"]
                    or type(call.get("name")) is not str or not call["name"]
                    or type(call.get("parameters")) is not dict or "function" in call):
                return None
            wire_calls.append({"id": call["id"], "type": "function",
                               "function": {"name": call["name"],
                                            "arguments": compact_json(call["parameters"])}})
        out["tool_calls"] = wire_calls
    name = raw.get("name")
    if name:
        if type(name) is not str:
            return None
        out["name"] = name
    if role == "tool":
        call_id = raw.get("tool_call_id")
        if type(call_id) is not str or not call_id:
            return None
        out["tool_call_id"] = call_id
    return out


def build_chat_body(
    request: ProviderRequest, *, provider: str = "openai",
    defaults: Mapping[str, Any] | None = None, stream: bool = False,
) -> dict[str, Any]:
    """The JSON body of ``POST /chat/completions`` for ``request``.

    Options: ``defaults`` (the provider's own, an endpoint's ``model_options``) under
    ``request.options``; they never replace ``model``, ``messages``, ``tools`` or ``stream``,
    and tool options (``tool_choice``...) go out only with tools. Raises ProviderError
    (``provider_bad_request``) naming the message or tool that has the wrong shape.
    """
    messages = []
    for index, raw in enumerate(request.messages):
        plain = _plain_wire_message(raw)
        if plain is not None:
            messages.append(plain)
            continue
        try:
            messages.append(_wire_message(ChatMessage.model_validate(raw)))
        except ValidationError as exc:
            raise _bad_request(provider, f"Cannot send messages[{index}] to the {provider} "
                                         f"provider: {_first_error(exc)}.") from None
    tools = []
    for index, tool in enumerate(request.tools):
        if isinstance(tool, Mapping) and isinstance(tool.get("function"), Mapping):
            tools.append(dict(tool))  # already in wire form
            continue
        try:
            spec = _ToolSpec.model_validate(tool)
        except ValidationError as exc:
            raise _bad_request(provider, f"Cannot send tools[{index}] to the {provider} "
                                         f"provider: {_first_error(exc)}.") from None
        tools.append({"type": "function", "function": spec.model_dump()})
    options = {**(defaults or {}), **request.options}
    body: dict[str, Any] = (options if tools else without_tool_options(options))
    for key in RESERVED_KEYS:
        body.pop(key, None)
    body.update({"model": request.model, "messages": messages, "stream": stream})
    if stream:
        # The usage arrives in a last chunk of its own (OpenAI, vLLM, llama.cpp, LLMock).
        body["stream_options"] = {"include_usage": True}
    if tools:
        body["tools"] = tools
    return body


# -- response --------------------------------------------------------------------------------

class _WireFunction(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="ignore")

    name: str = Field(min_length=1)
    arguments: Any = None


class _WireToolCall(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="ignore")

    id: str | None = None
    function: _WireFunction


class _WireMessage(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="ignore")

    content: str | None = None
    refusal: str | None = None
    tool_calls: list[_WireToolCall] | None = None


class _WireChoice(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="ignore")

    message: _WireMessage
    finish_reason: str | None = None


class _WireCompletion(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="ignore")

    choices: list[_WireChoice] = Field(min_length=1)
    usage: dict[str, Any] | None = None


def _arguments(call: _WireToolCall) -> Any:
    # Arguments that do not decode to an object are passed on as the model wrote them (as
    # text): the tool executor turns the call into an invalid_arguments result the model can
    # correct, instead of one bad call ending the run.
    raw = call.function.arguments
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        return compact_json(raw)
    try:
        decoded = json.loads(raw)
    except ValueError:
        return raw
    return decoded if isinstance(decoded, dict) else raw


def parse_chat_completion(
    data: Any, *, provider: str = "openai", turn: int = 1
) -> ProviderResponse:
    """A normalized ProviderResponse from a decoded Chat Completions body.

    Anything that is not a chat completion (an error object, missing ``choices``, wrong types)
    raises ProviderError ``provider_bad_response``. Tool arguments that are not a JSON object
    are not an error here: the call keeps them as text (see :mod:`datamachine.tools.arguments`).
    """
    if not isinstance(data, dict):
        raise ProviderError(
            f"The {provider} provider answered JSON {type(data).__name__}, not a chat "
            "completion object.", code="provider_bad_response", provider=provider)
    if "choices" not in data and data.get("error"):
        error = data["error"]
        detail = error.get("message") if isinstance(error, dict) else error
        raise ProviderError(
            f"The {provider} provider answered an error instead of a completion: {detail}",
            code="provider_bad_response", provider=provider)
    try:
        completion = _WireCompletion.model_validate(data)
    except ValidationError as exc:
        raise ProviderError(
            f"The {provider} provider's answer is not a chat completion "
            f"({_first_error(exc)}).", code="provider_bad_response", provider=provider,
        ) from None
    choice = completion.choices[0]
    calls = [{"id": call.id, "name": call.function.name,
              "parameters": _arguments(call)}
             for call in choice.message.tool_calls or []]
    content = choice.message.content or choice.message.refusal or ""
    return normalize_response(
        {"content": content, "tool_calls": calls, "usage": completion.usage,
         "finish_reason": choice.finish_reason, "raw": data},
        provider=provider, turn=turn,
    )


# -- streamed response -----------------------------------------------------------------------

def _name_so_far(had: str, piece: str) -> str:
    """A streamed tool call's name after one more chunk: servers that repeat the whole name in
    every chunk (llama-cpp-python) or send it growing give it whole; a fragment is added."""
    if not had or piece.startswith(had):
        return piece
    return had + piece


class ChatStreamAssembler:
    """Puts a streamed Chat Completions answer back together, chunk by chunk.

    :meth:`feed` takes one decoded ``chat.completion.chunk`` and returns its text delta. Tool
    calls arrive in pieces keyed by their ``index``, the arguments in fragments; OpenAI sends
    the id and name once, llama-cpp-python's server repeats the whole name and id in every
    chunk (recorded in tests/providers/recordings/), and both give one call named once.
    :meth:`response` assembles them and parses the whole answer exactly as a non-streamed one
    is parsed, so both paths give the same ProviderResponse.
    """

    def __init__(self, provider: str = "openai", turn: int = 1) -> None:
        self.provider = provider
        self.turn = turn
        self._text: list[str] = []
        self._refusal: list[str] = []
        self._calls: dict[int, dict[str, str]] = {}
        self._finish: str | None = None
        self._usage: Any = None
        self._done = False

    @property
    def text(self) -> str:
        """The text so far."""
        return "".join(self._text)

    @property
    def finished(self) -> bool:
        """A finish reason has arrived."""
        return self._finish is not None

    @property
    def done(self) -> bool:
        """``data: [DONE]`` has arrived."""
        return self._done

    @property
    def unfinished(self) -> str | None:
        """Why the answer is not whole (neither ``[DONE]`` nor a finish reason), or None."""
        if self._done or self.finished:
            return None
        return "the stream ended before the answer did (no finish reason, no [DONE])"

    def feed_data(self, data: str) -> str:
        """One SSE ``data:`` (a JSON chunk, or ``[DONE]``); its text delta."""
        if data == "[DONE]":
            self._done = True
            return ""
        return self.feed(json.loads(data))

    def feed(self, chunk: Any) -> str:
        """The text delta of ``chunk`` (possibly empty); ProviderError for an error chunk."""
        if not isinstance(chunk, dict):
            raise self.broken(f"a chunk that is not an object: {compact_json(chunk)[:200]}")
        if chunk.get("error") and not chunk.get("choices"):
            error = chunk["error"]
            detail = error.get("message") if isinstance(error, dict) else error
            raise self.broken(f"the server sent an error: {detail}")
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        delta_text = ""
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if isinstance(content, str) and content:
                delta_text += content
            refusal = delta.get("refusal")
            if isinstance(refusal, str):
                self._refusal.append(refusal)
            for call in delta.get("tool_calls") or []:
                self._add_call(call)
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
        if delta_text:
            self._text.append(delta_text)
        return delta_text

    def _add_call(self, call: Any) -> None:
        if not isinstance(call, dict):
            return
        index = call.get("index")
        slot = self._calls.setdefault(index if isinstance(index, int) else len(self._calls),
                                      {"id": "", "name": "", "arguments": ""})
        if isinstance(call.get("id"), str) and call["id"]:
            slot["id"] = call["id"]
        function = call.get("function") or {}
        name = function.get("name")
        if isinstance(name, str) and name:
            slot["name"] = _name_so_far(slot["name"], name)
        if isinstance(function.get("arguments"), str):
            slot["arguments"] += function["arguments"]

    def broken(self, why: str) -> ProviderError:
        """The error of a stream that broke: ``why``, and the text that had arrived."""
        return stream_broken(self.provider, self.text, why)

    def response(self) -> ProviderResponse:
        """The whole answer, parsed like a non-streamed one."""
        calls = [{"id": slot["id"] or None, "type": "function",
                  "function": {"name": slot["name"], "arguments": slot["arguments"]}}
                 for _, slot in sorted(self._calls.items())]
        message: dict[str, Any] = {"role": "assistant", "content": self.text,
                                   "refusal": "".join(self._refusal) or None}
        if calls:
            message["tool_calls"] = calls
        body = {"choices": [{"index": 0, "message": message, "finish_reason": self._finish}],
                "usage": self._usage}
        return parse_chat_completion(body, provider=self.provider, turn=self.turn)
