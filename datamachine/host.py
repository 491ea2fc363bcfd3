"""A booted host: one plugin manager, one database, one budget registry, isolated.

Two hosts in one process share nothing, which is what lets tests (and multi-tenant apps) run
side by side. ``bootstrap.boot()`` builds hosts; the module-level functions use a default host
booted on first use. The run methods load the conversation machinery on first use, so a host
that only boots (registers budgets, opens storage) never pays for it.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

from datamachine.model_requests import (
    guard_astream,
    guard_stream,
    raise_if_refused,
    refuse_before_run,
)
from datamachine.services import Services

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable, Iterator

    from datamachine.conversation.result import ConversationResult
    from datamachine.conversation.stream import StreamEvent

logger = logging.getLogger("datamachine")

__all__ = ["Host", "with_output_type"]


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
        from datamachine.conversation.run import ConversationRun

        name = self.default_provider(provider)
        run = ConversationRun.create(self, messages, tools, name, self.default_model(model),
                                     mode, with_output_type(payload, output_type), max_turns,
                                     single_turn)
        refuse_before_run(self, name)
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
        from datamachine.conversation.run import ConversationRun

        name = self.default_provider(provider)
        run = ConversationRun.create(self, messages, tools, name, self.default_model(model),
                                     mode, with_output_type(payload, output_type), max_turns,
                                     single_turn)
        refuse_before_run(self, name)
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
        from datamachine.conversation.continuation import continuation_steps

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

        refuse_before_run(self, self.default_provider(provider))
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

        refuse_before_run(self, self.default_provider(provider))
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
        from datamachine.conversation.continuation import continuation_steps

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
        run stops (see ``datamachine.conversation.resume``). ``tools=None``: the paused run's
        tools by name; ``payload``: runtime options for the resumed run; ``pause_id``: answer
        only that pause (``result.pending["pause_id"]``), else SessionNotPaused: a person's
        answer to a question shown earlier never answers the next one."""
        from agents_api.drive import drive_sync
        from datamachine.conversation.resume import resume_steps

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
        from datamachine.conversation.resume import resume_steps

        return raise_if_refused(await drive_async(resume_steps(
            self, session_id, approve, extend_by, tools, payload, pause_id=pause_id)))

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
        if getattr(self, "_closed", False):
            return
        self._closed = True
        queue = getattr(self, "_job_queue_opened", None)
        if queue is not None:  # the job queue's connections (datamachine.job_queue)
            with contextlib.suppress(Exception):
                queue.close()
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
