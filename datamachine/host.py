"""A booted host: one plugin manager, one database, one budget registry, isolated.

Two hosts in one process share nothing, which is what lets tests (and multi-tenant apps) run
side by side. ``bootstrap.boot()`` builds hosts; the module-level functions use a default host
booted on first use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy
from sqlite_utils import Database

from datamachine.plugins import PluginInfo, first_result, fold_value
from datamachine.registry import IterationBudgetRegistry
from datamachine.settings import Settings
from datamachine.storage import ChatSessionStore, JobStore, TokenStore, TranscriptStore

__all__ = ["Host"]


@dataclass(eq=False)
class Host:
    """Everything one datamachine instance owns. Build it with ``bootstrap.boot()``."""

    pm: pluggy.PluginManager
    db: Database
    settings: Settings
    budgets: IterationBudgetRegistry
    db_path: Path | None
    plugins: dict[str, PluginInfo] = field(default_factory=dict)
    # Storage (docs/storage.md): the default transcript persister and lock, jobs, chat sessions
    # and API tokens, all on ``db``.
    transcripts: TranscriptStore = field(kw_only=True)
    jobs: JobStore = field(kw_only=True)
    chat_sessions: ChatSessionStore = field(kw_only=True)
    tokens: TokenStore = field(kw_only=True)

    def fold(self, hook_name: str, value: Any, **kwargs: Any) -> Any:
        """Pass ``value`` through a value-filter hook (see ``plugins.fold_value``)."""
        return fold_value(self.pm, hook_name, value, **kwargs)

    def first(self, hook_name: str, **kwargs: Any) -> Any:
        """The first non-None answer of a firstresult hook."""
        return first_result(self.pm, hook_name, **kwargs)

    def close(self) -> None:
        """Close the database connection; the host is unusable afterwards."""
        self.db.conn.close()

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
