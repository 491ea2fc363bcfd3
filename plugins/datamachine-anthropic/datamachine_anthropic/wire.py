"""The Messages API wire format: the request body sent and the answer parsed (loaded with the
first request, so booting a host with this plugin installed stays cheap)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agents_api.jsontext import compact_json
from datamachine import ProviderRequest, ProviderResponse
from datamachine.errors import ProviderError
from datamachine.providers.chat_messages import ChatMessage
from datamachine.providers.normalize import normalize_response
from datamachine.providers.options import RESERVED_KEYS, without_tool_options
from datamachine.providers.wire_provider import bad_request as _bad_request
from datamachine.providers.wire_provider import stream_broken

__all__ = ["DEFAULT_MAX_TOKENS", "MessagesStreamAssembler", "build_messages_body",
           "parse_message"]

DEFAULT_MAX_TOKENS = 4096

# OpenAI options the Messages API has no field for (stop, tool_choice and parallel_tool_calls
# are translated instead).
_NOT_SENT = frozenset({"seed", "response_format", "frequency_penalty", "presence_penalty",
                       "logit_bias", "n", "parallel_tool_calls", "stop", "tool_choice"})
_STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                 "tool_use": "tool_calls", "refusal": "content_filter",
                 "pause_turn": "stop"}


# -- request ---------------------------------------------------------------------------------

def _tool_choice(value: Any, parallel: Any) -> dict[str, Any] | None:
    if value is None and parallel is not False:
        return None
    if isinstance(value, Mapping):
        function = value.get("function")
        if value.get("type") == "function" and isinstance(function, Mapping):
            choice: dict[str, Any] = {"type": "tool", "name": function.get("name")}
        else:
            choice = dict(value)  # Anthropic's own form
    else:
        choice = {"type": {"required": "any", None: "auto"}.get(value, value)}
    if parallel is False and choice.get("type") != "none":
        choice["disable_parallel_tool_use"] = True
    return choice


def _options(options: Mapping[str, Any], with_tools: bool) -> dict[str, Any]:
    sent = dict(options if with_tools else without_tool_options(options))
    out = {key: value for key, value in sent.items()
           if key not in _NOT_SENT and key not in RESERVED_KEYS}
    out.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
    stop = sent.get("stop")
    if stop is not None:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if with_tools:
        choice = _tool_choice(sent.get("tool_choice"), sent.get("parallel_tool_calls"))
        if choice is not None:
            out["tool_choice"] = choice
    return out


def _blocks(message: ChatMessage) -> list[dict[str, Any]]:
    if message.role == "tool":
        return [{"type": "tool_result", "tool_use_id": message.tool_call_id,
                 "content": _text(message.content)}]
    blocks: list[dict[str, Any]] = []
    if isinstance(message.content, list):
        blocks.extend(part if isinstance(part, dict) else {"type": "text", "text": str(part)}
                      for part in message.content)
    elif message.content:
        blocks.append({"type": "text", "text": message.content})
    blocks.extend({"type": "tool_use", "id": call.id, "name": call.name,
                   "input": call.parameters} for call in message.tool_calls)
    return blocks


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return compact_json(content)


def _conversation(request: ProviderRequest, provider: str
                  ) -> tuple[list[str], list[dict[str, Any]]]:
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for index, raw in enumerate(request.messages):
        try:
            message = ChatMessage.model_validate(raw)
        except Exception as exc:
            raise _bad_request(provider, f"Cannot send messages[{index}] to the {provider} "
                                         f"provider: {exc}") from None
        if message.role == "system":
            system.append(_text(message.content))
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _blocks(message)
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)  # the API wants the roles to alternate
        else:
            turns.append({"role": role, "content": blocks})
    return system, turns


def build_messages_body(request: ProviderRequest, *, provider: str = "anthropic",
                        defaults: Mapping[str, Any] | None = None,
                        stream: bool = False) -> dict[str, Any]:
    """The JSON body of ``POST /v1/messages`` for ``request`` (see the module docstring)."""
    system, turns = _conversation(request, provider)
    tools = [{"name": tool["name"], "description": tool.get("description", ""),
              "input_schema": tool.get("parameters") or {"type": "object", "properties": {}}}
             for tool in request.tools]
    body = _options({**(defaults or {}), **request.options}, bool(tools))
    body.update({"model": request.model, "messages": turns, "stream": stream})
    if system:
        body["system"] = "\n\n".join(system)
    if tools:
        body["tools"] = tools
    return body


# -- response --------------------------------------------------------------------------------

def _usage(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        return {}
    usage = {key: value for key, value in raw.items()
             if isinstance(value, int) and not isinstance(value, bool)}
    prompt = int(usage.get("input_tokens", 0))
    completion = int(usage.get("output_tokens", 0))
    usage.update({"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion})
    return usage


def parse_message(data: Any, *, provider: str = "anthropic", turn: int = 1) -> ProviderResponse:
    """A normalized ProviderResponse from a decoded Messages API answer; anything else (an
    error object, no ``content`` list) raises ProviderError ``provider_bad_response``."""
    if not isinstance(data, dict) or not isinstance(data.get("content"), list):
        detail = data.get("error") if isinstance(data, dict) else None
        message = detail.get("message") if isinstance(detail, dict) else None
        raise ProviderError(
            f"The {provider} provider's answer is not a message"
            + (f": {message}" if message else f" (got {compact_json(data)[:200]})."),
            code="provider_bad_response", provider=provider)
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in data["content"]:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            texts.append(str(block.get("text", "")))
        elif block.get("type") == "tool_use":
            arguments = block.get("input")
            calls.append({"id": block.get("id"), "name": block.get("name"),
                          "parameters": arguments if isinstance(arguments, dict)
                          else compact_json(arguments)})
    stop = data.get("stop_reason")
    return normalize_response(
        {"content": "".join(texts), "tool_calls": calls, "usage": _usage(data.get("usage")),
         "finish_reason": _STOP_REASONS.get(stop, stop) if isinstance(stop, str) else None,
         "raw": data}, provider=provider, turn=turn)


# -- streamed response -----------------------------------------------------------------------

class MessagesStreamAssembler:
    """Puts a streamed Messages answer back together, event by event.

    :meth:`feed` takes one decoded event (``message_start``, ``content_block_start`` /
    ``_delta`` / ``_stop``, ``message_delta``, ``message_stop``, ``ping``, ``error``) and returns
    its text delta. A ``tool_use`` block's input arrives as ``input_json_delta`` fragments;
    :meth:`response` joins them and parses the whole message exactly as a non-streamed one.
    """

    def __init__(self, provider: str = "anthropic", turn: int = 1) -> None:
        self.provider = provider
        self.turn = turn
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}
        self._usage: dict[str, Any] = {}
        self._stop: str | None = None
        self._done = False

    @property
    def done(self) -> bool:
        """``message_stop`` has arrived."""
        return self._done

    @property
    def unfinished(self) -> str | None:
        """Why the answer is not whole (no ``message_stop``), or None."""
        return None if self._done else "the stream ended before message_stop"

    def feed_data(self, data: str) -> str:
        """One SSE ``data:`` (a JSON event); its text delta."""
        return self.feed(json.loads(data))

    @property
    def text(self) -> str:
        """The text so far."""
        return "".join(str(block.get("text", "")) for _, block in sorted(self._blocks.items())
                       if block.get("type") == "text")

    def feed(self, event: Any) -> str:
        """The text delta of ``event`` (possibly empty); ProviderError for an error event."""
        if not isinstance(event, dict):
            raise self.broken(f"an event that is not an object: {compact_json(event)[:200]}")
        kind = event.get("type")
        if kind == "error":
            error = event.get("error")
            detail = error.get("message") if isinstance(error, dict) else error
            raise self.broken(f"the server sent an error: {detail}")
        if kind == "message_start":
            message = event.get("message") or {}
            self._usage.update(message.get("usage") or {})
        elif kind == "content_block_start":
            block = dict(event.get("content_block") or {})
            if block.get("type") == "tool_use":
                block["input"] = {}
            self._blocks[int(event.get("index", len(self._blocks)))] = block
        elif kind == "content_block_delta":
            return self._delta(int(event.get("index", 0)), event.get("delta") or {})
        elif kind == "message_delta":
            self._stop = (event.get("delta") or {}).get("stop_reason") or self._stop
            self._usage.update(event.get("usage") or {})
        elif kind == "message_stop":
            self._done = True
        return ""

    def _delta(self, index: int, delta: dict[str, Any]) -> str:
        block = self._blocks.setdefault(index, {"type": "text", "text": ""})
        if delta.get("type") == "text_delta":
            text = str(delta.get("text", ""))
            block["text"] = str(block.get("text", "")) + text
            return text
        if delta.get("type") == "input_json_delta":
            self._json.setdefault(index, []).append(str(delta.get("partial_json", "")))
        return ""

    def broken(self, why: str) -> ProviderError:
        """The error of a stream that broke: ``why``, and the text that had arrived."""
        return stream_broken(self.provider, self.text, why)

    def response(self) -> ProviderResponse:
        """The whole message, parsed like a non-streamed one."""
        content = []
        for index, block in sorted(self._blocks.items()):
            if block.get("type") == "tool_use":
                text = "".join(self._json.get(index, []))
                try:
                    block = {**block, "input": json.loads(text) if text.strip() else {}}
                except ValueError:
                    block = {**block, "input": text}  # kept as text: invalid_arguments
            content.append(block)
        return parse_message({"content": content, "stop_reason": self._stop,
                              "usage": self._usage}, provider=self.provider, turn=self.turn)
