"""One place that turns whatever a provider turn produced into a clean ProviderResponse.

Both built-in providers pass their answer through :func:`normalize_response` before returning,
and the adapter should pass ``text_result`` hook answers (a compact dict or a ProviderResponse)
through it too, so every turn the loop sees has the same guarantees:

* ``tool_calls`` are ``{"id", "name", "parameters"}`` with a non-empty name, a dict of
  parameters and an id (``call_<turn>_<n>`` when the model gave none);
* when there are no structured calls, calls written as text are extracted
  (:mod:`datamachine.providers.text_tool_calls`); ``content`` is left as the model wrote it, so
  the transcript stays an honest record of the answer;
* ``usage`` keeps only top-level numbers (nested details such as ``prompt_tokens_details`` are
  dropped) because the run's usage is a sum over turns;
* ``finish_reason`` defaults to ``"tool_calls"`` or ``"stop"``.

Anything that cannot be made valid raises :class:`~datamachine.errors.ProviderError` with code
``provider_bad_response`` and the reason, which the adapter reports as a failed turn. Calling it
twice gives the same result.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from agents_api.construct import construct_all
from datamachine.errors import ProviderError
from datamachine.providers.base import ProviderResponse
from datamachine.providers.text_tool_calls import extract_text_tool_calls

__all__ = ["already_normal", "normal_response", "normalize_response", "numeric_usage"]


class _CompactToolCall(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="ignore")

    id: str | None = None
    name: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
    parameters: dict[str, Any] = Field(default_factory=dict)


class _CompactResponse(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="ignore")

    content: str | None = ""
    tool_calls: list[_CompactToolCall] | None = None
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    raw: Any = None


def numeric_usage(usage: Mapping[str, Any] | None) -> dict[str, int | float]:
    """The top-level numeric entries of a usage mapping (booleans are not numbers here)."""
    if not usage:
        return {}
    return {str(k): v for k, v in usage.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


def _describe(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "response"
    return f"{where}: {error['msg']}"


def normalize_response(
    response: ProviderResponse | Mapping[str, Any],
    *,
    provider: str = "",
    turn: int = 1,
) -> ProviderResponse:
    """A validated :class:`ProviderResponse` from a response object or a compact dict.

    A compact dict is ``{"content", "tool_calls": [{"id"?, "name", "parameters"}], "usage"}``
    (``finish_reason`` and ``raw`` optional; other keys ignored). ``provider`` and ``turn`` only
    label errors and generated ids.
    """
    data: Any = response.model_dump() if isinstance(response, ProviderResponse) else response
    if not isinstance(data, Mapping):
        raise ProviderError(
            f"Provider {provider or '?'} returned {type(data).__name__}, not a response: return "
            "a ProviderResponse or a dict with 'content', 'tool_calls' and 'usage'.",
            code="provider_bad_response", provider=provider,
        )
    calls_in = data.get("tool_calls")
    if isinstance(calls_in, list):
        # Accept the loop's alias "tool_name" for hook authors who copy a transcript entry.
        data = {**data, "tool_calls": [
            {**c, "name": c["tool_name"]} if isinstance(c, Mapping) and "name" not in c
            and "tool_name" in c else c for c in calls_in]}
    try:
        parsed = _CompactResponse.model_validate(data)
    except ValidationError as exc:
        raise ProviderError(
            f"Provider {provider or '?'} returned an invalid response ({_describe(exc)}).",
            code="provider_bad_response", provider=provider,
        ) from None

    content = parsed.content or ""
    calls = [{"id": call.id or f"call_{turn}_{index}", "name": call.name,
              "parameters": call.parameters}
             for index, call in enumerate(parsed.tool_calls or [], start=1)]
    if not calls and content:
        calls = extract_text_tool_calls(content)
    finish_reason = parsed.finish_reason or ("tool_calls" if calls else "stop")
    return ProviderResponse(content=content, tool_calls=calls, usage=numeric_usage(parsed.usage),
                            finish_reason=finish_reason, raw=parsed.raw)


def already_normal(answer: ProviderResponse) -> ProviderResponse | None:
    """What ``normalize_response(answer)`` returns, when ``answer`` is already in normal form.

    Providers normalize their own answers (both built-in ones do), and normalizing again through
    pydantic costs a dump and two validations per turn for nothing. The checks in
    :func:`normal_response` mirror ``normalize_response``'s rules; a response they do not cover
    (a missing id, a padded name, a non-numeric usage entry, anything unusual) returns None and
    takes the full path.
    """
    return normal_response(answer.content, answer.tool_calls, answer.usage,
                           answer.finish_reason, answer.raw)


def normal_response(content: Any, calls: Any, usage: Any, finish: Any, raw: Any, *,
                    owned: bool = False) -> ProviderResponse | None:
    """A :class:`ProviderResponse` from parts already in normal form, else None.

    ``owned=True`` says the caller built ``calls`` and ``usage`` for this response alone, so
    they are used as they are instead of copied.
    """
    if (type(content) is not str or type(calls) is not list or type(usage) is not dict
            or (finish is not None and type(finish) is not str)):
        return None
    for call in calls:
        if type(call) is not dict or len(call) != 3:
            return None
        call_id, name, params = call.get("id"), call.get("name"), call.get("parameters")
        if (type(call_id) is not str or not call_id or type(name) is not str or not name
                or name != name.strip() or type(params) is not dict
                or any(type(key) is not str for key in params)):
            return None
    for key, value in usage.items():
        if type(key) is not str or type(value) not in (int, float):
            return None
    if not calls:
        calls = [dict(call) for call in extract_text_tool_calls(content)] if content else []
    elif not owned:
        calls = [{"id": call["id"], "name": call["name"], "parameters": dict(call["parameters"])}
                 for call in calls]
    return construct_all(ProviderResponse, {
        "content": content, "tool_calls": calls, "usage": usage if owned else dict(usage),
        "finish_reason": finish or ("tool_calls" if calls else "stop"), "raw": raw,
    })
