"""A booted host: one plugin manager, one database, one budget registry, isolated.

Two hosts in one process share nothing, which is what lets tests (and multi-tenant apps) run
side by side. ``bootstrap.boot()`` builds hosts; the module-level functions use a default host
booted on first use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

from datamachine.db import DatabaseHandle
from datamachine.plugins import PluginInfo, first_result, fold_value
from datamachine.providers.registry import ProviderRegistry
from datamachine.registry import IterationBudgetRegistry
from datamachine.settings import Settings
from datamachine.storage import ChatSessionStore, JobStore, TokenStore, TranscriptStore
from datamachine.tools.registry import ToolRegistry

if TYPE_CHECKING:
    from sqlite_utils import Database

    from datamachine.conversation.result import ConversationResult

__all__ = ["Host"]


@dataclass(eq=False)
class Host:
    """Everything one datamachine instance owns. Build it with ``bootstrap.boot()``."""

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
    # and API tokens, all on ``db``.
    transcripts: TranscriptStore = field(kw_only=True)
    jobs: JobStore = field(kw_only=True)
    chat_sessions: ChatSessionStore = field(kw_only=True)
    tokens: TokenStore = field(kw_only=True)

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
    ) -> ConversationResult:
        """Run one bounded conversation on this host (see ``datamachine.run_conversation``)."""
        from datamachine.conversation.run import run_conversation_on

        return run_conversation_on(self, messages, tools, self._provider(provider),
                                   self._model(model), mode, payload, max_turns, single_turn)

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
    ) -> ConversationResult:
        """Async twin of :meth:`run_conversation`."""
        from datamachine.conversation.run import arun_conversation_on

        return await arun_conversation_on(self, messages, tools, self._provider(provider),
                                          self._model(model), mode, payload, max_turns,
                                          single_turn)

    def continue_conversation(
        self,
        session_id: str,
        extend_by: int,
        tools: Any = None,
        provider: str | None = None,
        model: str | None = None,
    ) -> ConversationResult:
        """Resume a stopped (or crash-interrupted) run with at most ``extend_by`` more turns."""
        from datamachine.conversation.continuation import continue_conversation_on

        return continue_conversation_on(self, session_id, extend_by, tools, provider, model)

    def chat(
        self,
        session_id: str,
        message: str,
        tools: Any = None,
        provider: str | None = None,
        model: str | None = None,
        *,
        payload: dict[str, Any] | None = None,
    ) -> ConversationResult:
        """One chat-mode run on a stored chat session, enforcing its turn limit.

        ``payload`` adds context and runtime options (an ``event_sink``, a ``script``) to the
        run; the session id is always the transcript id.
        """
        from datamachine.conversation.continuation import chat_on

        return chat_on(self, session_id, message, tools, provider, model, payload)

    def _provider(self, provider: str | None) -> Any:
        if provider is not None:
            return provider
        return self.settings.get("default_provider", "scripted")

    def _model(self, model: str | None) -> Any:
        if model is not None:
            return model
        return self.settings.get("default_model", "")

    def close(self) -> None:
        """Close the database connection; the host is unusable afterwards."""
        self.handle.conn.close()

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
