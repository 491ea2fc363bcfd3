"""What a booted host holds: :class:`Services`, the stores and registries a run works with.

The conversation modules take a ``Services`` and never import the host; ``Host`` (in
``datamachine.host``) is a ``Services`` with the run methods on top. Data flows one way: host ->
conversation -> services, so no module cycle holds the two together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

from datamachine.job_queue import JobQueue
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
    from sqlite_utils import Database

__all__ = ["Services"]


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
