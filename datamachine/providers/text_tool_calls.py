"""Tool calls a model wrote as text instead of as structured calls.

Small local models (and some chat templates served through OpenAI-compatible servers) often
"call" a tool by writing markup into the answer instead of filling ``tool_calls``. Without this
fallback such a run would end after one turn with the markup as its final answer. Providers call
:func:`extract_text_tool_calls` only when a response carries no structured calls, so a model
that does use structured calls is never second-guessed.

Recognized forms, in any mix, reported in the order they appear in the text:

1. ``<function_calls><invoke name="x"><parameter name="p">v</parameter></invoke></function_calls>``
   (ids ``xml-tool-call-N``). Parameter values are text with XML entities decoded; a value
   written as a JSON object or array is decoded to that object or array. Scalars stay strings
   because without the tool's schema ``"5"`` and ``5`` cannot be told apart.
2. ``<tool_call>{json}</tool_call>``: one call (``{"name", "arguments" | "parameters"}`` or the
   OpenAI ``{"function": {"name", "arguments"}}``) or ``{"tool_calls": [...]}`` of those.
   Ids come from the JSON when given, else ``json-tool-call-B-C`` (block B, call C).
3. A fenced ```` ```json ```` block holding ``{"tool_calls": [...]}`` (ids as in 2, else
   ``fenced-tool-call-B-C``). A fenced block with a lone ``{"name": ...}`` object is *not* a
   call: answers routinely show JSON examples.
4. ``<tool_call name="x">{json parameters}</tool_call>`` (ids ``tag-tool-call-N``).

Calls are de-duplicated by tool name plus canonical JSON of the parameters (first one kept);
repeated ids get a ``-2``, ``-3`` suffix so results can still be paired with their calls.
Tool names must match ``[A-Za-z0-9_/.:-]{1,128}``; anything malformed is skipped, never raised:
garbage in gives nothing out. At most :data:`MAX_TEXT_TOOL_CALLS` calls and
:data:`MAX_PARAMETERS` parameters per XML call are read, and only the first
:data:`MAX_SCANNED_CHARS` characters are scanned, so a hostile answer cannot make this slow.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from typing import Any

from agents_api.jsontext import canonical_json

__all__ = [
    "MAX_PARAMETERS",
    "MAX_SCANNED_CHARS",
    "MAX_TEXT_TOOL_CALLS",
    "TOOL_NAME_PATTERN",
    "canonical_call_key",
    "extract_text_tool_calls",
]

MAX_TEXT_TOOL_CALLS = 16
MAX_PARAMETERS = 64
MAX_SCANNED_CHARS = 200_000
TOOL_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_/.:-]{1,128}$")

_FUNCTION_CALLS_OPEN = re.compile(r"<function_calls\s*>")
_INVOKE_OPEN = re.compile(r"""<invoke\s+name\s*=\s*["']([^"'<>]*)["']\s*>""")
_PARAMETER_OPEN = re.compile(r"""<parameter\s+name\s*=\s*["']([^"'<>]*)["']\s*>""")
_TOOL_CALL_OPEN = re.compile(r"""<tool_call(?:\s+name\s*=\s*["']([^"'<>]*)["'])?\s*>""")
_FENCE_OPEN = re.compile(r"```[ \t]*json[ \t]*\r?\n", re.IGNORECASE)
_CDATA = re.compile(r"^<!\[CDATA\[(.*)\]\]>$", re.DOTALL)


def canonical_call_key(name: str, parameters: Any) -> str:
    """``name`` plus the parameters as canonical JSON (sorted keys), for duplicate checks."""
    return name + "|" + canonical_json(parameters)


def extract_text_tool_calls(text: object) -> list[dict[str, Any]]:
    """Tool calls written as text in ``text``, as ``{"id", "name", "parameters"}`` dicts.

    Returns an empty list for anything that is not a string or holds no well-formed call.
    """
    if not isinstance(text, str) or ("<" not in text and "```" not in text):
        return []
    text = text[:MAX_SCANNED_CHARS]
    found: list[tuple[int, dict[str, Any]]] = []
    found.extend(_xml_calls(text))
    found.extend(_tool_call_tags(text))
    found.extend(_fenced_calls(text))
    found.sort(key=lambda item: item[0])  # stable: same position keeps parser order

    calls: list[dict[str, Any]] = []
    seen: set[str] = set()
    ids: set[str] = set()
    for _, call in found:
        key = canonical_call_key(call["name"], call["parameters"])
        if key in seen:
            continue
        seen.add(key)
        # Ids written by the model may repeat; the loop pairs results to calls by id.
        base, suffix = call["id"], 2
        while call["id"] in ids:
            call["id"] = f"{base}-{suffix}"
            suffix += 1
        ids.add(call["id"])
        calls.append(call)
        if len(calls) >= MAX_TEXT_TOOL_CALLS:
            break
    return calls


# -- scanning -------------------------------------------------------------------------------

def _blocks(text: str, opener: re.Pattern[str], closer: str,
            start: int = 0, end: int | None = None) -> Iterator[tuple[re.Match[str], str]]:
    """Each ``opener ... closer`` block in ``text[start:end]``: the opening match and the body.

    Uses ``str.find`` for the closer and resumes after it, so scanning stays linear even when a
    closer is missing (the scan stops there instead of retrying from every opener).
    """
    limit = len(text) if end is None else end
    pos = start
    while True:
        match = opener.search(text, pos, limit)
        if match is None:
            return
        close = text.find(closer, match.end(), limit)
        if close == -1:
            return
        yield match, text[match.end():close]
        pos = close + len(closer)


def _valid_name(name: object) -> str | None:
    if not isinstance(name, str):
        return None
    name = name.strip()
    return name if TOOL_NAME_PATTERN.fullmatch(name) else None


def _xml_value(raw: str) -> Any:
    value = raw.strip()
    cdata = _CDATA.match(value)
    value = cdata.group(1) if cdata else html.unescape(value)
    if value[:1] in ("{", "["):
        try:
            decoded = json.loads(value)
        except ValueError:
            return value
        if isinstance(decoded, dict | list):
            return decoded
    return value


def _xml_calls(text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    if "<function_calls" not in text:
        return
    number = 0
    for wrapper, _ in _blocks(text, _FUNCTION_CALLS_OPEN, "</function_calls>"):
        body_start = wrapper.end()
        body_end = text.find("</function_calls>", body_start)
        for invoke, body in _blocks(text, _INVOKE_OPEN, "</invoke>", body_start, body_end):
            name = _valid_name(html.unescape(invoke.group(1)))
            if name is None:
                continue
            parameters: dict[str, Any] = {}
            params_start = invoke.end()
            params_end = params_start + len(body)
            for param, raw in _blocks(text, _PARAMETER_OPEN, "</parameter>",
                                      params_start, params_end):
                key = html.unescape(param.group(1)).strip()
                if key and len(parameters) < MAX_PARAMETERS:
                    parameters[key] = _xml_value(raw)
            number += 1
            yield invoke.start(), {"id": f"xml-tool-call-{number}", "name": name,
                                   "parameters": parameters}


def _parameters(value: object) -> dict[str, Any] | None:
    """Call arguments as a dict: a dict, a JSON string of an object, or nothing (= {})."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def _json_call(item: object) -> tuple[str, dict[str, Any], str | None] | None:
    """(name, parameters, id) from one JSON call object, or None when it is not a call."""
    if not isinstance(item, dict):
        return None
    call_id = item.get("id") if isinstance(item.get("id"), str) and item.get("id") else None
    function = item.get("function")
    source: dict[str, Any] = function if isinstance(function, dict) else item
    name = _valid_name(source.get("name"))
    if name is None:
        return None
    raw = source["arguments"] if "arguments" in source else source.get("parameters")
    parameters = _parameters(raw)
    if parameters is None:
        return None
    return name, parameters, call_id


