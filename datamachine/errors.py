"""The error hierarchy of the product layer.

``DataMachineError`` is the one root. "You used it wrong" errors (bad budget values, unknown
providers, bad plugins) are separate classes from "the run failed" errors, and every message says
what to change. HTTP statuses and click exit codes are chosen only at the edges (CLI, server).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import ValidationError

__all__ = [
    "AmbiguousIdPrefix",
    "BootError",
    "CallNotInDoubt",
    "ChainCycle",
    "ChainDepthExceeded",
    "ChatSessionExists",
    "ChatSessionNotFound",
    "DataMachineError",
    "DatabaseError",
    "DuplicateBudgetError",
    "DuplicateProviderError",
    "DuplicateSettingError",
    "DuplicateTokenName",
    "DuplicateToolError",
    "InvalidBudgetSpec",
    "InvalidBudgetValue",
    "InvalidCallerContext",
    "InvalidCompletionAssertions",
    "InvalidCompletionPolicy",
    "InvalidJobTransition",
    "InvalidScript",
    "InvalidSetting",
    "InvalidSettingSpec",
    "InvalidTokenName",
    "InvalidToolDefinition",
    "InvalidToolRuntimeRule",
    "JobNotFound",
    "ModelRequestsDisabled",
    "PluginLoadError",
    "ProviderError",
    "RecordNotFound",
    "RequestTooLarge",
    "ScriptExhausted",
    "SessionAborted",
    "SessionAwaitingConfirmation",
    "SessionNotPaused",
    "SiteMisconfigured",
    "TranscriptNotFound",
    "UnknownProvider",
    "UsageError",
    "first_field_error",
]


class DataMachineError(Exception):
    """Root of every error raised by ``datamachine``."""


class UsageError(DataMachineError, ValueError):
    """An argument to a public entry point is invalid; the message names it and the fix.

    Raised before any provider call, transcript write or job change. ``field``: the argument
    or request field at fault when one alone is (``"mode"``), for an answer that lists fields
    (``/chat``'s 422 ``data.errors``); None when the message is all there is.
    """

    field: str | None = None

    def __init__(self, *args: object, field: str | None = None) -> None:
        super().__init__(*args)
        if field is not None:
            self.field = field


class InvalidBudgetSpec(UsageError):
    """A budget registration breaks ``0 <= min <= default <= max`` or its unit's limit (10,000
    for a count; the field is named)."""


class InvalidBudgetValue(UsageError):
    """A user-supplied ceiling (``max_turns``, a budget setting) is not a positive integer
    no larger than 10,000. The message names the knob."""


class InvalidSetting(UsageError):
    """A setting key or value cannot be stored (for example a value that is not JSON)."""


class InvalidSettingSpec(UsageError):
    """A setting declaration (``SettingSpec``) is malformed, or its default fails its own
    check; the message names the setting and the field."""


class BootError(DataMachineError, RuntimeError):
    """The host could not start: a plugin failed to load or registrations conflict."""


class DuplicateBudgetError(BootError):
    """Two plugins (or a plugin and the built-ins) registered the same budget name."""


class DuplicateSettingError(BootError):
    """Two plugins (or a plugin and the core, or a declaration and a budget's setting) declared
    the same setting name; the message names both. ``host.settings.declare`` raises it too, for
    a name another owner declared."""


class PluginLoadError(BootError):
    """A plugin given to ``boot(plugins=...)`` does not fit (a hookimpl that matches no
    hookspec), or a plugin's registration hook returned something unusable."""


class PayloadKeyWarning(UserWarning):
    """A payload key nearly spells a runtime option (``persist_transcipt``): it is passed on as
    ordinary context, and the option it was meant to set keeps its default."""


class PluginLoadWarning(UserWarning):
    """An installed plugin (an entry point) failed to load and was skipped: one broken package
    must not take the command line, ``--help`` included, or the host app down with it. Turn it
    into an error with ``-W error::datamachine.PluginLoadWarning`` (or a warnings filter)."""


class DatabaseError(DataMachineError, RuntimeError):
    """The database file cannot be opened or migrated; the message names the path."""


class SessionAborted(DataMachineError):
    """A chat session reached its turn limit without confirmation and refuses new messages."""


class SessionAwaitingConfirmation(DataMachineError):
    """A message or a continuation was sent to a session whose run is paused, waiting for a
    person's answer: answer it first with ``host.resume(session_id, approve)``."""

    code = "session_awaiting_confirmation"

    def __init__(self, message: str, *, session_id: str, pending: dict[str, Any]) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.pending = pending


class SessionNotPaused(DataMachineError):
    """``resume`` was asked of a session that is not waiting for an answer."""

    code = "session_not_paused"

    def __init__(self, message: str, *, session_id: str, status: str) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.status = status


class CallNotInDoubt(DataMachineError):
    """``resolve`` named a call whose outcome is not in doubt: never stored as an intent, or
    settled already (its result is stored). ``in_doubt``: the session's calls that are."""

    code = "call_not_in_doubt"

    def __init__(self, message: str, *, session_id: str, call_id: str,
                 in_doubt: list[str]) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.call_id = call_id
        self.in_doubt = in_doubt


class UnknownProvider(UsageError):
    """A run named a provider no plugin registered; the message lists the registered names."""

    field = "provider"


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
    ``scripted_error``, ``provider_stream_error``, ``context_overflow``: the prompt is longer
    than the model's context window); ``status`` is the HTTP status for HTTP
    errors, else None; ``provider`` is the provider name; ``attempts`` is how many requests were
    sent; ``failed_attempts`` the ones before the last that failed and were retried
    (``datamachine.providers.base.FailedAttempt``); ``partial_content`` is the text a stream
    delivered before it broke. ``retries_spent``: the request failed in a way worth retrying
    but its ``provider_retries`` budget had none left (the run then stops on that budget).
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "provider_error",
        provider: str = "",
        status: int | None = None,
        attempts: int = 0,
        partial_content: str = "",
        failed_attempts: tuple[Any, ...] = (),
        context_window: int | None = None,
        prompt_tokens: int | None = None,
        retries_spent: bool = False,
    ) -> None:
        super().__init__(message)
        self.retries_spent = retries_spent
        self.code = code
        self.provider = provider
        self.status = status
        self.attempts = attempts
        self.failed_attempts = failed_attempts
        # A streamed answer broken mid-way: the text that had arrived (``provider_stream_error``).
        self.partial_content = partial_content
        # A prompt too long for the model (``context_overflow``): the window and the prompt's
        # tokens, when the provider's answer says them.
        self.context_window = context_window
        self.prompt_tokens = prompt_tokens


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


