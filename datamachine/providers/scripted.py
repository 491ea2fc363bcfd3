"""The ``scripted`` provider: a model that replays a script, for tests, demos and offline use.

A script is a list of responses, one per provider turn::

    [{"content": "Looking it up.", "tool_calls": [{"id": "c1", "name": "search",
                                                   "parameters": {"q": "pluggy"}}],
      "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}},
     {"content": "pluggy is a plugin system."}]

given in code or as a path to a JSON or YAML file holding that list. An entry may instead be
``{"error": "reason"}`` to make that turn fail, so failure paths can be scripted too. With no
script the provider answers ``"echo: <last user message>"`` with no tool calls, which is why
``chat`` and ``/chat`` work out of the box.

Per-run position. A script is consumed turn by turn *for one run*, so the position must not
live on the registered provider (two runs, or two turns of a chat session, would share it).
The adapter does, once per run::

    turn_provider = provider.start_run(runtime.get("script"))   # a ScriptCursor
    ...  # every turn of this run: turn_provider.complete(request)

:meth:`ScriptedProvider.start_run` returns a :class:`ScriptCursor` at position 0 over the run's
script (the payload's ``script`` when given, else the provider's own), which is itself a
provider (``name`` + ``complete``). Calling :meth:`ScriptedProvider.complete` directly uses one
cursor kept on the provider, which is what a test that holds the provider object wants
(``scripted_provider_for(script)`` builds such a provider). Every request, whichever way it
came, is appended to ``record`` (on the cursor and on the provider) so tests can assert exactly
what the model was asked. A record keeps the last :data:`RECORD_LIMIT` requests: the scripted
provider also answers a long-running ``datamachine serve``, where a record of every request
would grow without bound.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import cache, cached_property
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from datamachine.errors import InvalidScript, ProviderError, ScriptExhausted
from datamachine.providers.base import ProviderRequest, ProviderResponse
from datamachine.providers.normalize import normalize_response

__all__ = [
    "RECORD_LIMIT",
    "Script",
    "ScriptCursor",
    "ScriptSource",
    "ScriptedProvider",
    "ScriptedResponse",
    "ScriptedToolCall",
    "load_script",
    "scripted_provider_for",
]

# How many requests a record keeps (the newest); enough for any test, bounded for a server.
RECORD_LIMIT = 100

# The id of a scripted call that has none until a turn numbers it (``scripted-<turn>-<n>``).
_UNNUMBERED = "\x00unnumbered"


class ScriptedToolCall(BaseModel):
    """One scripted tool call; ``id`` defaults to ``scripted-<turn>-<n>``.

    ``parameters`` given as text play a model whose arguments did not decode: the call gets an
    ``invalid_arguments`` result, as it would from a real provider.
    """

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)

    id: str | None = None
    name: str = Field(min_length=1)
    parameters: dict[str, Any] | str = Field(default_factory=dict)


def _fresh(parameters: Any) -> Any:
    return dict(parameters) if type(parameters) is dict else parameters


class ScriptedResponse(BaseModel):
    """One scripted turn: what the model "says" (or ``error``: the turn fails with it).

    Unknown keys are refused so a typo (``tool_call``, ``arguments``) fails at load time instead
    of silently scripting a turn without calls.
    """

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True)

    content: str = ""
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    usage: dict[str, int | float] = Field(default_factory=dict)
    finish_reason: str | None = None
    error: str | None = None
    # Simulated model latency, for demos and for exercising Ctrl-C and wall-clock limits; the
    # scripted provider blocks for this long before answering.
    delay_seconds: float = Field(default=0.0, ge=0.0, le=3600.0)


class Script(BaseModel):
    """A validated script: its responses and where it came from (a file path, or None).

    Each response is normalized once per script, on first use (``normalized``): a turn only
    numbers the calls the script left without an id and copies what a run may change.
    """

    model_config = ConfigDict(defer_build=True, frozen=True)

    responses: tuple[ScriptedResponse, ...]
    source: str | None = None

    # A functools.cached_property rather than a pydantic PrivateAttr: every run reads it, and a
    # private attribute is read through BaseModel.__getattr__ (about 18 k instructions) while a
    # cached property is a plain instance attribute. Validated responses always normalize.
    @cached_property
    def normalized(self) -> tuple[ProviderResponse, ...]:
        """The responses as normalized provider answers (ids the script left out are
        ``_UNNUMBERED`` until a turn numbers them)."""
        return tuple(
            normalize_response({"content": entry.content,
                                "tool_calls": [{**call.model_dump(), "id": call.id or _UNNUMBERED}
                                               for call in entry.tool_calls],
                                "usage": entry.usage, "finish_reason": entry.finish_reason,
                                "raw": entry}, provider="scripted")
            for entry in self.responses)

    def __len__(self) -> int:
        return len(self.responses)


ScriptSource = Script | Sequence[ScriptedResponse | dict[str, Any]] | str | os.PathLike[str]
"""What a script may be given as: a Script, a list of responses, or a JSON/YAML file path."""


def _read_file(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidScript(f"Script file {str(path)!r} does not exist.") from None
    except OSError as exc:
        raise InvalidScript(f"Script file {str(path)!r} cannot be read: {exc}.") from None
    except UnicodeDecodeError as exc:
        raise InvalidScript(f"Script file {str(path)!r} is not UTF-8 text (byte {exc.start}): "
                            "save it as UTF-8 JSON or YAML.") from None
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except ValueError as exc:
            raise InvalidScript(f"Script file {str(path)!r} is not valid JSON: {exc}.") from None
    import yaml  # loaded only when a YAML script is used

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidScript(f"Script file {str(path)!r} is not valid YAML: {exc}") from None


def load_script(source: ScriptSource) -> Script:
    """Validate ``source`` into a :class:`Script`; raises :class:`InvalidScript` naming the entry.

    A path ending in ``.json`` is read as JSON, any other path as YAML (which also reads JSON).
    The error message names the file, the entry index and the field, for example
    ``Script file 'demo.yaml', entry 2: tool_calls.0.name: Field required``.
    """
    if isinstance(source, Script):
        return source
    label: str | None = None
    data: Any = source
    if isinstance(source, str | os.PathLike):
        label = os.fspath(source)
        data = _read_file(Path(label))
    where = f"Script file {label!r}" if label is not None else "Script"
    if isinstance(data, str | bytes) or not isinstance(data, Sequence):
        raise InvalidScript(
            f"{where} must be a list of responses ({{'content', 'tool_calls', 'usage'}}), "
            f"got {type(data).__name__}."
        )
    responses = []
    for index, entry in enumerate(data):
        if isinstance(entry, ScriptedResponse):
            responses.append(entry)
            continue
        if not isinstance(entry, dict):
            raise InvalidScript(
                f"{where}, entry {index}: must be a mapping like {{'content': '...'}}, "
                f"got {type(entry).__name__}."
            )
        try:
            responses.append(ScriptedResponse.model_validate(entry))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'entry'}: {err['msg']}"
                for err in exc.errors()
            )
            raise InvalidScript(f"{where}, entry {index}: {problems}.") from None
    return Script(responses=tuple(responses), source=label)


def _last_user_text(messages: Sequence[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):  # content parts: keep the text ones
                return " ".join(part.get("text", "") for part in content
                                if isinstance(part, dict) and isinstance(part.get("text"), str))
            return "" if content is None else str(content)
    return ""


@cache
def _copier() -> Callable[..., ProviderResponse]:
    """``agents_api.results.updated``, imported on first use: booting a host loads this module
    but not the loop's (see tests/test_boot_imports.py), and an import statement in
    :meth:`ScriptCursor.complete` would run on every answer."""
    from agents_api.results import updated

    return updated


class ScriptCursor:
    """One run's position in a script; a provider (``name`` + ``complete``) for that run.

    Built by :meth:`ScriptedProvider.start_run`. ``script=None`` means echo mode. ``record``
    lists the requests this cursor answered; ``position`` is how many responses it has used.
    """

    # Every answer comes out of normal_response/normalize_response: the turn runner need not
    # normalize it again.
    answers_normalized = True
    # Never leaves the process: it answers even where model requests are off (tests).
    answers_offline = True

    def __init__(
        self,
        script: Script | None,
        *,
        name: str = "scripted",
        shared_record: deque[ProviderRequest] | None = None,
    ) -> None:
        self.name = name
        self.script = script
        self._normalized = script.normalized if script is not None else ()
        self.position = 0
        self.record: deque[ProviderRequest] = deque(maxlen=RECORD_LIMIT)
        self._shared_record = shared_record

    @property
    def remaining(self) -> int | None:
        """Responses left, or None in echo mode (which never runs out)."""
        return None if self.script is None else len(self.script) - self.position

    def complete(self, request: ProviderRequest) -> ProviderResponse:
        """Answer one turn with the next scripted response (or the echo).

        Raises :class:`ScriptExhausted` when the script has no response left, and
        :class:`ProviderError` (code ``scripted_error``) for an ``{"error": ...}`` entry.
        """
        self.record.append(request)
        if self._shared_record is not None:
            self._shared_record.append(request)
        if self.script is None:
            # An echo is never a tool call, whatever the user's text holds.
            return ProviderResponse(content=f"echo: {_last_user_text(request.messages)}",
                                    finish_reason="stop")
        if self.position >= len(self.script.responses):
            length = len(self.script.responses)
            origin = f" (from {self.script.source})" if self.script.source else ""
            plural = "response" if length == 1 else "responses"
            raise ScriptExhausted(
                f"The {self.name} provider's script{origin} has {length} {plural} and this run "
                f"asked for response {self.position + 1} (turn {request.turn}). Add responses "
                "to the script, or end it with a response that has no tool calls.",
                provider=self.name, length=length,
            )
        entry = self.script.responses[self.position]
        self.position += 1
        if entry.delay_seconds:
            time.sleep(entry.delay_seconds)
        if entry.error is not None:
            raise ProviderError(entry.error, code="scripted_error", provider=self.name)
        normal = self._normalized[self.position - 1]
        # Fresh calls (a tool may change its parameters); the script's own ids, else numbered.
        calls = [{"id": f"scripted-{request.turn}-{index}" if call["id"] == _UNNUMBERED
                        else call["id"],
                  "name": call["name"], "parameters": _fresh(call["parameters"])}
                 for index, call in enumerate(normal.tool_calls, start=1)]
        return _copier()(normal, tool_calls=calls, usage=dict(normal.usage))


class ScriptedProvider:
    """The embedded default provider: replays a script, or echoes the last user message.

    ``ScriptedProvider(script)`` validates the script at construction (an :class:`InvalidScript`
    names the bad entry). See the module docstring for how runs get their own position.
    """

    answers_offline = True  # see ScriptCursor
    # No model is asked, so no model option means anything here.
    declared_options: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, script: ScriptSource | None = None, *, name: str = "scripted") -> None:
        self.name = name
        self.script: Script | None = None if script is None else load_script(script)
        self.record: deque[ProviderRequest] = deque(maxlen=RECORD_LIMIT)
        self._cursor: ScriptCursor | None = None

    def availability(self) -> Literal[True]:
        """Always available: nothing to configure, nothing to reach."""
        return True

    def start_run(self, script: ScriptSource | None = None) -> ScriptCursor:
        """A fresh cursor for one run: over ``script`` if given, else this provider's script."""
        chosen = self.script if script is None else load_script(script)
        return ScriptCursor(chosen, name=self.name, shared_record=self.record)

    def complete(self, request: ProviderRequest) -> ProviderResponse:
        """Answer with the provider-wide cursor (created on first use; see :meth:`reset`)."""
        if self._cursor is None:
            self._cursor = self.start_run()
        return self._cursor.complete(request)

    def reset(self) -> None:
        """Rewind the provider-wide cursor and forget recorded requests."""
        self._cursor = None
        self.record.clear()


def scripted_provider_for(script: ScriptSource | None, *, name: str = "scripted"
                          ) -> ScriptedProvider:
    """A new scripted provider replaying ``script`` (validated now), e.g. for a test plugin."""
    return ScriptedProvider(script, name=name)
