"""The error hierarchy of the generic loop.

Every error the substrate raises derives from :class:`AgentsAPIError`, so a host can catch
"anything the loop refused" in one place. Each subclass also derives from the matching builtin
(``ValueError``/``TypeError``) so ordinary ``except ValueError`` code keeps working.
"""

from __future__ import annotations

__all__ = [
    "AgentsAPIError",
    "InvalidBudget",
    "InvalidLoopArgument",
    "InvalidMessage",
    "InvalidTurnResult",
    "LockLost",
    "brief_repr",
]


class AgentsAPIError(Exception):
    """Root of every error raised by ``agents_api``."""


class InvalidMessage(AgentsAPIError, ValueError):
    """A message is neither a ``{"role", "content"}`` dict nor a valid envelope.

    Raised by :class:`agents_api.Message` and :func:`agents_api.normalize_messages`; the message
    names the offending index or field.
    """


class InvalidBudget(AgentsAPIError, ValueError):
    """An :class:`agents_api.IterationBudget` was built or extended with impossible values."""


class InvalidTurnResult(AgentsAPIError, TypeError):
    """A turn runner returned something that is not a ``TurnResult`` or a mapping of its fields."""


class InvalidLoopArgument(AgentsAPIError, ValueError):
    """``run_loop`` was called with arguments it cannot use (for example no turn runner)."""


class LockLost(AgentsAPIError, RuntimeError):
    """The run's transcript lock expired and another run took the session over.

    Raised by a transcript writer (or a lock's ``renew``) when a turn is about to be written
    without the lock; nothing of that turn is stored. The loop never lets it escape: the run
    stops with ``status="error"`` and ``error_code="transcript_lock_lost"`` and writes nothing
    more, so two runs never interleave one session. Raise a longer ``transcript_lock_ttl`` if
    single turns can outlast it.
    """

    code = "transcript_lock_lost"


def brief_repr(value: object, limit: int = 80) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters.

    A message names the bad value so the caller can find it, but the value is the caller's: it
    may be megabytes of text, or an integer so large that ``repr`` itself raises ``ValueError``
    (Python refuses to print integers of more than 4,300 digits). Either must never turn a
    clear refusal into a raw exception or a wall of digits.
    """
    if type(value) is int and value.bit_length() > 128:
        # log10(2) digits per bit: the size without converting the number to text.
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1:,} digits"
    try:
        text = repr(value)
    except Exception:  # a repr that raises must not hide the refusal it was for
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else text[:limit - 3] + "..."
