"""The prompt of ``datamachine run``, as ``llm`` reads it: the argument, piped stdin, or both.

- ``PROMPT`` given, stdin a terminal: the prompt is ``PROMPT``.
- ``PROMPT`` missing, stdin piped or redirected: the prompt is stdin.
- ``PROMPT`` is ``-``: the prompt is stdin, even on a terminal (type it, then Ctrl-D).
- ``PROMPT`` given and stdin piped: stdin, a space, then ``PROMPT`` (``cat notes.txt |
  datamachine run "Summarize this"``), joined as ``llm`` joins them; stdin is never stripped.
- ``PROMPT`` missing on a terminal, or a prompt of only whitespace: a usage error (exit 2).

Reading stdin waits for its end: a script that starts ``run`` with an open stdin it never closes
should give it ``< /dev/null``.
"""

from __future__ import annotations

import sys
from typing import TextIO

from datamachine.errors import UsageError

__all__ = ["read_prompt"]


def read_prompt(prompt: str | None, stdin: TextIO | None = None) -> str:
    """The prompt from the ``PROMPT`` argument and ``stdin`` (see the module docstring);
    ``UsageError`` (one line, exit 2) when there is none."""
    stream = stdin if stdin is not None else sys.stdin
    piped = stream is not None and not stream.isatty()
    if prompt == "-":
        text = stream.read() if stream is not None else ""
    elif prompt is None:
        if not piped:
            raise UsageError(
                "Missing PROMPT: give it as an argument (datamachine run \"Hello\"), pipe it "
                "(echo Hello | datamachine run) or use '-' to type it and end with Ctrl-D.")
        text = stream.read()
    else:
        stdin_text = stream.read() if piped else ""
        text = f"{stdin_text} {prompt}" if stdin_text else prompt
    if not text.strip():
        raise UsageError("The prompt is empty: give PROMPT or pipe some text.")
    return text