def _json_block_calls(body: str, id_prefix: str, *, require_list: bool
                      ) -> list[dict[str, Any]]:
    try:
        data = json.loads(body.strip())
    except ValueError:
        return []
    if isinstance(data, dict) and isinstance(data.get("tool_calls"), list):
        items: list[Any] = data["tool_calls"]
    elif require_list:
        return []
    else:
        items = [data]
    calls = []
    for index, item in enumerate(items[:MAX_TEXT_TOOL_CALLS], start=1):
        parsed = _json_call(item)
        if parsed is None:
            continue
        name, parameters, call_id = parsed
        calls.append({"id": call_id or f"{id_prefix}-{index}", "name": name,
                      "parameters": parameters})
    return calls


def _tool_call_tags(text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    if "<tool_call" not in text:
        return
    json_blocks = 0
    named = 0
    for opener, body in _blocks(text, _TOOL_CALL_OPEN, "</tool_call>"):
        if opener.group(1) is None:
            json_blocks += 1
            for call in _json_block_calls(body, f"json-tool-call-{json_blocks}",
                                         require_list=False):
                yield opener.start(), call
            continue
        name = _valid_name(html.unescape(opener.group(1)))
        parameters = _parameters(body.strip())
        if name is None or parameters is None:
            continue
        named += 1
        yield opener.start(), {"id": f"tag-tool-call-{named}", "name": name,
                               "parameters": parameters}


def _fenced_calls(text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    if "```" not in text:
        return
    for block, (opener, body) in enumerate(_blocks(text, _FENCE_OPEN, "```"), start=1):
        for call in _json_block_calls(body, f"fenced-tool-call-{block}", require_list=True):
            yield opener.start(), call
