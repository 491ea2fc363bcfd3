"""Reading a tool's description and per-parameter help out of its docstring.

A model chooses tools from their descriptions, so the text the author already wrote for humans
is what it should see: the first paragraph describes the tool, and the parameter section
describes each parameter, in whichever style the author writes: Google (``Args:``), NumPy
(``Parameters`` / ``----------``) or reST (``:param x:``). Parsing is the maintained
``docstring_parser`` package's job (its style auto-detection picks the style that explains the
most); what it cannot place stays for humans.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import docstring_parser

__all__ = ["ParsedDocstring", "parse_docstring"]


@dataclass(frozen=True)
class ParsedDocstring:
    """The parts of a docstring a tool definition uses."""

    description: str = ""
    params: dict[str, str] = field(default_factory=dict)


def _flat(text: str | None) -> str:
    # Providers show descriptions as running text: a paragraph's lines joined with spaces.
    return " ".join((text or "").split())


def parse_docstring(doc: str | None) -> ParsedDocstring:
    """Split ``doc`` into the tool description (first paragraph) and parameter descriptions."""
    if not doc or not doc.strip():
        return ParsedDocstring()
    try:
        parsed = docstring_parser.parse(inspect.cleandoc(doc))
    except docstring_parser.ParseError:
        # A malformed section: the summary is still the first paragraph.
        first = inspect.cleandoc(doc).split("\n\n", 1)[0]
        return ParsedDocstring(description=_flat(first))
    description = parsed.short_description or ""
    if parsed.long_description and not parsed.blank_after_short_description:
        # The summary ran on past its first line: the rest of that paragraph belongs to it.
        description += " " + parsed.long_description.split("\n\n", 1)[0]
    params = {param.arg_name.lstrip("*"): _flat(param.description)
              for param in parsed.params if param.description}
    return ParsedDocstring(description=_flat(description), params=params)
