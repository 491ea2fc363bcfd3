"""The module-level entry points, and the lazily booted default host behind them.

``datamachine.run_conversation(...)`` is ``get_default_host().run_conversation(...)``; apps that
want isolation (tests, several tenants) boot their own host with ``bootstrap.boot()``.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncGenerator, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from datamachine.conversation.result import ConversationResult

if TYPE_CHECKING:
    from datamachine.conversation.stream import StreamEvent
    from datamachine.host import Host

__all__ = [
    "acontinue_conversation",
    "aresume",
    "arun_conversation",
    "astream_conversation",
    "continue_conversation",
    "get_default_host",
    "install_default_host",
    "reset_default_host",
    "resume",
    "run_conversation",
    "stream_conversation",
]


def run_conversation(
    messages: Any,
    tools: Any = None,
    provider: str | None = None,
    model: str | None = None,
    mode: Any = "pipeline",
    payload: dict[str, Any] | None = None,
    max_turns: int | None = None,
    single_turn: bool = False,
    *,
    output_type: Any = None,
) -> ConversationResult:
    """Run one bounded conversation and say honestly why it stopped.

    ``messages``: ``{"role", "content"}`` dicts or ``agents_api.Message`` envelopes. ``tools``: a
    mapping name -> Tool or a list of Tool. ``provider``/``model``: a registered provider name
    (default: the ``default_provider`` setting, ``scripted``) and its model id. ``mode``:
    ``pipeline`` (default), ``chat``, ``system`` or an extension mode. ``payload``: context for
    tools and requests plus runtime options (DESIGN.md 5.2). ``max_turns``: the turn ceiling,
    resolved and clamped through the ``conversation_turns`` budget. ``single_turn``: stop after
    exactly one provider turn. ``output_type``: a pydantic model class or a JSON schema dict the
    final answer must fit (``result.output`` holds the value). Bad arguments raise
    ``UsageError`` before any provider call.
    """
    return get_default_host().run_conversation(messages, tools, provider, model, mode, payload,
                                               max_turns, single_turn, output_type=output_type)


async def arun_conversation(
    messages: Any,
    tools: Any = None,
    provider: str | None = None,
    model: str | None = None,
    mode: Any = "pipeline",
    payload: dict[str, Any] | None = None,
    max_turns: int | None = None,
    single_turn: bool = False,
    *,
    output_type: Any = None,
) -> ConversationResult:
    """Async twin of :func:`run_conversation` (async providers and tools are awaited)."""
    return await get_default_host().arun_conversation(messages, tools, provider, model, mode,
                                                      payload, max_turns, single_turn,
                                                      output_type=output_type)


def stream_conversation(
    messages: Any,
    tools: Any = None,
    provider: str | None = None,
    model: str | None = None,
    mode: Any = "pipeline",
    payload: dict[str, Any] | None = None,
    max_turns: int | None = None,
    single_turn: bool = False,
    *,
    output_type: Any = None,
) -> Iterator[StreamEvent]:
    """:func:`run_conversation`, streamed (default host): ``StreamEvent``s as they happen
    (``text_delta``, ``tool_call``, ``tool_result``, ``event``), the ``result`` last. Leaving
    the loop early ends the run ``aborted``, its transcript kept and its lock released."""
    return get_default_host().stream_conversation(messages, tools, provider, model, mode,
                                                  payload, max_turns, single_turn,
                                                  output_type=output_type)


def astream_conversation(
    messages: Any,
    tools: Any = None,
    provider: str | None = None,
    model: str | None = None,
    mode: Any = "pipeline",
    payload: dict[str, Any] | None = None,
    max_turns: int | None = None,
    single_turn: bool = False,
    *,
    output_type: Any = None,
) -> AsyncGenerator[StreamEvent, None]:
    """Async twin of :func:`stream_conversation` (``async for event in ...``)."""
    return get_default_host().astream_conversation(messages, tools, provider, model, mode,
                                                   payload, max_turns, single_turn,
                                                   output_type=output_type)


def continue_conversation(
    session_id: str,
    extend_by: int,
    tools: Any = None,
    provider: str | None = None,
    model: str | None = None,
    *,
    output_type: Any = None,
) -> ConversationResult:
    """Resume a stored run with at most ``extend_by`` more provider turns (default host).

    The provider and model recorded with the transcript are reused unless given; ``tools=None``
    runs with no tools. The result reports this run's ``turn_count`` and the transcript's
    ``cumulative_turn_count``.
    """
    return get_default_host().continue_conversation(session_id, extend_by, tools, provider,
                                                    model, output_type=output_type)


async def acontinue_conversation(
    session_id: str,
    extend_by: int,
    tools: Any = None,
    provider: str | None = None,
    model: str | None = None,
    *,
    output_type: Any = None,
) -> ConversationResult:
    """Async twin of :func:`continue_conversation` (default host)."""
    return await get_default_host().acontinue_conversation(session_id, extend_by, tools,
                                                           provider, model,
                                                           output_type=output_type)


def resume(
    session_id: str,
    approve: bool,
    extend_by: int | None = None,
    tools: Any = None,
    *,
    payload: dict[str, Any] | None = None,
    pause_id: str | None = None,
) -> ConversationResult:
    """Answer a paused run and continue it (default host; see ``Host.resume``)."""
    return get_default_host().resume(session_id, approve, extend_by, tools, payload=payload,
                                     pause_id=pause_id)


async def aresume(
    session_id: str,
    approve: bool,
    extend_by: int | None = None,
    tools: Any = None,
    *,
    payload: dict[str, Any] | None = None,
    pause_id: str | None = None,
) -> ConversationResult:
    """Async twin of :func:`resume` (default host)."""
    return await get_default_host().aresume(session_id, approve, extend_by, tools,
                                            payload=payload, pause_id=pause_id)


# -- the default host ---------------------------------------------------------------------------
_lock = threading.Lock()
_host: Host | None = None


def get_default_host() -> Host:
    """Boot the default host on first use (database from ``$DATAMACHINE_DB`` or the data dir)."""
    global _host
    if _host is None:
        with _lock:
            if _host is None:
                from datamachine.booting import boot

                _host = boot()
    return _host


def reset_default_host() -> None:
    """Close and forget the default host; the next module-level call boots a new one from the
    environment (``DATAMACHINE_DB``, ``DATAMACHINE_LOAD_PLUGINS``), e.g. between tests."""
    global _host
    with _lock:
        if _host is not None:
            _host.close()
        _host = None


@contextmanager
def install_default_host(host: Host) -> Iterator[Host]:
    """Make ``host`` the default host for the block (tests: ``datamachine.run_conversation``
    runs on the test's own host); the default host before it is closed first, and none is
    left behind: the next module-level call after the block boots a new one. The caller
    still owns ``host`` and closes it."""
    global _host
    reset_default_host()
    with _lock:
        _host = host
    try:
        yield host
    finally:
        with _lock:
            if _host is host:
                _host = None
