"""How a run's transcript reaches storage: the protocols, and the one writer a run uses.

A run writes its session through one :class:`TranscriptWriter`: its starting messages
(``begin``), each finished turn (``append_turn``), a lock renewal before a stop handler's last
provider call (``renew``), the end of the run (``persist``) and the lock's release
(``release``). Where the writer comes from:

- the caller hands one over (``transcript_writer=``): the caller already holds the session's
  lock, typically because it had to read the stored history under it;
- the persister opens one (``open_writer(session_id, token, ttl)``) when it is also the lock:
  such a writer proves the lock in the same transaction that writes each turn;
- otherwise the loop adapts a plain persister and lock (the protocols of DESIGN.md section 10)
  into one: each turn is appended, then the lock renewed.

A writer that finds its lock taken over raises :class:`~agents_api.errors.LockLost` and
writes nothing of that turn; the loop then stops the run and writes nothing more.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agents_api.drive import awaitable
from agents_api.errors import LockLost

if TYPE_CHECKING:
    from agents_api.message import Message
    from agents_api.results import LoopResult

__all__ = ["HeldLock", "LegacyTranscript", "TranscriptLock", "TranscriptPersister",
           "TranscriptWriter"]

@runtime_checkable
class TranscriptPersister(Protocol):
    """Stores a run's transcript once at the end; may also offer ``begin`` and ``append_turn``
    (per-turn writes) and ``open_writer`` (a writer that proves the lock on every write)."""

    def persist(self, messages: list[Message], request: dict[str, object], result: LoopResult
                ) -> str:
        """Store the whole run and return its session id."""


@runtime_checkable
class TranscriptLock(Protocol):
    """Guarantees one writer per session; ``acquire`` never waits. May offer ``renew``."""

    def acquire(self, session_id: str, ttl: int) -> str | None:
        """Return a token, or None when another holder has an unexpired lock."""

    def release(self, session_id: str, token: str) -> bool:
        """Release the lock if ``token`` still holds it."""


@runtime_checkable
class TranscriptWriter(Protocol):
    """One run's writes to one session whose lock the writer holds (see the module docstring).

    Every method may return an awaitable instead of its value (an async store), so each
    returns ``object``: the loop awaits what can be awaited and reads only ``persist``'s
    answer (a session id when it is a non-empty string).
    """

    session_id: str

    def begin(self, messages: Sequence[Message], request: dict[str, object]) -> object:
        """Store the run's starting messages that are not stored yet."""

    def append_turn(self, turn: int, messages: Sequence[Message]) -> object:
        """Store one finished turn, all or nothing; LockLost if the lock was taken over."""

    def renew(self) -> object:
        """Extend the lock; LockLost if it was taken over."""

    def persist(self, messages: Sequence[Message], request: dict[str, object],
                result: LoopResult) -> object:
        """Store the end of the run; return the session id (or None to keep it)."""

    def release(self) -> object:
        """Give the lock back (no-op when ``persist`` already did)."""


class HeldLock:
    """A transcript lock the caller already took, handed to a run as its ``transcript_lock``.

    A caller that must read a session's stored history takes the lock first (so nothing can
    change under it), then runs the loop with this: ``acquire`` gives the held token for that
    session (the run does not contend with its own caller) and ``None`` for any other;
    ``renew`` and ``release`` go to the real lock.
    """

    def __init__(self, lock: TranscriptLock, session_id: str, token: str) -> None:
        self.lock = lock
        self.session_id = session_id
        self.token = token

    def acquire(self, session_id: str, ttl: int) -> str | None:
        """The held token for the held session; None (contention) for any other."""
        return self.token if session_id == self.session_id else None

    def renew(self, session_id: str, token: str, ttl: int) -> object:
        """Extend the held lock (when the real lock can)."""
        renew = getattr(self.lock, "renew", None)
        return True if renew is None else renew(session_id, token, ttl)

    def release(self, session_id: str, token: str) -> bool:
        """Release the held lock; a second release is a no-op."""
        return self.lock.release(session_id, token)


class LegacyTranscript:
    """A :class:`TranscriptWriter` over a plain persister and lock (either may be None)."""

    def __init__(self, persister: TranscriptPersister | None, lock: TranscriptLock | None,
                 session_id: str, token: str | None, ttl: int) -> None:
        self.persister = persister
        self.lock = lock
        self.session_id = session_id
        self.token = token
        self.ttl = ttl
        self._begin = getattr(persister, "begin", None)
        self._append = getattr(persister, "append_turn", None)
        self._renew = getattr(lock, "renew", None) if token is not None else None

    @property
    def writes_turns(self) -> bool:
        """Whether a finished turn has anything to do here (a write or a renewal)."""
        return self._append is not None or self._renew is not None

    def begin(self, messages: Sequence[Message], request: dict[str, object]) -> object:
        """The persister's ``begin``, when it has one."""
        if self._begin is None:
            return None
        return self._begin(self.session_id, messages, request)

    def append_turn(self, turn: int, messages: Sequence[Message]) -> object:
        """The persister's ``append_turn``, when it has one (the loop renews right after)."""
        if self._append is None:
            return None
        return self._append(self.session_id, turn, messages)

    def renew(self) -> object:
        """The lock's ``renew``; its ``False`` (taken over) becomes :class:`LockLost`."""
        if self._renew is None:
            return None
        answer = self._renew(self.session_id, self.token, self.ttl)
        if awaitable(answer):
            return _checked(answer, self.session_id)
        _check_renewed(answer, self.session_id)
        return None

    def persist(self, messages: list[Message], request: dict[str, object],
                result: LoopResult) -> object:
        """The persister's ``persist``."""
        if self.persister is None:
            return None
        return self.persister.persist(messages, request, result)

    def release(self) -> object:
        """The lock's ``release``."""
        if self.lock is None or self.token is None:
            return False
        return self.lock.release(self.session_id, self.token)


def _check_renewed(answer: object, session_id: str) -> None:
    if answer is False:
        raise LockLost(f"The transcript lock of session {session_id!r} was taken over by "
                       "another run (it expired); stopping so two runs never write one session.")


async def _checked(answer: Awaitable[object], session_id: str) -> None:
    _check_renewed(await answer, session_id)
