"""Knowing a "prompt too long" answer when a server gives one (DESIGN.md 21).

Servers say it in their own words, on an HTTP 400 (some 413 or 422):

- OpenAI: ``{"error": {"code": "context_length_exceeded", "message": "This model's maximum
  context length is 8192 tokens. However, your messages resulted in 9013 tokens..."}}``;
  llama-cpp-python's server answers the same body (its window and the prompt in the message);
- llama.cpp's server: ``{"error": {"type": "exceed_context_size_error", "message": "request
  (4476 tokens) exceeds the available context size (4096 tokens)...", "n_prompt_tokens": 4476,
  "n_ctx": 4096}}`` (older builds: "the request exceeds the available context size");
- vLLM: "This model's maximum context length is 2048 tokens. However, you requested 2100
  tokens (2000 in the messages, 100 in the completion)...";
- Ollama: "input exceeds context length" (an HTTP 500, when it does not truncate the prompt
  silently to its ``num_ctx``, which it does by default: give such a model its window in
  ``context_windows`` so the run never sends more).

A provider for another API knows its own words (``WireProvider.context_overflow``: the
``datamachine-anthropic`` plugin reads Anthropic's "prompt is too long: 208437 tokens > 200000
maximum").

:func:`overflow_of` finds one, with the window and the prompt's tokens when the answer names
them; the provider then raises ``ProviderError(code="context_overflow")``, which a run answers
by compacting and asking again instead of failing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["CONTEXT_OVERFLOW", "Overflow", "overflow_of"]

CONTEXT_OVERFLOW = "context_overflow"

# (the window in tokens, the prompt's tokens): each None when the answer does not say.
Overflow = tuple[int | None, int | None]

_STATUSES = frozenset({400, 413, 422, 500})
_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error",
                    "string_above_max_length"})
_PHRASES = ("maximum context length", "context length exceeded", "context_length_exceeded",
            "exceeds the available context size", "exceed context window",
            "exceeds the context window", "input length exceeds the context length",
            "input exceeds context length", "exceeds the maximum context")
_WINDOW = (re.compile(r"maximum context length is (\d+)"),
           re.compile(r"available context size \((\d+) tokens?\)"),
           re.compile(r"context window of (\d+)"))
_PROMPT = (re.compile(r"resulted in (\d+) tokens"),
           re.compile(r"\((\d+) in the messages"),
           re.compile(r"request \((\d+) tokens?\)"),
           re.compile(r"requested tokens \((\d+)\)"))


def overflow_of(status: int, body: object, detail: str) -> Overflow | None:
    """``(window, prompt_tokens)`` when an error answer (``status``, its JSON ``body`` or
    None, its message ``detail``) says the prompt is longer than the context window; else
    None."""
    if status not in _STATUSES:
        return None
    error = body.get("error") if isinstance(body, Mapping) else None
    fields = error if isinstance(error, Mapping) else {}
    code = fields.get("code")
    kind = fields.get("type")
    text = detail.lower()
    coded = status != 500 and (code in _CODES or kind in _CODES)
    if not (coded or any(p in text for p in _PHRASES)):
        return None
    window = _number(fields.get("n_ctx")) or _first(_WINDOW, text)
    prompt = _number(fields.get("n_prompt_tokens")) or _first(_PROMPT, text)
    return window, prompt


def _number(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else None


def _first(patterns: tuple[re.Pattern[str], ...], text: str) -> int | None:
    for pattern in patterns:
        found = pattern.search(text)
        if found is not None:
            return int(found.group(1))
    return None
