"""The Messages API wire format: the request body sent and the answer parsed (loaded with the
first request, so booting a host with this plugin installed stays cheap)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agents_api.jsontext import compact_json
from datamachine import ProviderRequest, ProviderResponse
from datamachine.errors import ProviderError
from datamachine.providers.chat_messages import ChatMessage
from datamachine.providers.normalize import normalize_response
from datamachine.providers.options import RESERVED_KEYS, without_tool_options
from datamachine.providers.wire_provider import bad_request as _bad_request

__all__ = ["DEFAULT_MAX_TOKENS", "build_messages_body", "parse_message"]

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
                        defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON body of ``POST /v1/messages`` for ``request`` (see the module docstring)."""
    system, turns = _conversation(request, provider)
    tools = [{"name": tool["name"], "description": tool.get("description", ""),
              "input_schema": tool.get("parameters") or {"type": "object", "properties": {}}}
             for tool in request.tools]
    body = _options({**(defaults or {}), **request.options}, bool(tools))
    body.update({"model": request.model, "messages": turns, "stream": False})
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
