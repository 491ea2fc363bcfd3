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
    "DuplicateProviderError",
    "DuplicateToolError",
    "InvalidBudgetSpec",
    "InvalidBudgetValue",
    "InvalidScript",
    "InvalidSetting",
    "InvalidToolDefinition",
    "InvalidToolRuntimeRule",
    "PluginLoadError",
    "ProviderError",
    "ScriptExhausted",
    "SessionAborted",
    "UnknownProvider",
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


class UnknownProvider(UsageError):
    """A run named a provider no plugin registered; the message lists the registered names."""


class DuplicateProviderError(BootError):
    """Two plugins registered a provider under the same name; the message names both plugins."""


class InvalidScript(UsageError):
    """A scripted provider's script is not a list of valid responses.

    The message names the file (when there is one), the entry index and the offending field.
    """


class ProviderError(DataMachineError, RuntimeError):
    """A provider turn failed: the model could not be reached or answered something unusable.

    The adapter turns it into a structured error result (``status="error"``), keeping earlier
    turns. ``code`` says what kind of failure it was (``provider_http_error``,
    ``provider_timeout``, ``provider_connection_error``, ``provider_bad_response``,
    ``provider_bad_request``, ``provider_unavailable``, ``script_exhausted``,
    ``scripted_error``); ``status`` is the HTTP status for HTTP errors, else None;
    ``provider`` is the provider name; ``attempts`` is how many requests were sent.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "provider_error",
        provider: str = "",
        status: int | None = None,
        attempts: int = 0,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.provider = provider
        self.status = status
        self.attempts = attempts


class ScriptExhausted(ProviderError):
    """A scripted run asked for more turns than its script has responses.

    Its ``code`` is ``script_exhausted``; the message says how many responses the script had.
    """

    def __init__(self, message: str, *, provider: str = "scripted", length: int = 0) -> None:
        super().__init__(message, code="script_exhausted", provider=provider)
        self.length = length


class InvalidToolDefinition(UsageError):
    """A ``Tool`` (or a function given to ``@datamachine.tool``) cannot be offered to a model.

    Raised when the tool is defined: a missing or provider-unsafe ``name``, a ``parameters``
    schema that is not a JSON-schema object, a ``function`` that is not callable, or an unknown
    ``runtime`` value. The message names the tool and the field.
    """


class InvalidToolRuntimeRule(UsageError):
    """``payload["tool_runtime_rules"]`` holds a rule that cannot be evaluated.

    Raised before the run starts; the message names the rule index and the field, e.g.
    ``tool_runtime_rules[1].max_calls``.
    """


class DuplicateToolError(BootError):
    """Two plugins registered a tool under the same name; the message names both plugins."""


class RecordNotFound(DataMachineError, LookupError):
    """A stored record (transcript, job, chat session) with the given id does not exist."""


class TranscriptNotFound(RecordNotFound):
    """No transcript is stored under the session id (``host.transcripts.get``)."""


class JobNotFound(RecordNotFound):
    """No job has the id (``host.jobs.get`` and the job transitions)."""


class ChatSessionNotFound(RecordNotFound):
    """No chat session has the id (``host.chat_sessions.get`` and friends)."""


class ChatSessionExists(UsageError):
    """``chat_sessions.create(session_id=...)`` named an id that is already taken."""


class InvalidJobTransition(DataMachineError, ValueError):
    """A job was asked to move against ``pending`` -> ``running`` -> ``completed``/``failed``
    (for example completing a job that never started, or failing it twice)."""


class InvalidTokenName(UsageError):
    """An API token name is empty, too long or has characters other than letters, digits,
    ``.``, ``_`` and ``-``."""


class DuplicateTokenName(UsageError):
    """An active API token already has that name; revoke it first or pick another name."""
