"""``run -c`` / ``run --cid ID``: which stored transcript a command-line run continues, and
the continued run's starting point, read under the transcript's lock.

As ``llm -c`` continues the most recently started conversation, ``run -c`` continues the
transcript of the most recent ``run`` that *started* a conversation from the command line:
``run`` marks the first user message of a conversation it starts (message metadata
``started_by: "datamachine run"``), so runs of an application, ``/chat`` callers, jobs and chat
sessions sharing the database are never picked by ``-c``. ``--cid`` takes any transcript's id
or a unique prefix of it (a chat session's is refused: ``datamachine chat --session`` keeps its
turn limit).

The continued run takes the transcript's lock *before* it reads the stored history (nothing can
change it meanwhile) and hands the held lock to the run (``agents_api.HeldLock``), which stores
its turns in that transcript; provider, model and mode default to the ones it recorded.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from datamachine.errors import (
    ChatSessionNotFound,
    DataMachineError,
    TranscriptNotFound,
    UsageError,
)
from datamachine.payload_keys import DEFAULT_LOCK_TTL

if TYPE_CHECKING:
    from agents_api import HeldLock

__all__ = ["STARTED_BY", "Continued", "continued", "find_transcript", "latest_started_here",
           "started_here"]

# The metadata ``run`` puts on the first user message of a conversation it starts.
STARTED_BY = {"started_by": "datamachine run"}
# How many transcripts ``-c`` looks through, newest first, for one ``run`` started.
SCAN_LIMIT = 1000
_PAGE = 100


def started_here(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` (a plain user message) marked as starting a conversation from ``run``."""
    return {**message, "metadata": {**message.get("metadata", {}), **STARTED_BY}}


def _was_started_here(host: Any, session_id: str) -> bool:
    try:
        first = host.transcripts.numbered(session_id, limit=4)
    except TranscriptNotFound:
        return False
    for _, _, envelope in first:
        if envelope.get("role") == "user":
            metadata = envelope.get("metadata")
            return isinstance(metadata, dict) and all(
                metadata.get(key) == value for key, value in STARTED_BY.items())
    return False


def latest_started_here(host: Any, scan: int = SCAN_LIMIT) -> str | None:
    """The id of the transcript of the most recent ``run`` that started a conversation from
    the command line (the most recently *created* one, as ``llm -c`` picks), among the
    ``scan`` most recently updated transcripts; None when there is none."""
    best: tuple[float, str] | None = None
    after: str | None = None
    seen = 0
    while seen < scan:
        page = host.transcripts.page(limit=_PAGE, after=after)
        for summary in page.items:
            if best is not None and summary.updated_at < best[0]:
                # Listed by last update: no transcript further down was created later.
                return best[1]
            if (summary.token_name is None and (best is None or summary.created_at > best[0])
                    and _was_started_here(host, summary.id)):
                best = (summary.created_at, summary.id)
        seen += len(page.items)
        if page.next is None:
            break
        after = page.next
    return best[1] if best is not None else None


def find_transcript(host: Any, cid: str | None) -> str | None:
    """The transcript ``--cid`` (a whole id or a unique prefix) names, else (``-c``) the one
    :func:`latest_started_here` finds. An unknown or ambiguous ``cid`` is a UsageError (exit
    2, nothing runs); a chat session's id too."""
    if cid is None:
        return latest_started_here(host)
    try:
        session_id: str = host.transcripts.resolve(cid)
    except TranscriptNotFound:
        raise UsageError(f"--cid: no transcript id starts with {cid!r}; `datamachine "
                         "transcripts list` shows them.") from None
    try:
        host.chat_sessions.get(session_id)
    except ChatSessionNotFound:
        return session_id
    raise UsageError(f"--cid: {session_id} is a chat session; continue it with `datamachine "
                     f"chat --session {session_id}`, which keeps its turn limit.")


@dataclass(frozen=True)
class Continued:
    """Where a continued run starts: the stored messages (read under the lock) and what the
    transcript recorded."""

    session_id: str
    messages: list[dict[str, Any]]
    provider: str | None
    model: str | None
    mode: str | None
    lock: HeldLock


@contextmanager
def continued(host: Any, session_id: str,
              ttl: int = DEFAULT_LOCK_TTL) -> Iterator[Continued]:
    """Take ``session_id``'s lock, then read it; the lock is freed on leaving (the run frees
    it itself when it ends). Another run holding it is an error (exit 1); a paused run is a
    UsageError saying how to answer it."""
    from agents_api import HeldLock

    token = host.transcripts.acquire(session_id, ttl)
    if token is None:
        raise DataMachineError(f"Transcript {session_id} is busy with another run; retry when "
                               "it ends.")
    try:
        summary = host.transcripts.summary(session_id)
        if summary.status == "awaiting_confirmation":
            raise UsageError(f"Transcript {session_id} is paused awaiting confirmation: answer "
                             f"it first with `datamachine resume {session_id} --approve` (or "
                             "--decline).")
        yield Continued(session_id=session_id, messages=host.transcripts.get(session_id),
                        provider=summary.provider, model=summary.model, mode=summary.mode,
                        lock=HeldLock(host.transcripts, session_id, token))
    finally:
        host.transcripts.release(session_id, token)  # a no-op once the run released it
