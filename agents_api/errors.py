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
