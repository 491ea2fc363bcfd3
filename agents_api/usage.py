"""Which numbers a model's reported usage may hold: :func:`plausible_usage`.

Usage is summed over a run's turns, stored, shown, and read by token and cost budgets, so one
impossible number poisons all of them: a negative count gives tokens back to a budget, NaN
makes every comparison false (a budget that never fills), a bool is not a count, and 10^30
overflows what the stores can hold. A provider (or a proxy in front of it) that reports such a
value is wrong about that field, so the field is treated as not reported: the caller counts
what it would count for a provider that reports nothing (datamachine's meter falls back to its
estimate) and says once per run that it did.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import TypeAlias

__all__ = ["MAX_USAGE_VALUE", "USAGE_COUNTS", "Usage", "UsageCounts", "plausible_usage",
           "reported_usage"]

# What a turn or a run reports it used: counts by name (``prompt_tokens``, ``cost``...), and
# whatever else a runner reported beside them (``prompt_tokens_details``), passed through as is.
Usage: TypeAlias = dict[str, object]
# The counts of a usage that can be true (what plausible_usage keeps): whole token counts, and
# finite non-negative numbers such as a cost.
UsageCounts: TypeAlias = dict[str, int | float]

# No single request reports more than this of anything (a million times a large context).
MAX_USAGE_VALUE = 10**12
# The counts every run's usage shows, reported or not.
USAGE_COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")


def reported_usage(summed: Mapping[str, object]) -> Usage:
    """A run's usage as its result shows it: what its requests reported, summed, with None
    ("not reported") for each of :data:`USAGE_COUNTS` that no request reported. A server that
    sends no usage (llama-cpp-python's streams) must not read as a run that cost nothing."""
    return {**dict.fromkeys(USAGE_COUNTS), **summed}


def plausible_usage(usage: Mapping[str, object]
                    ) -> tuple[UsageCounts, Mapping[str, object]]:
    """``(kept, ignored)``: the top-level numbers of ``usage`` that can be true, and the
    fields that cannot (by name, with the value reported).

    A token count (a key ending in ``tokens``: ``prompt_tokens``, ``input_tokens``,
    ``cache_read_input_tokens``...) must be a whole number from 0 to 10^12 (``12.0`` is kept as
    ``12``); any other number (a provider's ``cost``) must be finite, from 0 to 10^12. Nested
    details (``prompt_tokens_details``) and labels are not counts: they are left out, and are
    not reported as ignored.
    """
    kept: UsageCounts = {}
    ignored: dict[str, object] | None = None  # made only when a field is bad: almost never
    for raw_key, value in usage.items():
        key = str(raw_key)
        count = key.endswith("tokens")
        if type(value) is int:  # the common case: a plain count
            if 0 <= value <= MAX_USAGE_VALUE:
                kept[key] = value
            else:
                ignored = _note(ignored, key, value)
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            if count:
                ignored = _note(ignored, key, value)  # a count that is not a number
            continue
        number: int | float = value
        if isinstance(value, float):
            if not math.isfinite(value) or (count and not value.is_integer()):
                ignored = _note(ignored, key, value)
                continue
            if count:
                number = int(value)
        if 0 <= number <= MAX_USAGE_VALUE:
            kept[key] = number
        else:
            ignored = _note(ignored, key, value)
    return kept, ignored if ignored is not None else _NOTHING


_NOTHING: Mapping[str, object] = MappingProxyType({})


def _note(ignored: dict[str, object] | None, key: str, value: object) -> dict[str, object]:
    found = ignored if ignored is not None else {}
    found[key] = value
    return found
