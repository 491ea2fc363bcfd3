"""What a run's requests spend, in tokens and money: :class:`RunMeter` (DESIGN.md section 15).

A turn budget counts requests; a token or cost budget counts what they spend, which is only
known after the answer. So the meter works on both sides of every request:

- **before** it (the loop's ``estimate_request``), with an estimate of the prompt: a request
  that would take a budget past its ceiling is not sent. The estimate is the one documented
  rule, :func:`estimate_prompt_tokens`: the UTF-8 bytes of the request's messages and tool
  definitions as compact JSON, divided by four and rounded up (about four bytes per token in
  English text and JSON; a language with longer tokens per byte is under-estimated, and the
  reported usage corrects the count after the answer). Its cost is the estimate priced at the
  model's input price. Spend windows across runs are reserved here too (:mod:`.spending`).
- **after** it, with the usage the provider reports (``total_tokens``, else prompt plus
  completion; a provider that reports nothing is charged the estimate and the answer's own
  bytes / 4). The cost is ``prompt_tokens * input + completion_tokens * output`` from the
  ``prices`` setting, in microdollars: a price in dollars per million tokens is exactly a price
  in microdollars per token.

The final summary is a request too: it is sent only when its prompt and at least
:data:`SUMMARY_MIN_OUTPUT` tokens of answer fit, with ``max_tokens`` lowered to what is left,
so a summary never overspends; otherwise the run's fallback sentence is used.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agents_api import IterationBudget
from agents_api.errors import brief_repr
from agents_api.jsontext import compact_bytes
from datamachine.errors import InvalidSetting, UsageError
from datamachine.providers.base import ProviderRequest

__all__ = ["PROMPT_BYTES_PER_TOKEN", "SUMMARY_MIN_OUTPUT", "Price", "RunMeter", "SpendGuard",
           "SummaryWontFit", "check_prices", "estimate_prompt_tokens", "format_usd",
           "price_for"]

PROMPT_BYTES_PER_TOKEN = 4
# The fewest answer tokens a final summary is worth asking for.
SUMMARY_MIN_OUTPUT = 64


def estimate_prompt_tokens(request_bytes: int) -> int:
    """The documented prompt estimate: ``ceil(bytes / 4)`` of the request's JSON."""
    return -(-max(0, request_bytes) // PROMPT_BYTES_PER_TOKEN)


def format_usd(microdollars: float) -> str:
    """Microdollars as dollars for people: ``$0.72``, ``$1,250.00``, ``$0.000150``."""
    dollars = microdollars / 1_000_000
    if microdollars == 0 or round(dollars, 2) * 1_000_000 == round(microdollars):
        return f"${dollars:,.2f}"
    text = f"${dollars:,.6f}".rstrip("0")
    return text if len(text.partition(".")[2]) >= 2 else f"${dollars:,.2f}"


@dataclass(frozen=True, slots=True)
class Price:
    """A model's price in US dollars per million tokens, which is microdollars per token."""

    input: float
    output: float

    def microdollars(self, prompt_tokens: float, completion_tokens: float) -> float:
        """What that many prompt and completion tokens cost, in microdollars."""
        return prompt_tokens * self.input + completion_tokens * self.output


def check_prices(value: object, knob: str = "setting 'prices'") -> dict[str, Price]:
    """The ``prices`` setting (``{model: {"input": usd_per_million, "output": ...}}``) checked;
    a bad shape raises :class:`InvalidSetting` naming the model and the field."""
    if not isinstance(value, Mapping):
        raise InvalidSetting(f"{knob} must be an object of model -> {{'input': dollars per "
                             f"million prompt tokens, 'output': dollars per million completion "
                             f"tokens}}, got {type(value).__name__}.")
    prices: dict[str, Price] = {}
    for model, entry in value.items():
        if not isinstance(model, str) or not model.strip() or not isinstance(entry, Mapping):
            raise InvalidSetting(f"{knob}[{brief_repr(model)}] must be {{'input': ..., "
                                 "'output': ...}} in US dollars per million tokens.")
        unknown = sorted(set(entry) - {"input", "output"})
        if unknown:
            raise InvalidSetting(f"{knob}[{brief_repr(model)}] has unknown keys "
                                 f"{brief_repr(unknown)}; give 'input' and 'output' (US dollars "
                                 "per million tokens).")
        parts = []
        for field in ("input", "output"):
            number = entry.get(field)
            # The range alone refuses NaN and infinities, and compares a huge int without
            # converting it (math.isfinite(10**400) raises OverflowError).
            if (isinstance(number, bool) or not isinstance(number, int | float)
                    or not 0 <= number <= 1_000_000):
                raise InvalidSetting(f"{knob}[{brief_repr(model)}][{field!r}] must be a number of "
                                     "US dollars per million tokens from 0 to 1,000,000, got "
                                     f"{brief_repr(number)}.")
            parts.append(float(number))
        prices[model] = Price(parts[0], parts[1])
    return prices


def price_for(setting: object, model: str) -> Price | None:
    """The price of ``model`` in the ``prices`` setting (None when it has none)."""
    if setting is None:
        return None
    return check_prices(setting).get(model)


class SummaryWontFit(Exception):
    """The final summary request would pass a budget: the fallback sentence is used."""


class SpendGuard(Protocol):
    """Spend windows across runs (:class:`datamachine.conversation.spending.SpendWindows`)."""

    budgets: list[IterationBudget]

    def reserve(self, tokens: int, microdollars: int) -> dict[str, int]:
        """Reserve one request's estimate in every window; ``{limit: units}`` (all or none:
        when a window cannot hold it, nothing is reserved and its budget shows why)."""

    def settle(self, tokens: int, microdollars: int) -> None:
        """Replace the open reservation by what the request spent."""

    def release(self) -> None:
        """Drop the open reservation (the request failed or was never sent)."""

    def room(self) -> tuple[int | None, int | None]:
        """(tokens, microdollars) the tightest window has left, None for no such window."""


class RunMeter:
    """The metered budgets of one run, fed by its requests (see the module docstring).

    ``tokens`` / ``cost``: the run's ``total_tokens`` and ``cost`` budgets (each may be
    absent); ``price``: the model's price (needed for ``cost``); ``spend``: the spend windows
    it counts against; ``units``: every metered budget's unit by name.
    """

    def __init__(self, *, tokens: IterationBudget | None, cost: IterationBudget | None,
                 price: Price | None, spend: SpendGuard | None = None,
                 units: Mapping[str, str] | None = None) -> None:
        self.tokens = tokens
        self.cost = cost
        self.price = price
        self.spend = spend
        # The unit of every metered budget by name ("tokens" or "microdollars").
        self.units = dict(units or {})
        # What the cost budget holds (a resumed run starts from the paused run's count) and
        # what this run's own requests cost (usage.cost_usd).
        self.spent_microdollars = float(cost.current()) if cost is not None else 0.0
        self.run_microdollars = 0.0
        self._estimate = 0
        self._open = False  # a spend reservation waits for its request's answer
        # The refused request: (budget name, units it needed), for the run's warning.
        self.refused: tuple[str, int] | None = None

    @property
    def budgets(self) -> list[IterationBudget]:
        """Every budget this meter feeds (run budgets, then spend windows)."""
        own = [b for b in (self.tokens, self.cost) if b is not None]
        return own + (self.spend.budgets if self.spend is not None else [])

    @property
    def estimates(self) -> bool:
        """Whether requests must be checked before they are sent (a budget to keep)."""
        return bool(self.budgets)

    # -- before a request ---------------------------------------------------------------------
    def estimate(self, request_bytes: int) -> dict[str, int]:
        """The coming request's units per budget (its JSON is ``request_bytes`` long), with
        its spend reserved when every budget of the run holds it."""
        self.release()  # a reservation left by a request that never answered
        tokens = estimate_prompt_tokens(request_bytes)
        self._estimate = tokens
        micro = self._micro(tokens, 0)
        needed: dict[str, int] = {}
        for budget, units in ((self.tokens, tokens), (self.cost, micro)):
            if budget is None:
                continue
            needed[budget.name()] = units
            if budget.exceeded() or budget.current() + units > budget.ceiling():
                self.refused = (budget.name(), units)
                return needed  # the loop stops (or extends) on it; nothing is reserved
        if self.spend is not None:
            reserved = self.spend.reserve(tokens, micro)
            needed.update(reserved)
            self._open = True
            for budget in self.spend.budgets:
                units = reserved.get(budget.name(), 0)
                if budget.exceeded() or budget.current() + units > budget.ceiling():
                    self._open = False  # refused: the guard reserved nothing
                    self.refused = (budget.name(), units)
                    break
        return needed

    def _micro(self, prompt: float, completion: float) -> int:
        return math.ceil(self.price.microdollars(prompt, completion)) if self.price else 0

    # -- after a request ----------------------------------------------------------------------
    def settle(self, usage: Mapping[str, Any], content: str = "",
               tool_calls: Sequence[Mapping[str, Any]] = ()) -> None:
        """Feed the budgets what the answered request spent: its reported usage, else the
        estimate and the answer's own size (``content`` and ``tool_calls``)."""
        prompt, completion, total = _split(usage, self._estimate, lambda: estimate_prompt_tokens(
            len(content.encode()) + sum(len(compact_bytes(call)) for call in tool_calls)))
        self._feed(prompt, completion, total)

    def charge_failed(self) -> None:
        """A request that failed or was cut off after it was sent may still be billed: it is
        charged its prompt estimate (never less than nothing, never its unknown answer)."""
        if self._estimate:
            self._feed(self._estimate, 0, self._estimate)
        else:
            self.release()

    def _feed(self, prompt: float, completion: float, reported: float) -> None:
        total = math.ceil(reported)
        micro = self.price.microdollars(prompt, completion) if self.price else 0.0
        self.spent_microdollars += micro
        self.run_microdollars += micro
        if self.tokens is not None:
            self.tokens.set_current(self.tokens.current() + total)
        if self.cost is not None:
            self.cost.set_current(math.ceil(self.spent_microdollars - 1e-6))
        if self.spend is not None:
            self._open = False
            self.spend.settle(total, math.ceil(micro - 1e-6))

    def release(self) -> None:
        """Give back an open spend reservation (its request failed or was never sent)."""
        if self._open and self.spend is not None:
            self._open = False
            self.spend.release()

    @property
    def cost_usd(self) -> float | None:
        """What the run's requests cost in dollars, when the model has a price."""
        return round(self.run_microdollars / 1_000_000, 9) if self.price else None

    # -- the final summary --------------------------------------------------------------------
    def admit_summary(self, request: ProviderRequest, request_bytes: int) -> ProviderRequest:
        """The summary request, with ``max_tokens`` lowered to what every budget has left;
        raise :class:`SummaryWontFit` when its prompt and :data:`SUMMARY_MIN_OUTPUT` answer
        tokens do not fit."""
        self.release()
        prompt = estimate_prompt_tokens(request_bytes)
        self._estimate = prompt
        room: list[float] = []
        if self.tokens is not None:
            room.append(self.tokens.ceiling() - self.tokens.current() - prompt)
        if self.cost is not None and self.price is not None:
            left = self.cost.ceiling() - self.spent_microdollars - prompt * self.price.input
            room.append(left / self.price.output if self.price.output else math.inf)
        if self.spend is not None:
            tokens_left, micro_left = self.spend.room()
            if tokens_left is not None:
                room.append(tokens_left - prompt)
            if micro_left is not None and self.price is not None:
                left = micro_left - prompt * self.price.input
                room.append(left / self.price.output if self.price.output else math.inf)
        allowed = min(room, default=math.inf)
        if allowed < SUMMARY_MIN_OUTPUT:
            raise SummaryWontFit(
                f"the final summary (about {prompt:,} prompt tokens and at least "
                f"{SUMMARY_MIN_OUTPUT} answer tokens) does not fit in what the run's budgets "
                "have left")
        if self.spend is not None:
            reserved = self.spend.reserve(prompt, self._micro(prompt, 0))
            for budget in self.spend.budgets:
                if budget.current() + reserved.get(budget.name(), 0) > budget.ceiling():
                    raise SummaryWontFit(f"the spend window {budget.name()!r} is used up")
            self._open = True
        if allowed == math.inf:
            return request
        key = "max_completion_tokens" if "max_completion_tokens" in request.options \
            else "max_tokens"
        given = request.options.get(key)
        cap = int(allowed) if not isinstance(given, int) else min(given, int(allowed))
        return request.model_copy(update={"options": {**request.options, key: cap}})

    # -- words for people ---------------------------------------------------------------------
    def stop_warning(self, name: str, snapshot: Mapping[str, Any]) -> str | None:
        """The result's warning when budget ``name`` stopped the run (None: not metered)."""
        unit = self.units.get(name)
        if unit not in ("tokens", "microdollars"):
            return None
        label = name.replace("_", " ")
        current, ceiling = int(snapshot.get("current", 0)), int(snapshot.get("ceiling", 0))
        shown = (format_usd if unit == "microdollars" else _tokens_text)
        if self.refused is not None and self.refused[0] == name \
                and current + self.refused[1] > ceiling and current < ceiling:
            return (f"The next request (about {shown(self.refused[1])}) would pass the "
                    f"{label} budget ({shown(current)} of {shown(ceiling)} used); it was not "
                    "sent.")
        return f"Maximum {label} ({shown(ceiling)}) reached ({shown(current)} used)."


def _tokens_text(tokens: float) -> str:
    return f"{int(tokens):,} tokens"


def _split(usage: Mapping[str, Any], estimate: int, answer: Callable[[], int]
           ) -> tuple[float, float, float]:
    """(prompt, completion, total) tokens of one answer: what the usage reports, the rest
    filled in (a total without a split takes the prompt estimate as its prompt part, so the
    cost is priced; a missing part is the estimate, or the answer's own size)."""
    prompt = _number(usage.get("prompt_tokens"))
    completion = _number(usage.get("completion_tokens"))
    total = _number(usage.get("total_tokens"))
    if prompt is None and completion is None:
        if total is None:
            prompt, completion = estimate, answer()
        else:
            prompt = min(float(estimate), total)
            completion = total - prompt
    elif completion is None:
        assert prompt is not None
        completion = max(0.0, total - prompt) if total is not None else answer()
    elif prompt is None:
        prompt = max(0.0, total - completion) if total is not None else estimate
    assert prompt is not None
    assert completion is not None
    return prompt, completion, total if total is not None else prompt + completion


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 \
            or not math.isfinite(value):
        return None
    return value


def check_metered_run(unit_of: Mapping[str, str], price: Price | None, model: str,
                      names: list[str]) -> None:
    """A cost budget or cost window needs the model's price: refuse the run otherwise."""
    priced = [name for name in names if unit_of.get(name) == "microdollars"]
    if priced and price is None:
        raise UsageError(
            f"Budget {priced[0]!r} counts money, but the setting 'prices' has no price for "
            f"model {model!r}: set prices {{{model!r}: {{'input': ..., 'output': ...}}}} in "
            "US dollars per million tokens, or run without a cost ceiling.")

