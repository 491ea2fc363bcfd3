"""How big a run's context may get, and what it does when it gets there (DESIGN.md 21).

The ``context_tokens`` budget's ceiling is the model's context window. It is only known when
someone says so, so it is looked for in order, the first one found winning: the payload's
``budget_ceilings["context_tokens"]``, the endpoint's ``context_window`` (the ``providers``
setting), the setting ``context_windows`` (``{model name or fnmatch pattern: tokens}``: an exact
name before the patterns, the patterns in their order), the setting ``max_context_tokens``, and
a window the provider reports (llama.cpp's ``/props``). With none of these the run has no
context budget and nothing of this package runs, until a provider answers that a prompt was
too long (then the window is what was sent).

``context_compaction`` (payload, else setting): ``"auto"`` (the default), ``"off"``, or
``{"compact_at": 0.8, "keep_turns": 3, "strategies": [...]}``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from agents_api.errors import brief_repr
from datamachine.errors import UsageError

__all__ = ["BUILTIN_STRATEGIES", "DEFAULT_RESERVE", "MAX_WINDOW", "MIN_WINDOW",
           "CompactionConfig", "WindowSource", "answer_reserve", "parse_compaction",
           "parse_context_windows", "window_for_model"]

MIN_WINDOW = 256
MAX_WINDOW = 10**8
# Room left for the answer when neither the request's max_tokens nor the setting
# context_reserve says (and never more than a quarter of the window).
DEFAULT_RESERVE = 1024
BUILTIN_STRATEGIES = ("clear_tool_results", "summarize", "drop_oldest")

WindowSource = Literal["override", "endpoint", "context_windows", "setting", "provider",
                       "overflow"]


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    """What a run does before a request that would fill ``compact_at`` of the window: the
    strategies, in order, each keeping the last ``keep_turns`` turns whole."""

    compact_at: float = 0.8
    keep_turns: int = 3
    strategies: tuple[str, ...] = BUILTIN_STRATEGIES


_KEYS = ("compact_at", "keep_turns", "strategies")


def parse_compaction(value: object, knob: str) -> CompactionConfig | None:
    """``context_compaction`` as a config (None: ``"off"``); a bad value is a UsageError
    naming ``knob`` and the field."""
    if value is None or value == "auto":
        return CompactionConfig()
    if value == "off":
        return None
    if not isinstance(value, Mapping):
        raise UsageError(f"{knob} must be \"auto\", \"off\" or an object such as "
                         '{"compact_at": 0.8, "keep_turns": 3, "strategies": '
                         f'["clear_tool_results", "summarize", "drop_oldest"]}}, got '
                         f"{brief_repr(value)}.")
    unknown = sorted(str(key) for key in value if key not in _KEYS)
    if unknown:
        raise UsageError(f"{knob} has unknown key(s) {', '.join(unknown)}; it takes "
                         f"{', '.join(_KEYS)}.")
    default = CompactionConfig()
    compact_at = value.get("compact_at", default.compact_at)
    if isinstance(compact_at, bool) or not isinstance(compact_at, int | float) \
            or not 0.1 <= compact_at <= 1:
        raise UsageError(f"{knob}['compact_at'] must be a fraction of the window from 0.1 to "
                         f"1 (0.8: compact at 80 %), got {brief_repr(compact_at)}.")
    keep_turns = value.get("keep_turns", default.keep_turns)
    if isinstance(keep_turns, bool) or not isinstance(keep_turns, int) \
            or not 0 <= keep_turns <= 1000:
        raise UsageError(f"{knob}['keep_turns'] must be a whole number of turns from 0 to "
                         f"1000, got {brief_repr(keep_turns)}.")
    strategies = value.get("strategies", list(default.strategies))
    if not isinstance(strategies, list | tuple) or not all(
            isinstance(name, str) for name in strategies):
        raise UsageError(f"{knob}['strategies'] must be a list of strategy names from "
                         f"{', '.join(BUILTIN_STRATEGIES)}, got {brief_repr(strategies)}.")
    bad = [name for name in strategies if name not in BUILTIN_STRATEGIES]
    if bad:
        raise UsageError(f"{knob}['strategies'] names {', '.join(map(repr, bad))}; the "
                         f"built-in strategies are {', '.join(BUILTIN_STRATEGIES)} (a plugin "
                         "adds its own with the compact_context hook).")
    return CompactionConfig(float(compact_at), keep_turns, tuple(dict.fromkeys(strategies)))


def parse_context_windows(value: object, knob: str = "setting 'context_windows'"
                          ) -> dict[str, int]:
    """``context_windows`` checked: ``{model name or fnmatch pattern: tokens}``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise UsageError(f"{knob} must map model names or patterns to context windows in "
                         'tokens, such as {"gpt-4o*": 128000, "llama3.2": 8192}; got '
                         f"{brief_repr(value)}.")
    windows: dict[str, int] = {}
    for pattern, tokens in value.items():
        if not isinstance(pattern, str) or not pattern.strip():
            raise UsageError(f"{knob}: {brief_repr(pattern)} is not a model name or pattern.")
        windows[pattern] = check_window(tokens, f"{knob}[{pattern!r}]")
    return windows


def check_window(tokens: object, knob: str) -> int:
    """A context window in tokens: a whole number from 256 to 10^8."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) \
            or not MIN_WINDOW <= tokens <= MAX_WINDOW:
        raise UsageError(f"{knob} must be a context window in tokens, a whole number from "
                         f"{MIN_WINDOW} to {MAX_WINDOW:,}, got {brief_repr(tokens)}.")
    return tokens


def window_for_model(windows: Mapping[str, int], model: str) -> int | None:
    """The window ``windows`` gives ``model``: its exact name first, then the first pattern
    (in the setting's order) that matches it."""
    exact = windows.get(model)
    if exact is not None:
        return exact
    for pattern, tokens in windows.items():
        if fnmatch.fnmatchcase(model, pattern):
            return tokens
    return None


def answer_reserve(options: Mapping[str, Any], setting: Callable[[str], Any],
                   ceiling: int) -> int:
    """The room a request leaves for its answer: its ``max_tokens`` (or
    ``max_completion_tokens``) option, else the setting ``context_reserve``, else 1024 tokens
    (a quarter of the window at most)."""
    for key in ("max_tokens", "max_completion_tokens"):
        asked = options.get(key)
        if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0:
            return asked
    configured = setting("context_reserve")
    if isinstance(configured, int) and not isinstance(configured, bool) and configured >= 0:
        return configured
    return min(DEFAULT_RESERVE, ceiling // 4)
