"""Test doubles for applications built on datamachine: :class:`ScriptedModel`,
:class:`TestModel`, :class:`FunctionModel` and the host that refuses real model requests.

The pytest plugin (``datamachine.pytest_plugin``, loaded through the ``pytest11`` entry point)
wraps these as the fixtures ``dm_host`` and ``scripted_model``; this module holds the parts
that are useful without pytest too.

A :class:`ScriptedModel` is a plugin: it answers the ``text_result`` hook, so it stands in for
*whatever* provider the application is configured for (``openai`` included) and the provider is
never called. It answers ``provider_availability`` with ``True`` for the same reason: an app
configured for a real provider has no API key in its test environment.

:class:`TestModel` and :class:`FunctionModel` (from :mod:`datamachine.model_doubles`) are
providers instead, named ``test`` and ``function``: a run asks for them by name, as
pydantic-ai's models of the same names are given to an agent.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from datamachine.errors import ProviderError, UsageError
from datamachine.hookspecs import hookimpl
from datamachine.model_doubles import FunctionModel, ModelFunction, TestModel
from datamachine.providers.base import ProviderRequest, ProviderResponse

if TYPE_CHECKING:
    from datamachine.host import Host

__all__ = ["FunctionModel", "ModelFunction", "Scripted", "ScriptedModel", "TestModel",
           "isolated_host"]

Scripted = str | dict[str, Any] | ProviderResponse | BaseException
"""One scripted answer: text, a compact dict (``{"content", "tool_calls", "usage"}``, every key
optional), a ``ProviderResponse``, or an exception the turn fails with."""


def _checked(response: object) -> Scripted:
    if isinstance(response, str | dict | ProviderResponse | BaseException):
        return response
    raise UsageError(
        f"scripted_model.enqueue() takes text, a dict like {{'content': ..., 'tool_calls': "
        f"[...]}}, a ProviderResponse or an exception, got {type(response).__name__}.")


class ScriptedModel:
    """The model of a test: answers every provider request with the next enqueued response and
    keeps what it was asked in :attr:`requests` (oldest first).

    Register it as a plugin (``boot(plugins=[model])`` or ``host.pm.register(model)``). When
    nothing is left in the queue, the turn fails with an error saying so: a test that scripted
    three answers and got a fourth request has found a bug.
    """

    def __init__(self, responses: Iterable[Scripted] = ()) -> None:
        self.requests: list[ProviderRequest] = []
        self._queue: deque[Scripted] = deque()
        self.enqueue(*responses)

    def enqueue(self, *responses: Scripted) -> ScriptedModel:
        """Add responses, answered in order; returns the model, so calls can be chained."""
        self._queue.extend(_checked(response) for response in responses)
        return self

    @property
    def remaining(self) -> int:
        """Responses not asked for yet."""
        return len(self._queue)

    @property
    def last_request(self) -> ProviderRequest:
        """The latest request (an ``IndexError`` names the fixture when there is none)."""
        if not self.requests:
            raise IndexError("scripted_model has not been asked anything yet.")
        return self.requests[-1]

    @hookimpl
    def provider_availability(self, provider: str, model: str) -> bool:
        return True  # whatever the provider, this model answers instead of it

    @hookimpl
    def text_result(self, request: ProviderRequest) -> Any:
        self.requests.append(request)
        if not self._queue:
            asked = len(self.requests)
            return ProviderError(
                f"scripted_model has no response left for request {asked} (turn "
                f"{request.turn}): enqueue one more with scripted_model.enqueue(...), or end the "
                "script with an answer that has no tool calls.",
                code="script_exhausted", provider=request.provider)
        answer = self._queue.popleft()
        if isinstance(answer, str):
            return {"content": answer}
        return answer


@contextmanager
def isolated_host(db_path: str | Path = ":memory:", *, plugins: Iterable[object] = (),
              load_entrypoints: bool = True, as_default: bool = True) -> Iterator[Host]:
    """An isolated host for one test, with the setting ``allow_model_requests`` off (only the
    ``scripted``, ``test`` and ``function`` providers and ``text_result`` hooks answer; a run on
    any other provider raises ``ModelRequestsDisabled``). With ``as_default`` it is also the
    default host behind ``datamachine.run_conversation`` and friends until the block ends."""
    from datamachine.api import install_default_host
    from datamachine.booting import boot

    host = boot(db_path=db_path, plugins=plugins, load_entrypoints=load_entrypoints)
    try:
        host.settings.set("allow_model_requests", False)
        if not as_default:
            yield host
            return
        with install_default_host(host):
            yield host
    finally:
        host.close()
