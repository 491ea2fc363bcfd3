"""Models for tests that answer in the process: :class:`TestModel` and :class:`FunctionModel`.

Each is a plugin that registers itself as a provider (``test`` and ``function``), so a run
names it like any provider (``provider="test"``) and ``host.providers.get("test")`` returns it.
Both answer with the setting ``allow_model_requests`` off (``answers_offline``), as pydantic-ai's
models of the same names do with ``ALLOW_MODEL_REQUESTS = False``. Both keep the requests they
were given in ``requests`` (oldest first).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Literal

from datamachine.errors import ProviderError, UsageError
from datamachine.hookspecs import hookimpl
from datamachine.providers.base import ProviderRequest, ProviderResponse
from datamachine.schema_examples import example_arguments

__all__ = ["FunctionModel", "ModelFunction", "TestModel"]

NO_TOOL_CALLS = "success (no tool calls)"

ModelFunction = Callable[[list[dict[str, Any]], list[dict[str, Any]]], Any]
"""``fn(messages, tools)``: the request's chat messages and offered tools; returns text, a
compact dict ``{"content", "tool_calls", "usage"}``, a ``ProviderResponse`` or an exception (or
an awaitable of one of them)."""


def _words(value: Any) -> int:
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(_words(part.get("text") if isinstance(part, Mapping) else part)
                   for part in value)
    return 0


def _estimated_usage(messages: list[dict[str, Any]], answer: str,
                     calls: list[dict[str, Any]]) -> dict[str, int]:
    """pydantic-ai's estimate: 50 tokens plus a word count for the request, a word count for
    the answer (a tool call counts its name and its arguments' JSON)."""
    prompt = 50 + sum(_words(message.get("content")) for message in messages)
    completion = _words(answer) + sum(
        1 + _words(json.dumps(call["parameters"])) for call in calls)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _decoded(content: Any) -> Any:
    if isinstance(content, str):
        try:
            return json.loads(content)
        except ValueError:
            return content
    return content


class _Exchange:
    """What the model did since its last answer without tool calls: the tools it called, and
    their results by tool name."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        start = 0
        for index, message in enumerate(messages):
            if message.get("role") == "assistant" and not message.get("tool_calls"):
                start = index + 1
        names: dict[str, str] = {}
        self.results: dict[str, Any] = {}
        for message in messages[start:]:
            for call in message.get("tool_calls") or ():
                if isinstance(call, Mapping):
                    name = call.get("name") or (call.get("function") or {}).get("name")
                    names[str(call.get("id"))] = str(name)
            if message.get("role") == "tool":
                name = names.get(str(message.get("tool_call_id")), "?")
                self.results[name] = _decoded(message.get("content"))
        self.called = set(names.values())


class TestModel:
    """A model that calls every offered tool once, with arguments made from the tool's schema
    (:mod:`datamachine.schema_examples`), then answers with the tools' results as JSON
    (``{"tool_name": result, ...}``), or ``"success (no tool calls)"`` when it had no tool
    to call. Provider name ``test``.

    ``call_tools``: ``"all"``, or the names of the tools it calls (others are offered but never
    called). ``custom_output_text``: the final answer instead of the JSON. ``seed``: varies
    the generated arguments (``"b"`` instead of ``"a"``...). Usage is estimated as pydantic-ai
    does (a word count), so token budgets see plausible numbers.
    """

    __test__ = False  # a class named Test* imported into a test module is not a test
    name = "test"
    answers_offline = True  # answers with allow_model_requests off

    def __init__(self, *, call_tools: Literal["all"] | Iterable[str] = "all",
                 custom_output_text: str | None = None, seed: int = 0) -> None:
        if isinstance(call_tools, str) and call_tools != "all":
            raise UsageError(f"TestModel(call_tools={call_tools!r}): give 'all' or a list of "
                             "tool names.")
        self.call_tools: Literal["all"] | frozenset[str] = (
            "all" if call_tools == "all" else frozenset(call_tools))
        self.custom_output_text = custom_output_text
        self.seed = seed
        self.requests: list[ProviderRequest] = []

    @hookimpl
    def register_providers(self) -> list[Any]:
        return [self]

    def _wanted(self, tool: Mapping[str, Any]) -> bool:
        return self.call_tools == "all" or tool.get("name") in self.call_tools

    def complete(self, request: ProviderRequest) -> ProviderResponse:
        """Call the offered tools not called yet since the last answer; else answer."""
        self.requests.append(request)
        exchange = _Exchange(request.messages)
        calls = [{"id": f"test_{request.turn}_{index}", "name": tool["name"],
                  "parameters": example_arguments(tool.get("parameters") or {}, seed=self.seed)}
                 for index, tool in enumerate(request.tools, start=1)
                 if self._wanted(tool) and tool["name"] not in exchange.called]
        if calls:
            return ProviderResponse(tool_calls=calls, finish_reason="tool_calls",
                                    usage=_estimated_usage(request.messages, "", calls))
        if self.custom_output_text is not None:
            text = self.custom_output_text
        elif exchange.results:
            text = json.dumps(exchange.results, ensure_ascii=False, default=str)
        else:
            text = NO_TOOL_CALLS
        return ProviderResponse(content=text, finish_reason="stop",
                                usage=_estimated_usage(request.messages, text, []))


class FunctionModel:
    """A model that is a function of yours: ``fn(messages, tools)`` gets the request's chat
    messages (``{"role", "content", ...}`` dicts) and offered tools (``{"name",
    "description", "parameters"}`` dicts) and returns the answer: text, a compact dict
    ``{"content", "tool_calls": [{"name", "parameters"}], "usage"}`` (every key optional), a
    ``ProviderResponse``, or an exception the turn fails with; an ``async def`` works too.
    Provider name ``function``.
    """

    name = "function"
    answers_offline = True  # answers with allow_model_requests off

    def __init__(self, fn: ModelFunction) -> None:
        if not callable(fn):
            raise UsageError(f"FunctionModel(fn): fn must be callable as fn(messages, tools), "
                             f"got {type(fn).__name__}.")
        self.fn = fn
        self.requests: list[ProviderRequest] = []

    @hookimpl
    def register_providers(self) -> list[Any]:
        return [self]

    def complete(self, request: ProviderRequest) -> Any:
        """``fn``'s answer to ``request`` (an awaitable of it when ``fn`` is async)."""
        self.requests.append(request)
        answer = self.fn(request.messages, request.tools)
        if inspect.isawaitable(answer):
            return self._awaited(answer)
        return self._checked(answer)

    async def _awaited(self, answer: Awaitable[Any]) -> Any:
        return self._checked(await answer)

    def _checked(self, answer: Any) -> Any:
        if isinstance(answer, str):
            return {"content": answer}
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, ProviderResponse | Mapping):
            return answer
        raise ProviderError(
            f"FunctionModel's function returned {type(answer).__name__}; return text, a dict "
            "like {'content': ..., 'tool_calls': [...]}, a ProviderResponse or an exception.",
            code="provider_bad_response", provider=self.name)