class AmbiguousIdPrefix(UsageError):
    """An id typed as its first characters (``transcripts.resolve``, ``chat_sessions.resolve``,
    every id argument of the command line) starts more than one stored id.

    ``prefix`` is what was typed, ``matches`` the first few ids it starts (sorted); the message
    lists them: type more of the id.
    """

    def __init__(self, message: str, *, prefix: str, matches: list[str]) -> None:
        super().__init__(message)
        self.prefix = prefix
        self.matches = matches


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


class InvalidCallerContext(UsageError):
    """An agent-to-agent caller header (``X-Datamachine-Chain-Depth`` and friends) is malformed.

    Raised by the ``/chat`` endpoint before any work; ``header`` names the offending header so
    the server can answer 400 naming it. Fix the calling site's outbound headers.
    """

    def __init__(self, message: str, *, header: str) -> None:
        super().__init__(message)
        self.header = header


class ChainDepthExceeded(DataMachineError):
    """An agent-to-agent call would land deeper than this site's ``chain_depth`` ceiling.

    Raised before any work, so nothing runs and nothing is stored; the server answers 429 with
    ``retry_after``. Raise the setting ``max_chain_depth`` (clamped to [1, 10]) on the receiving
    site if the chain is meant to be that deep.
    """

    def __init__(self, message: str, *, chain_id: str, chain_depth: int, ceiling: int,
                 retry_after: int) -> None:
        super().__init__(message)
        self.chain_id = chain_id
        self.chain_depth = chain_depth
        self.ceiling = ceiling
        self.retry_after = retry_after


class ChainCycle(DataMachineError):
    """An agent-to-agent call would return to a site the chain already passed through.

    Raised before any work (the server answers 409 ``datamachine_chain_cycle``), whatever the
    depth: a cycle repeats until the depth budget stops it, so it is refused at the first return.
    """

    def __init__(self, message: str, *, chain_id: str, site_id: str,
                 chain_sites: list[str]) -> None:
        super().__init__(message)
        self.chain_id = chain_id
        self.site_id = site_id
        self.chain_sites = chain_sites


class RequestTooLarge(UsageError):
    """A ``/chat`` body is larger than the setting ``max_request_bytes`` (default 1 MiB)."""

    def __init__(self, message: str, *, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


class SiteMisconfigured(DataMachineError):
    """A site setting (stored or from the environment) cannot be used: a run would fail on it.

    The site's fault, not a caller's: ``datamachine serve`` refuses to start with it, and a
    ``/chat`` caller gets 503 ``site_misconfigured`` (worth retrying once an operator fixed it).
    ``setting`` is the key; the message says what it must be. The text stays on the server:
    callers are told only which setting is wrong.
    """

    def __init__(self, message: str, *, setting: str) -> None:
        super().__init__(message)
        self.setting = setting


class ModelRequestsDisabled(DataMachineError):
    """A run would have sent a request to a real model while the setting
    ``allow_model_requests`` is off (the ``dm_host`` fixture, or the pytest ini option
    ``datamachine_allow_model_requests = false``).

    Raised by every run entry point (``run_conversation``, its async and streamed twins,
    ``continue_conversation``, ``chat``, ``resume``) instead of returning a result, so a test
    that forgets to check ``result.status`` still fails. Only the providers that never leave
    the process answer with requests off (``scripted``, and ``datamachine.testing``'s ``test``
    and ``function``), and ``text_result`` hooks. ``provider`` names the provider that was
    refused; the message says how to answer instead or how to allow real requests. Raised
    before the run starts (nothing stored) unless a ``text_result`` hook was registered and
    declined the request.
    """

    def __init__(self, message: str, *, provider: str = "") -> None:
        super().__init__(message)
        self.provider = provider


class InvalidCompletionAssertions(UsageError):
    """``payload["completion_assertions"]`` cannot be evaluated.

    Raised before the run starts; the message names the field path, e.g.
    ``completion_assertions.minimum_successful_tool_counts.publish``. Unknown keys are not an
    error (they are reported in the result's ``warnings``); a value of the wrong type is, because
    guessing would silently weaken the assertion.
    """


class InvalidCompletionPolicy(UsageError):
    """``payload["completion_policy"]`` is not usable as a completion policy.

    Raised when one of its methods returns something other than an ``agents_api.Decision`` (a
    dict of its fields, or None for "no opinion"), or returns an awaitable: policies are
    called synchronously between turns.
    """


def first_field_error(exc: ValidationError) -> tuple[str, str, Any]:
    """The first problem of a pydantic ``ValidationError``: its dotted field (``""`` for the
    whole value), its message (without pydantic's ``"Value error, "`` prefix) and the value
    given; what every "setting 'x'['name'].field: message" error is written from."""
    error = exc.errors()[0]
    field = ".".join(str(part) for part in error["loc"])
    return field, str(error["msg"]).removeprefix("Value error, "), error.get("input")
