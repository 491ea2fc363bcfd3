"""One place that turns whatever a provider turn produced into a clean ProviderResponse.

Both built-in providers pass their answer through :func:`normalize_response` before returning,
and the adapter should pass ``text_result`` hook answers (a compact dict or a ProviderResponse)
through it too, so every turn the loop sees has the same guarantees:

* ``tool_calls`` are ``{"id", "name", "parameters"}`` with a non-empty name, an id
  (``call_<turn>_<n>`` when the model gave none) and a dict of parameters, or, when the model's
  arguments are not a JSON object, those arguments as text: the tool executor answers such a
  call with an ``invalid_arguments`` result the model can correct, so a bad call never ends
  the run;
* when there are no structured calls, calls written as text are extracted
  (:mod:`datamachine.providers.text_tool_calls`); ``content`` is left as the model wrote it, so
  the transcript stays an honest record of the answer;
* ``usage`` keeps only top-level numbers (nested details such as ``prompt_tokens_details`` are
  dropped) because the run's usage is a sum over turns; a number that cannot be true (a
  negative, fractional, NaN or bool token count, anything above 10^12; see
  :func:`agents_api.usage.plausible_usage`) is left out as not reported and named in
  ``ignored_usage``, so the run's meter falls back to its estimate and the run warns once;
* ``finish_reason`` defaults to ``"tool_calls"`` or ``"stop"``.

Anything that cannot be made valid raises :class:`~datamachine.errors.ProviderError` with code
``provider_bad_response`` and the reason, which the adapter reports as a failed turn. Calling it
twice gives the same result.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agents_api.jsontext import compact_json
from agents_api.usage import plausible_usage
from datamachine.errors import ProviderError
from datamachine.providers.base import ProviderResponse
from datamachine.providers.text_tool_calls import extract_text_tool_calls

__all__ = ["normalize_response", "numeric_usage"]


def numeric_usage(usage: Mapping[str, Any] | None) -> dict[str, int | float]:
    """The top-level numbers of a usage mapping that can be true (see
    :func:`agents_api.usage.plausible_usage`; booleans are not numbers here)."""
    if not usage:
        return {}
    return plausible_usage(usage)[0]


class _Invalid(Exception):
    """Where a response is invalid (``tool_calls.0.name: ...``), for the ProviderError."""


def _content(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _Invalid(f"content: must be text, got {type(value).__name__}")
    return value


def _call(raw: Any, turn: int, index: int) -> dict[str, Any]:
    where = f"tool_calls.{index - 1}"
    if not isinstance(raw, Mapping):
        raise _Invalid(f"{where}: must be an object with a name, got {type(raw).__name__}")
    name = raw.get("name", raw.get("tool_name"))
    if not isinstance(name, str) or not name.strip():
        raise _Invalid(f"{where}.name: must be a non-empty string, got {name!r}")
    parameters = raw.get("parameters")
    if parameters is None:
        parameters = {}
    if isinstance(parameters, Mapping):
        parameters = dict(parameters)
    elif not isinstance(parameters, str):
        # Kept as text, like arguments a provider could not decode: the executor explains.
        parameters = compact_json(parameters)
    call_id = raw.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise _Invalid(f"{where}.id: must be a string, got {type(call_id).__name__}")
    return {"id": call_id or f"call_{turn}_{index}", "name": name.strip(),
            "parameters": parameters}


def _calls(value: Any, turn: int) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise _Invalid(f"tool_calls: must be a list, got {type(value).__name__}")
    return [_call(raw, turn, index) for index, raw in enumerate(value, start=1)]


def _parts(response: Any) -> tuple[Any, Any, Any, Any, Any, Any]:
    if isinstance(response, ProviderResponse):
        return (response.content, response.tool_calls, response.usage, response.finish_reason,
                response.raw, response.ignored_usage)
    return (response.get("content"), response.get("tool_calls"), response.get("usage"),
            response.get("finish_reason"), response.get("raw"), None)


def normalize_response(
    response: ProviderResponse | Mapping[str, Any],
    *,
    provider: str = "",
    turn: int = 1,
) -> ProviderResponse:
    """A clean :class:`ProviderResponse` from a response object or a compact dict.

    A compact dict is ``{"content", "tool_calls": [{"id"?, "name", "parameters"}], "usage"}``
    (``finish_reason`` and ``raw`` optional; other keys ignored; ``tool_name`` is accepted for
    ``name``). ``provider`` and ``turn`` only label errors and generated ids.
    """
    if not isinstance(response, ProviderResponse | Mapping):
        raise ProviderError(
            f"Provider {provider or '?'} returned {type(response).__name__}, not a response: "
            "return a ProviderResponse or a dict with 'content', 'tool_calls' and 'usage'.",
            code="provider_bad_response", provider=provider,
        )
    content, raw_calls, usage, finish, raw, ignored_before = _parts(response)
    try:
        text = _content(content)
        calls = _calls(raw_calls, turn)
        if finish is not None and not isinstance(finish, str):
            raise _Invalid(f"finish_reason: must be a string, got {type(finish).__name__}")
        if usage is not None and not isinstance(usage, Mapping):
            raise _Invalid(f"usage: must be an object, got {type(usage).__name__}")
    except _Invalid as exc:
        raise ProviderError(
            f"Provider {provider or '?'} returned an invalid response ({exc}).",
            code="provider_bad_response", provider=provider,
        ) from None
    if not calls and text:
        calls = extract_text_tool_calls(text)
    kept, ignored = plausible_usage(usage) if usage else ({}, None)
    if ignored_before:  # normalized twice: what the first pass left out stays named
        ignored = {**ignored_before, **(ignored or {})}
    failed = response.failed_attempts if isinstance(response, ProviderResponse) else ()
    return ProviderResponse(content=text, tool_calls=calls, usage=kept,
                            finish_reason=finish or ("tool_calls" if calls else "stop"),
                            raw=raw, ignored_usage=dict(ignored) if ignored else None,
                            failed_attempts=failed)
