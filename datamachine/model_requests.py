"""The switch that keeps test suites off real models: the setting ``allow_model_requests``.

With the setting off (the ``dm_host`` fixture, or the pytest ini option
``datamachine_allow_model_requests = false``), only providers that never leave the process
answer (``scripted``, and ``datamachine.testing``'s ``test`` and ``function``: their
``answers_offline`` attribute) and ``text_result`` hooks. Anything else is
:class:`~datamachine.errors.ModelRequestsDisabled`, *raised* by the run entry points, as
pydantic-ai raises when ``ALLOW_MODEL_REQUESTS`` is off: a returned error result would let a test
that forgets to check ``result.status`` pass.

Two checks, one rule. A run raises before anything is stored when no ``text_result`` hook could
answer instead (``ConversationRun`` checks it against its settings snapshot, on every entry
point); a hook that is registered but declines a request is only known during the run, whose
turn then fails with ``error_code="model_requests_disabled"``, and :func:`raise_if_refused`
turns that result into the exception.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator
from typing import TYPE_CHECKING, Literal, Protocol

from datamachine.errors import DataMachineError, ModelRequestsDisabled

if TYPE_CHECKING:
    from datamachine.conversation.result import ConversationResult
    from datamachine.conversation.stream import StreamEvent
    from datamachine.host import Services

__all__ = ["REFUSED_CODE", "SettingsSource", "guard_astream", "guard_stream",
           "raise_if_refused", "refusal_message", "refuse_before_stream"]

REFUSED_CODE = "model_requests_disabled"


class SettingsSource(Protocol):
    """Settings that say where a value comes from (a host's, or a run's snapshot)."""

    def source(self, key: str) -> Literal["env", "db"] | None:
        """``"env"``, ``"db"`` or None (unset)."""


def refusal_message(settings: SettingsSource, provider: str) -> str:
    """What to do about a refused request: answer in the process, or allow real requests."""
    if settings.source("allow_model_requests") == "env":
        how = "unset the environment variable DATAMACHINE_ALLOW_MODEL_REQUESTS"
    else:
        how = "`datamachine settings set allow_model_requests true`"
    return (f"Model requests are off on this host (setting allow_model_requests is false), so "
            f"provider {provider!r} was not called. In tests, run on the provider 'test' or "
            "'function' (datamachine.testing.TestModel / FunctionModel), answer with the "
            "scripted_model fixture or a text_result hook, or run on the scripted provider; "
            f"to allow real requests: {how}.")


def refuse_before_stream(services: Services, provider: str | None) -> None:
    """Raise :class:`ModelRequestsDisabled` when a stream is asked for, not at its first
    event: model requests are off, the provider (``None``: the default) leaves the process
    and no ``text_result`` hook could answer in its place. The stream's run checks the same
    against its own settings snapshot; an unknown provider is left to it (it names the known
    ones)."""
    settings = services.settings
    if services.pm.hook.text_result.get_hookimpls() \
            or settings.get("allow_model_requests", True) is True:
        return
    name = provider if provider is not None else settings.get("default_provider", "scripted")
    try:
        found = services.providers.get(name)
    except DataMachineError:
        return
    if not getattr(found, "answers_offline", False):
        raise ModelRequestsDisabled(refusal_message(settings, name), provider=name)


def raise_if_refused(result: ConversationResult) -> ConversationResult:
    """``result``, unless its run was refused a model request: then the exception (the run's
    transcript keeps the refused turn, as it keeps any failed one)."""
    if result.error_code == REFUSED_CODE:
        raise ModelRequestsDisabled(result.error or "Model requests are off on this host.",
                                    provider=result.provider)
    return result


def _refused(event: StreamEvent) -> bool:
    return event.type == "result" and event.result is not None \
        and event.result.error_code == REFUSED_CODE


def guard_stream(events: Iterator[StreamEvent]) -> Iterator[StreamEvent]:
    """``events`` as they come, except that a refused run's ``result`` is raised instead;
    closing this closes ``events`` (a consumer that leaves still ends the run)."""
    try:
        for event in events:
            if _refused(event):
                assert event.result is not None
                raise_if_refused(event.result)
            yield event
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()


async def guard_astream(events: AsyncGenerator[StreamEvent, None],
                        ) -> AsyncGenerator[StreamEvent, None]:
    """:func:`guard_stream` for the async stream."""
    try:
        async for event in events:
            if _refused(event):
                assert event.result is not None
                raise_if_refused(event.result)
            yield event
    finally:
        await events.aclose()
