"""Reading a tool's description and per-parameter help out of its docstring.

A model chooses tools from their descriptions, so the text the author already wrote for humans
is what it should see: the first paragraph describes the tool, and a Google-style ``Args:``
section (or a NumPy-style ``Parameters`` section) describes each parameter. Anything else in the
docstring (``Returns:``, examples) stays for humans.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field

__all__ = ["ParsedDocstring", "parse_docstring"]

_GOOGLE_PARAM_HEADERS = frozenset({"args", "arguments", "parameters", "params",
                                   "keyword args", "keyword arguments"})
_GOOGLE_OTHER_HEADERS = frozenset({"returns", "return", "yields", "raises", "examples", "example",
                                   "notes", "note", "see also", "attributes", "warnings",
                                   "warning", "todo", "references"})
_NUMPY_UNDERLINE = re.compile(r"^\s*-{3,}\s*$")
# "name (type): text", "name: text", "*args: text"; the name may carry * or ** prefixes.
_GOOGLE_ITEM = re.compile(
    r"^\*{0,2}(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*(\([^)]*\))?\s*:\s*(?P<text>.*)$"
)
# "name : type" or a bare "name" line in a NumPy section.
_NUMPY_ITEM = re.compile(r"^\*{0,2}(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*(:.*)?$")


@dataclass(frozen=True)
class ParsedDocstring:
    """The parts of a docstring a tool definition uses."""

    description: str = ""
    params: dict[str, str] = field(default_factory=dict)


def parse_docstring(doc: str | None) -> ParsedDocstring:
    """Split ``doc`` into the tool description (first paragraph) and parameter descriptions.

    Lines of one paragraph are joined with spaces, because providers show descriptions as
    running text. Unknown section styles are ignored rather than guessed at.
    """
    if not doc or not doc.strip():
        return ParsedDocstring()
    lines = inspect.cleandoc(doc).splitlines()
    description = _first_paragraph(lines)
    params = _google_params(lines)
    if not params:
        params = _numpy_params(lines)
    return ParsedDocstring(description=description, params=params)


def _is_section_header(line: str) -> bool:
    stripped = line.strip()
    if not stripped.endswith(":") or line[:1].isspace():
        return False
    title = stripped[:-1].strip().lower()
    return title in _GOOGLE_PARAM_HEADERS or title in _GOOGLE_OTHER_HEADERS


def _first_paragraph(lines: list[str]) -> str:
    parts: list[str] = []
    for index, line in enumerate(lines):
        if not line.strip():
            if parts:
                break
            continue
        if _is_section_header(line):
            break
        following = lines[index + 1] if index + 1 < len(lines) else ""
        if _NUMPY_UNDERLINE.match(following):
            break
        parts.append(line.strip())
    return " ".join(parts)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _google_params(lines: list[str]) -> dict[str, str]:
    params: dict[str, str] = {}
    in_section = False
    item_indent: int | None = None
    current: str | None = None
    for line in lines:
        if _is_section_header(line):
            in_section = line.strip()[:-1].strip().lower() in _GOOGLE_PARAM_HEADERS
            item_indent, current = None, None
            continue
        if not in_section:
            continue
        if not line.strip():
            current = None
            continue
        indent = _indent(line)
        if indent == 0:
            # Unindented text after the section ends it (Google sections are indented).
            in_section, current = False, None
            continue
        if item_indent is None:
            item_indent = indent
        if indent <= item_indent:
            match = _GOOGLE_ITEM.match(line.strip())
            if match is None:
                current = None
                continue
            current = match.group("name")
            params[current] = match.group("text").strip()
        elif current is not None:
            params[current] = f"{params[current]} {line.strip()}".strip()
    return params


def _numpy_params(lines: list[str]) -> dict[str, str]:
    params: dict[str, str] = {}
    in_section = False
    current: str | None = None
    index = 0
    while index < len(lines):
        line = lines[index]
        following = lines[index + 1] if index + 1 < len(lines) else ""
        if line.strip() and _NUMPY_UNDERLINE.match(following):
            in_section = line.strip().lower() in _GOOGLE_PARAM_HEADERS
            current = None
            index += 2
            continue
        index += 1
        if not in_section or not line.strip():
            continue
        if _indent(line) == 0:
            match = _NUMPY_ITEM.match(line.strip())
            current = match.group("name") if match else None
            if current is not None:
                params[current] = ""
        elif current is not None:
            params[current] = f"{params[current]} {line.strip()}".strip()
    return params
