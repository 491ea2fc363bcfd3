"""The turn runner: one provider turn, from transcript to ``TurnResult``.

Per turn it projects the newly appended envelopes (never the whole history), builds the
:class:`ProviderRequest` with its metadata, checks availability once per run, lets the
``text_result`` hook short-circuit dispatch, calls the provider, and emits ``request_built``
whether the request succeeded or not. A provider failure is raised so the loop ends the run with
status ``error`` and keeps everything earlier turns produced.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agents_api import Message, TurnResult
from datamachine.conversation.projection import ChatProjector
from datamachine.conversation.timeouts import Timeouts
from datamachine.errors import ProviderError
from datamachine.host import Host
from datamachine.providers.base import ProviderRequest, ProviderResponse
from datamachine.providers.normalize import normalize_response

__all__ = ["ProviderTurnRunner"]

Emit = Callable[[str, dict[str, Any]], None]


class ProviderTurnRunner:
    """Callable turn runner bound to one run (provider, model, mode, tools, payload)."""

    def __init__(
        self,
        host: Host,
        *,
        provider: Any,
        provider_name: str,
        model: str,
        mode: str,
        tools: list[dict[str, Any]],
        payload: Mapping[str, Any],
        timeouts: Timeouts,
        emit: Emit,
        single_turn: bool = False,
        request_filter: Callable[[list[dict[str, Any]], dict[str, Any]],
                                 list[dict[str, Any]]] | None = None,
    ) -> None:
        self.host = host
        self.provider = provider
        self.provider_name = provider_name
        self.model = model
        self.mode = mode
        self.tools = tools
        self.payload = dict(payload)
        self.timeouts = timeouts
        self.emit = emit
        self.single_turn = single_turn
        self.request_filter = request_filter
        self.projector = ChatProjector()
        tools_json = json.dumps(tools, sort_keys=True, default=str).encode()
        self._tools_bytes = len(tools_json)
        self._tools_sha = hashlib.sha256(tools_json).hexdigest()
        self._payload_bytes = len(json.dumps(self.payload, default=str))
        self._available_checked = False
        self.last_request_metadata: dict[str, Any] = {}
        self.has_text_result_hook = bool(host.pm.hook.text_result.get_hookimpls())

    # -- request building -----------------------------------------------------------------
    def build_request(self, messages: list[Message], turn: int) -> ProviderRequest:
        """The provider request of ``turn`` and its metadata (stored on the runner)."""
        chat = self.projector.sync(messages)
        sent = list(chat)
        if self.request_filter is not None:
            # Budget pressure and similar notices go into this copy only, never the transcript.
            sent = self.request_filter(sent, {"turn": turn})
        request = ProviderRequest.model_construct(
            messages=sent, tools=self.tools, provider=self.provider_name, model=self.model,
            mode=self.mode, payload=self.payload, turn=turn,
            request_timeout=self.timeouts.request, connect_timeout=self.timeouts.connect,
        )
        messages_bytes = self.projector.bytes
        self.last_request_metadata = {
            "provider": self.provider_name,
            "model": self.model,
            "mode": self.mode,
            "turn": turn,
            "message_count": len(sent),
            "messages_json_bytes": messages_bytes,
            "tools_json_bytes": self._tools_bytes,
            "request_json_bytes": messages_bytes + self._tools_bytes + self._payload_bytes,
            "prompt_sha256": self.projector.prompt_sha256(),
            "tool_policy_sha256": self._tools_sha,
            "tools": {"count": len(self.tools), "names": [t["name"] for t in self.tools]},
            "transport": {"request_timeout": self.timeouts.request,
                          "connect_timeout": self.timeouts.connect},
        }
        return request

    # -- dispatch -------------------------------------------------------------------------
    def _check_availability(self) -> None:
        if self._available_checked:
            return
        answer = self.host.first("provider_availability", provider=self.provider_name,
                                 model=self.model)
        if answer is None:
            own = getattr(self.provider, "availability", None)
            answer = own() if callable(own) else True
        if isinstance(answer, str) and answer.strip():
            raise ProviderError(answer, code="provider_unavailable", provider=self.provider_name)
        if answer is False:
            raise ProviderError(f"Provider {self.provider_name!r} is not available.",
                                code="provider_unavailable", provider=self.provider_name)
        self._available_checked = True

    def __call__(self, messages: list[Message], context: dict[str, Any]) -> Any:
        turn = int(context["turn"])
        request = self.build_request(messages, turn)
        try:
            self._check_availability()
            short = (self.host.first("text_result", request=request)
                     if self.has_text_result_hook else None)
            if short is not None:
                return self._finish(self._from_hook(short, turn), turn)
            answer = self.provider.complete(request)
        except Exception as exc:
            self._report(turn, success=False, error=exc)
            raise
        if inspect.isawaitable(answer):
            return self._finish_async(answer, turn)
        return self._finish(answer, turn)

    async def _finish_async(self, answer: Awaitable[Any], turn: int) -> TurnResult:
        try:
            response = await answer
        except Exception as exc:
            self._report(turn, success=False, error=exc)
            raise
        return self._finish(response, turn)

    def _from_hook(self, short: Any, turn: int) -> Any:
        if isinstance(short, BaseException):
            raise short
        if isinstance(short, ProviderResponse | Mapping):
            return short
        raise ProviderError(
            f"A text_result hookimpl returned {type(short).__name__}; return a dict, a "
            "ProviderResponse, an Exception or None.",
            code="provider_bad_response", provider=self.provider_name,
        )

    def _finish(self, answer: Any, turn: int) -> TurnResult:
        try:
            if not isinstance(answer, ProviderResponse | Mapping):
                raise ProviderError(
                    f"Provider {self.provider_name!r} returned {type(answer).__name__}, "
                    "not a ProviderResponse.",
                    code="provider_bad_response", provider=self.provider_name,
                )
            response = normalize_response(answer, provider=self.provider_name, turn=turn)
        except Exception as exc:
            self._report(turn, success=False, error=exc)
            raise
        self.last_request_metadata["response"] = {"finish_reason": response.finish_reason}
        self._report(turn, success=True)
        return TurnResult.model_construct(
            content=response.content, tool_calls=response.tool_calls, usage=response.usage,
            request_metadata=self.last_request_metadata, complete=self.single_turn,
            continuation_messages=[],
        )

    def _report(self, turn: int, *, success: bool, error: BaseException | None = None) -> None:
        payload: dict[str, Any] = {"turn": turn, "provider": self.provider_name,
                                   "model": self.model, "success": success,
                                   "request_metadata": self.last_request_metadata}
        if error is not None:
            payload["error"] = str(error) or type(error).__name__
        self.emit("request_built", payload)
