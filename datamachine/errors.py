"""The error hierarchy of the product layer.

``DataMachineError`` is the one root. "You used it wrong" errors (bad budget values, unknown
providers, bad plugins) are separate classes from "the run failed" errors, and every message says
what to change. HTTP statuses and click exit codes are chosen only at the edges (CLI, server).
"""

from __future__ import annotations

__all__ = [
    "BootError",
    "DataMachineError",
    "DatabaseError",
    "DuplicateBudgetError",
    "InvalidBudgetSpec",
    "InvalidBudgetValue",
    "InvalidSetting",
    "PluginLoadError",
    "SessionAborted",
    "UsageError",
]


class DataMachineError(Exception):
    """Root of every error raised by ``datamachine``."""


class UsageError(DataMachineError, ValueError):
    """An argument to a public entry point is invalid; the message names it and the fix.

    Raised before any provider call, transcript write or job change.
    """


class InvalidBudgetSpec(UsageError):
    """A budget registration breaks ``1 <= min <= default <= max <= 10_000`` (field named)."""


class InvalidBudgetValue(UsageError):
    """A user-supplied ceiling (``max_turns``, a budget setting) is not a positive integer
    no larger than 10,000. The message names the knob."""


class InvalidSetting(UsageError):
    """A setting key or value cannot be stored (for example a value that is not JSON)."""


class BootError(DataMachineError, RuntimeError):
    """The host could not start: a plugin failed to load or registrations conflict."""


class DuplicateBudgetError(BootError):
    """Two plugins (or a plugin and the built-ins) registered the same budget name."""


class PluginLoadError(BootError):
    """An entry point could not be imported, or a hookimpl does not match any hookspec."""


class DatabaseError(DataMachineError, RuntimeError):
    """The database file cannot be opened or migrated; the message names the path."""


class SessionAborted(DataMachineError):
    """A chat session reached its turn limit without confirmation and refuses new messages."""
