"""The storage of a host (SQLite, or PostgreSQL): settings, transcripts and their locks, jobs,
chat sessions, API tokens, spend windows; the driver and migrations under them.

Each store owns one table group and takes the database connection's lock for every use, so one
host can be shared across threads; every write is one ``BEGIN IMMEDIATE`` transaction, so several
processes can share one database file. See ``docs/storage.md``.
"""

from datamachine.storage.chat_sessions import (
    ChatSession,
    ChatSessionStore,
    MaxTurns,
)
from datamachine.storage.jobs import Job, JobOutcome, JobQueuing, JobStatus, JobStore
from datamachine.storage.locks import LockInfo, TranscriptLocks
from datamachine.storage.site_secrets import SiteSecretStore
from datamachine.storage.spend import SpendStore, WindowKey, WindowUse
from datamachine.storage.stored_settings import SettingsStore
from datamachine.storage.task_queue import TaskQueueStore
from datamachine.storage.tokens import ApiToken, TokenStore
from datamachine.storage.transcript_writer import TranscriptWriter
from datamachine.storage.transcripts import (
    Transcript,
    TranscriptPage,
    TranscriptStatus,
    TranscriptStore,
    TranscriptSummary,
)
from datamachine.storage.viewer_logins import ViewerLogin, ViewerLoginStore

__all__ = [
    "ApiToken",
    "ChatSession",
    "ChatSessionStore",
    "Job",
    "JobOutcome",
    "JobQueuing",
    "JobStatus",
    "JobStore",
    "LockInfo",
    "MaxTurns",
    "SettingsStore",
    "SiteSecretStore",
    "SpendStore",
    "TaskQueueStore",
    "TokenStore",
    "Transcript",
    "TranscriptLocks",
    "TranscriptPage",
    "TranscriptStatus",
    "TranscriptStore",
    "TranscriptSummary",
    "TranscriptWriter",
    "ViewerLogin",
    "ViewerLoginStore",
    "WindowKey",
    "WindowUse",
]
