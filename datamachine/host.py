"""A booted host: one plugin manager, one database, one budget registry, isolated.

Two hosts in one process share nothing, which is what lets tests (and multi-tenant apps) run
side by side. ``bootstrap.boot()`` builds hosts (:mod:`datamachine.booting`); the module-level
functions use a default host booted on first use (:mod:`datamachine.api`).

:class:`Services` is what a host holds: its stores, registries and settings; the conversation
modules work with a ``Services`` and import this module only for its type. :class:`Host` is a
``Services`` with the run methods on top, which load the conversation machinery on first use,
so a host that only boots (registers budgets, opens storage) never pays for it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

from datamachine.job_queue import JobQueue
from datamachine.model_requests import (
    guard_astream,
    guard_stream,
    raise_if_refused,
    refuse_before_stream,
)
from datamachine.modes import BUILTIN_MODES
from datamachine.plugins import PluginInfo, first_result, fold_value
from datamachine.providers.registry import ProviderRegistry
from datamachine.registry import IterationBudgetRegistry
from datamachine.settings import Settings
from datamachine.storage import (
    ChatSessionStore,
    JobStore,
    SpendStore,
    TokenStore,
    TranscriptStore,
)
from datamachine.storage.database import DatabaseHandle
from datamachine.tools.registry import ToolRegistry

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable, Iterator

    from sqlite_utils import Database

    from datamachine.conversation.result import ConversationResult
    from datamachine.conversation.stream import StreamEvent

logger = logging.getLogger("datamachine")

__all__ = ["Host", "Services", "with_output_type"]


@dataclass(eq=False)
class Services:
    """Everything one datamachine instance owns. Build a host with ``bootstrap.boot()``."""

    pm: pluggy.PluginManager
    # The open database the stores share; ``db`` is sqlite-utils' view of it (see ``db``).
    handle: DatabaseHandle
    settings: Settings
    budgets: IterationBudgetRegistry
    db_path: Path | None
    plugins: dict[str, PluginInfo] = field(default_factory=dict)
    # Providers and tools contributed by plugins (built-ins come from default plugins).
    providers: ProviderRegistry = field(kw_only=True, default_factory=ProviderRegistry)
    tools: ToolRegistry = field(kw_only=True, default_factory=ToolRegistry)
    # Storage (docs/storage.md): the default transcript persister and lock, jobs, chat sessions
    # API tokens and spend windows, all on ``db``.
    transcripts: TranscriptStore = field(kw_only=True)
    jobs: JobStore = field(kw_only=True)
    chat_sessions: ChatSessionStore = field(kw_only=True)
    tokens: TokenStore = field(kw_only=True)
    spend: SpendStore = field(kw_only=True)
    # The task queue ``jobs.enqueue`` puts jobs on (PostgreSQL only; DESIGN.md 18), and
    # ``datamachine worker`` runs them from.
    queue: JobQueue = field(kw_only=True)
    # The modes a run may name, {mode: owner}: built-in ones and plugins' register_modes().
    modes: dict[str, str] = field(kw_only=True, default_factory=lambda: dict.fromkeys(
        BUILTIN_MODES, "datamachine"))
    # Whether close() ran: it runs the plugins' host_closing once.
    _closed: bool = field(default=False, init=False, repr=False)

    @property
    def db(self) -> Database:
        """The sqlite-utils ``Database`` on the host's connection. Built on first use, so a host
        that never reads it never imports sqlite-utils (when its schema is current at boot)."""
        return self.handle.database

    def fold(self, hook_name: str, value: Any, **kwargs: Any) -> Any:
        """Pass ``value`` through a value-filter hook (see ``plugins.fold_value``)."""
        return fold_value(self.pm, hook_name, value, **kwargs)

    def first(self, hook_name: str, **kwargs: Any) -> Any:
        """The first non-None answer of a firstresult hook."""
        return first_result(self.pm, hook_name, **kwargs)

    def default_provider(self, provider: str | None) -> Any:
        """``provider``, else the setting ``default_provider`` (``scripted``)."""
        return provider if provider is not None else self.settings.get("default_provider",
                                                                        "scripted")

    def default_model(self, model: str | None) -> Any:
        """``model``, else the setting ``default_model`` (empty)."""
        return model if model is not None else self.settings.get("default_model", "")


def with_output_type(payload: dict[str, Any] | None,
                     output_type: Any) -> dict[str, Any] | None:
    """``payload`` with the run's ``output_type`` (a runtime option) when one is given; a
    payload that is not a mapping is a UsageError naming it."""
    if output_type is None:
        return payload
    from datamachine.conversation.payload import payload_mapping

    return {**payload_mapping(payload), "output_type": output_type}


class Host(Services):
    """Everything one datamachine instance owns, and the calls that run conversations on it."""

    def run_conversation(
        self,
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
        """Run one bounded conversation on this host (see ``datamachine.run_conversation``)."""
        from datamachine.conversation.conversation_run import ConversationRun

        run = ConversationRun.create(self, messages, tools, provider, model, mode,
                                     with_output_type(payload, output_type), max_turns,
                                     single_turn)
        return raise_if_refused(run.run())

    async def arun_conversation(
        self,
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
        """Async twin of :meth:`run_conversation`."""
        from datamachine.conversation.conversation_run import ConversationRun

        run = ConversationRun.create(self, messages, tools, provider, model, mode,
                                     with_output_type(payload, output_type), max_turns,
                                     single_turn)
        return raise_if_refused(await run.arun())

    async def acontinue_conversation(
        self,
        session_id: str,
        extend_by: int,
        tools: Any = None,
        provider: str | None = None,
        model: str | None = None,
        *,
        output_type: Any = None,
    ) -> ConversationResult:
        """Async twin of :meth:`continue_conversation`."""
        from agents_api.drive import drive_async
        from datamachine.conversation.resuming import continuation_steps

        return raise_if_refused(await drive_async(continuation_steps(
            self, session_id, extend_by, tools, provider, model, output_type=output_type)))

    def stream_conversation(
        self,
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
        """:meth:`run_conversation`, streamed: ``StreamEvent``s as they happen, the result
        last. Leaving the loop early ends the run ``aborted`` (transcript kept, lock freed)."""
        from datamachine.conversation.stream import stream_on

        refuse_before_stream(self, provider)
        return guard_stream(stream_on(self, messages, tools, provider, model, mode, payload,
                                      max_turns, single_turn, output_type=output_type))

    def astream_conversation(
        self,
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
        """Async twin of :meth:`stream_conversation` (``async for event in ...``)."""
        from datamachine.conversation.stream import astream_on

        refuse_before_stream(self, provider)
        return guard_astream(astream_on(self, messages, tools, provider, model, mode, payload,
                                        max_turns, single_turn, output_type=output_type))

    def continue_conversation(
        self,
        session_id: str,
        extend_by: int,
        tools: Any = None,
        provider: str | None = None,
        model: str | None = None,
        *,
        output_type: Any = None,
    ) -> ConversationResult:
        """Resume a stopped (or crash-interrupted) run with at most ``extend_by`` more turns."""
        from agents_api.drive import drive_sync
        from datamachine.conversation.resuming import continuation_steps

        return raise_if_refused(drive_sync(continuation_steps(
            self, session_id, extend_by, tools, provider, model, output_type=output_type)))

    async def achat(
        self,
        session_id: str,
        message: str,
        tools: Any = None,
        provider: str | None = None,
        model: str | None = None,
        *,
        payload: dict[str, Any] | None = None,
        output_type: Any = None,
        on_text: Callable[[str], None] | None = None,
    ) -> ConversationResult:
        """Async twin of :meth:`chat` (for ``async def`` endpoints)."""
        from agents_api.drive import drive_async
        from datamachine.conversation.chat import chat_message, chat_steps

        return raise_if_refused(await drive_async(chat_steps(
            self, session_id, chat_message(message), tools, provider, model,
            with_output_type(payload, output_type), on_text=on_text)))

    def chat(
        self,
        session_id: str,
        message: str,
        tools: Any = None,
        provider: str | None = None,
        model: str | None = None,
        *,
        payload: dict[str, Any] | None = None,
        output_type: Any = None,
        on_text: Callable[[str], None] | None = None,
    ) -> ConversationResult:
        """One chat-mode run on a stored chat session, enforcing its turn limit.

        ``payload`` adds context and runtime options (an ``event_sink``, a ``script``) to the
        run; the session id is always the transcript id. ``on_text`` is called with each piece
        of the model's text as it arrives (the provider streams; one piece from a provider that
        cannot).
        """
        from agents_api.drive import drive_sync
        from datamachine.conversation.chat import chat_message, chat_steps

        return raise_if_refused(drive_sync(chat_steps(
            self, session_id, chat_message(message), tools, provider, model,
            with_output_type(payload, output_type), on_text=on_text)))

    def resume(
        self,
        session_id: str,
        approve: bool,
        extend_by: int | None = None,
        tools: Any = None,
        *,
        payload: dict[str, Any] | None = None,
        pause_id: str | None = None,
    ) -> ConversationResult:
        """Answer a paused run (status ``awaiting_confirmation``) and continue it: approved, the
        budget is extended (``extend_by``), the chat count reset or the tool run; declined, the
        run stops (see ``datamachine.conversation.resuming``). ``tools=None``: the paused run's
        tools by name; ``payload``: runtime options for the resumed run; ``pause_id``: answer
        only that pause (``result.pending["pause_id"]``), else SessionNotPaused: a person's
        answer to a question shown earlier never answers the next one."""
        from agents_api.drive import drive_sync
        from datamachine.conversation.resuming import resume_steps

        return raise_if_refused(drive_sync(resume_steps(
            self, session_id, approve, extend_by, tools, payload, pause_id=pause_id)))

    async def aresume(
        self,
        session_id: str,
        approve: bool,
        extend_by: int | None = None,
        tools: Any = None,
        *,
        payload: dict[str, Any] | None = None,
        pause_id: str | None = None,
    ) -> ConversationResult:
        """Async twin of :meth:`resume` (for ``async def`` endpoints)."""
        from agents_api.drive import drive_async
        from datamachine.conversation.resuming import resume_steps

        return raise_if_refused(await drive_async(resume_steps(
            self, session_id, approve, extend_by, tools, payload, pause_id=pause_id)))

    def resolve(self, session_id: str, call_id: str, result: Any, tools: Any = None, *,
                payload: dict[str, Any] | None = None) -> ConversationResult:
        """Say what an in-doubt call did (DESIGN.md 24) and go on like :meth:`resume`: the call
        is settled with ``result`` (what the tool would have returned) without running again,
        and the run goes on from there. For a run paused with ``pending.kind ==
        "tool_in_doubt"`` (``call_id``: ``pending["tool_call"]["id"]``) or a session a run
        died on with the call unsettled. Raises CallNotInDoubt for a call that is not."""
        from agents_api.drive import drive_sync
        from datamachine.conversation.resuming import resolve_steps

        return raise_if_refused(drive_sync(resolve_steps(
            self, session_id, call_id, result, tools, payload)))

    async def aresolve(self, session_id: str, call_id: str, result: Any, tools: Any = None, *,
                       payload: dict[str, Any] | None = None) -> ConversationResult:
        """Async twin of :meth:`resolve`."""
        from agents_api.drive import drive_async
        from datamachine.conversation.resuming import resolve_steps

        return raise_if_refused(await drive_async(resolve_steps(
            self, session_id, call_id, result, tools, payload)))

    def close(self) -> None:
        """Stop what plugins started (``host_closing``), close the providers' connection pools
        and the database connection; the host is unusable afterwards."""
        try:
            self._closing()
            self.providers.close()
        finally:
            self.handle.conn.close()

    async def aclose(self) -> None:
        """:meth:`close` for async apps: the running event loop's connection pools are closed
        on that loop (awaited) rather than scheduled."""
        try:
            self._closing()
            await self.providers.aclose()
        finally:
            self.handle.conn.close()

    def _closing(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.queue.close()
        for impl in self.pm.hook.host_closing.get_hookimpls():
            try:
                impl.function(host=self)
            except Exception:
                logger.warning("datamachine: plugin %r failed to close", impl.plugin_name,
                               exc_info=True)

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
