"""``run_conversation``: one :class:`ConversationRun`, the product on top of the generic loop
(DESIGN.md sections 5, 11 and 26).

A run is built whole before anything runs: its arguments checked (:class:`RunSpec`), its budgets
resolved through the registry (clamps reported), its completion state, provider turn, tool
executor and transcript wired together through their constructors. Then ``agents_api``'s loop
runs it, and the run answers the loop's questions: it *is* the loop's
:class:`~agents_api.LoopHooks`. A turn asks the provider (:class:`ProviderTurn` builds, sends
and reads the request) and decides what the answer means here: budget pressure, what it cost,
a chat session's limit, a nudge. When the loop stops, the run decides its verdict once
(:mod:`.verdict`), the loop stores it, and the result is built once from the loop's end.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from agents_api import (
    IterationBudget,
    LoopSettings,
    Message,
    Pause,
    RunStop,
    StopVerdict,
    TranscriptWriter,
    TurnAnswer,
    TurnContext,
)
from agents_api.api import hooked_steps
from agents_api.budget import per_tool_budget, spent_payload
from agents_api.drive import Steps, drive_async, drive_sync, run_steps
from agents_api.records import ToolCall, ToolOutcome
from agents_api.results import Decision, unchecked
from datamachine.budgets_builtin import (
    COMPLETION_NUDGES,
    CONTEXT_TOKENS,
    CONVERSATION_TURNS,
    COST,
    METERED_BUDGETS,
    OUTPUT_RETRIES,
    PROVIDER_RETRIES,
    STUCK_TURNS,
    TOOL_CALLS,
    TOTAL_TOKENS,
    WALL_CLOCK,
)
from datamachine.completion.controller import CompletionRun
from datamachine.context.guard import ContextSlot
from datamachine.conversation.ending import Abort, FinalSummary, TurnGate, decide
from datamachine.conversation.events import RunEvents, emit_outside_run
from datamachine.conversation.metering import RunMeter, check_metered_run, price_for
from datamachine.conversation.output import OutputContract
from datamachine.conversation.pausing import (
    Confirmation,
    PausedRun,
    Resumption,
    kept_payload,
    paused_runs,
)
from datamachine.conversation.payload import base_log_context
from datamachine.conversation.pressure import PressureTracker, parse_budget_pressure
from datamachine.conversation.provider_turn import (
    ProviderTurn,
    describe_ignored_usage,
    resolve_timeouts,
)
from datamachine.conversation.result import ConversationResult, empty_usage
from datamachine.conversation.spec import RunSpec
from datamachine.conversation.spending import SpendWindows, parse_spend_limits, scopes_of
from datamachine.conversation.timeline import RunTimeline
from datamachine.errors import DataMachineError, ModelRequestsDisabled, ProviderError, UsageError
from datamachine.loop_guard.guard import Detect, LoopGuard
from datamachine.loop_guard.ladder import parse_ladder
from datamachine.loop_guard.signals import GuardTurn
from datamachine.model_requests import refusal_message
from datamachine.observe import RunInfo, RunObserver, close_observers, wants_content
from datamachine.providers.base import ProviderResponse
from datamachine.providers.options import (
    MODEL_OPTIONS_KEY,
    merge_model_options,
    validate_model_options,
)
from datamachine.providers.overflow import CONTEXT_OVERFLOW
from datamachine.providers.wire_provider import WireProvider
from datamachine.registry import MISNAMED
from datamachine.settings import SettingsSnapshot
from datamachine.tools.executor import ToolExecutor
from datamachine.tools.in_doubt import InDoubt, waiting_calls
from datamachine.tools.results import is_rejected

if TYPE_CHECKING:
    from datamachine.context.guard import ContextGuard
    from datamachine.context.window import CompactionConfig
    from datamachine.host import Services
    from datamachine.registry import IterationBudgetRegistry

__all__ = ["STREAM_LEFT", "ConversationRun", "RunEvents", "emit_outside_run"]

logger = logging.getLogger("datamachine.conversation")

STREAM_LEFT = "The consumer of the stream stopped reading; the run was ended early."


class ConversationRun:
    """One ``run_conversation`` call (see the module docstring), and the loop's hooks.

    ``writer``: the transcript writer of a session whose lock the caller already holds (chat and
    continuation read the stored history under it); ``turn_gate``: asked after every provider
    turn (a chat session's limit); ``cumulative_base``: the session's turns before this run;
    ``resumption``: where a paused run stopped, for the run that resumes it; ``on_text``: where
    the model's text goes as it arrives (a streamed run); ``between_turns``: what a streamed run
    waits for before each turn (its consumer to take the events so far); ``in_doubt``: the
    calls a run that died left unsettled (DESIGN.md 24), handled before anything else.
    """

    def __init__(self, services: Services, spec: RunSpec, *,
                 writer: TranscriptWriter | None = None, turn_gate: TurnGate | None = None,
                 cumulative_base: int = 0, resumption: Resumption | None = None,
                 on_text: Callable[[str], None] | None = None,
                 between_turns: Callable[[], Awaitable[None]] | None = None,
                 settings: SettingsSnapshot | None = None,
                 in_doubt: InDoubt | None = None) -> None:
        self.services = services
        # Read once: the whole run (its set-up, its requests) sees these values.
        self.settings = settings if settings is not None else services.settings.snapshot()
        self.spec = spec
        self.writer = writer
        self.turn_gate = turn_gate
        self.cumulative_base = cumulative_base
        self.resumption = resumption
        self.in_doubt = in_doubt
        # What opening a chat session reported (its limit clamped) comes first.
        self.warnings: list[str] = list(turn_gate.warnings) if turn_gate is not None else []
        runtime = spec.runtime
        self.confirmation = Confirmation(self.settings.get, runtime)
        self.persister, self.lock, self.session_id = self._transcript()
        base = base_log_context(spec.mode, spec.payload)
        self.observers = self._observers(base)
        self.ceiling_overrides = _ceiling_overrides(services, runtime.budget_ceilings,
                                                    self.warnings)
        self._stored: dict[str, Any] | None = None  # see _stored_compaction
        # What a confirmed extension adds by default: each budget's ceiling at the start.
        self.ceilings: dict[str, int] = {}
        self.turn_budget = self._budget(
            CONVERSATION_TURNS, spec.max_turns if spec.max_turns is not None
            else self.ceiling_overrides.get(CONVERSATION_TURNS))
        # What the run viewer shows of the run, stored with its transcript: a run that stores
        # none (no writer, no persister) keeps nothing nobody could read, not even per request.
        self.timeline = (RunTimeline(self.turn_budget, cumulative_base)
                         if writer is not None or self.persister is not None else None)
        self.events = RunEvents(services, runtime.event_sink, base, self.observers,
                                self.timeline)
        found = spec.payload.get("engine_data")
        self.engine_data: dict[str, Any] = found if isinstance(found, dict) else {}
        self.completion = CompletionRun.prepare(
            services, spec.modes, spec.payload, runtime, spec.tools, emit=self.events.emit,
            engine_data=self.engine_data, nudges=self._later(COMPLETION_NUDGES),
            single_turn=spec.single_turn)
        # provider_retries: the ceiling every request of the run retries up to (None: a
        # provider that does not retry); spent_retries: the request that failed with none left.
        self.retries: IterationBudget | None = None
        self.spent_retries = False
        self.provider = self._provider()
        self.output = (OutputContract(runtime.output_type, self._repeats(OUTPUT_RETRIES))
                       if runtime.output_type is not None else None)
        self.budgets = self._other_budgets()
        # The tools the loop guard took away for the rest of the run (the executor refuses
        # them), and the guard (None: loop_guard "off").
        # A resumed run goes on without what its paused run took away ("for the rest of the
        # run", DESIGN 23).
        self.hidden_tools: set[str] = set(resumption.hidden_tools if resumption is not None
                                          else ())
        self.guard = self._loop_guard()
        if self.guard is not None and self.guard.made is not None:
            self.budgets.append(self.guard.made)  # else it joins when it first counts
        declined = self._declined_budget()
        if declined is not None:
            self.budgets.append(declined)
        # The model's context window (None: unknown, and no context budget until a provider
        # says a prompt was too long).
        self.context_budget = self._context_budget()
        if self.context_budget is not None:
            self.budgets.append(self.context_budget)
        self.meter = self._meter()
        # Tools budget pressure's wrap-up took out of the latest request: one set, shared
        # with the executor, which refuses calls to them.
        self.closed_tools: set[str] = set()
        self.executor = self._executor()
        self.pressure = self._pressure()
        self.provider_turn = self._provider_turn(on_text)
        self.between_turns = between_turns
        self.context: ContextGuard | None = (
            self._context_guard(self.context_budget) if self.context_budget is not None
            else None)
        self.context_slot = ContextSlot()
        if self.context is not None:
            self.context_slot.hold(self.context)
        self.summary = FinalSummary(self.provider_turn, self.events.emit, meter=self.meter,
                                    enabled=runtime.final_summary,
                                    fit=self.context_slot.fit_summary)
        # True while the latest answer is a final answer cut off by the output token limit.
        self.answer_truncated = False
        self.stop_requested = False
        self._usage_warned = False
        # Decided once, by the stop hook (or after the loop for a run that never ran).
        self.verdict: StopVerdict | None = None
        self.diagnostics: dict[str, Any] = {}

    @classmethod
    def create(cls, services: Services, messages: Any, tools: Any, provider: Any, model: Any,
               mode: Any = "pipeline", payload: Any = None, max_turns: Any = None,
               single_turn: Any = False, **options: Any) -> ConversationRun:
        """Check the arguments and build the run (``options``: see the class). ``provider``
        and ``model`` None: the settings ``default_provider`` and ``default_model``."""
        settings = options.pop("settings", None) or services.settings.snapshot()
        if provider is None:
            provider = settings.get("default_provider", "scripted")
        if model is None:
            model = settings.get("default_model", "")
        spec = RunSpec.build(messages, tools, provider, model, mode, payload, max_turns,
                             single_turn, known_modes=services.modes)
        run = cls.__new__(cls)
        try:
            run.__init__(services, spec, settings=settings, **options)  # type: ignore[misc]
        except BaseException as exc:
            # Refused during set-up (a budget ceiling, a bad option): observers that started
            # a span for the run end it, failed.
            close_observers(getattr(run, "observers", ()), exc)
            raise
        return run

    # -- set-up -----------------------------------------------------------------------------
    def _observers(self, base: dict[str, Any]) -> tuple[RunObserver, ...]:
        """What the ``run_observer`` hook returns for this run (nothing without impls)."""
        caller = self.services.pm.hook.run_observer
        if not caller.get_hookimpls():
            return ()
        spec, slug = self.spec, base.get("agent_slug")
        info = RunInfo(provider=spec.provider, model=spec.model, mode=spec.mode,
                       session_id=self.session_id,
                       agent_slug=slug if isinstance(slug, str) else None,
                       continuation=self.cumulative_base > 0 or self.resumption is not None)
        observers: list[RunObserver] = []
        arguments = {"run": info, "host": self.services}
        # Impl by impl, so one plugin that raises leaves the others observing.
        for impl in reversed(caller.get_hookimpls()):
            try:
                observer = impl.function(*[arguments[name] for name in impl.argnames])
            except Exception:
                logger.warning("datamachine: run_observer of %r failed", impl.plugin_name,
                               exc_info=True)
                continue
            if observer is not None:
                observers.append(cast(RunObserver, observer))
        return tuple(observers)

    def _provider(self) -> Any:
        spec = self.spec
        provider: Any = self.services.providers.get(spec.provider, settings=self.settings.get)
        if isinstance(provider, WireProvider):
            # Its requests read host settings through the run's snapshot, never the database,
            # and retry as often as the run's provider_retries budget says: a retry count the
            # provider was built with stands unless the run overrides it.
            own = provider.retry.max_retries
            self.retries = self.services.budgets.create(
                PROVIDER_RETRIES, ceiling_override=self.ceiling_overrides.get(PROVIDER_RETRIES,
                                                                              own),
                warnings=self.warnings, settings=self.settings.get)
            provider = provider.for_run(self.settings.get, max_retries=self.retries.ceiling())
        else:
            for_run = getattr(provider, "for_run", None)
            if callable(for_run):
                provider = for_run(self.settings.get)
        start_run = getattr(provider, "start_run", None)
        script = spec.runtime.script
        if callable(start_run):
            return start_run(script) if script is not None else start_run()
        if script is not None:
            raise UsageError(
                f"payload['script'] only applies to the scripted provider, not {spec.provider!r}.")
        return provider

    def _budget(self, name: str, override: int | None) -> IterationBudget:
        """Budget ``name`` from the registry (the override, else its setting, else its
        default; clamped and reported), carried on from the paused run a resumed run goes on
        from."""
        budget = self.services.budgets.create(name, ceiling_override=override,
                                              warnings=self.warnings, settings=self.settings.get)
        self.ceilings[name] = budget.ceiling()
        return self._resumed(budget)

    def _repeats(self, name: str) -> IterationBudget:
        """A budget that counts repeats in this run (nudges, output re-asks): held by the
        product, never checked by the loop (a ceiling N allows N; the run stops when an
        (N+1)th is needed), and carried on by a run that resumes this one."""
        return self._later(name)()

    def _later(self, name: str) -> Callable[[], IterationBudget]:
        """What makes budget ``name`` when it is first needed. It holds what it needs, not
        the run: a finished run must be freed at once, never left to the cycle collector.

        Its setting is checked now, so a bad value (``DATAMACHINE_MAX_STUCK_TURNS=x``) is
        refused before the run starts, as every other budget's is, not turns later."""
        override = self.ceiling_overrides.get(name)
        if override is None:
            self.services.budgets.setting_ceiling(name, settings=self.settings.get)
        return partial(_made, self.services.budgets, name, override,
                       self.warnings, self.settings.get, self.resumption)

    def _resumed(self, budget: IterationBudget) -> IterationBudget:
        """``budget`` with the count and ceiling its paused run stored (never past its hard
        ceiling), extended when an approval answered it; as it is for a new run."""
        return _carried(budget, self.resumption)

    def _other_budgets(self) -> list[IterationBudget]:
        registry, overrides = self.services.budgets, self.ceiling_overrides
        budgets = [self._budget(TOOL_CALLS, overrides.get(TOOL_CALLS))]
        # A registered tool_calls_<tool> budget bounds that tool in every run that offers it
        # (and so does a ceiling for it in budget_ceilings).
        budgets += [self._budget(name, overrides.get(name))
                    for name in map(per_tool_budget, self.completion.tools)
                    if registry.is_registered(name) or name in overrides]
        # Token and cost budgets join a run only when a ceiling is set for it.
        budgets += [self._budget(name, overrides.get(name))
                    for name in METERED_BUDGETS
                    if name in overrides
                    or registry.setting_ceiling(name, settings=self.settings.get) is not None]
        if self.resumption is not None:
            budgets += self._carried_budgets({self.turn_budget.name(),
                                              *(b.name() for b in budgets)})
        wall_clock = self._wall_clock()
        if wall_clock is not None:
            budgets.append(wall_clock)
        return budgets

    def _declined_budget(self) -> IterationBudget | None:
        """The budget a person declined to extend, when this run would not make it itself
        (the loop guard switched off since the pause, a budget a tool makes on first use):
        the loop stops the run on it, so a "no" is never ignored."""
        name = self.resumption.declined_budget if self.resumption is not None else None
        if name is None or name in {b.name() for b in [self.turn_budget, *self.budgets]}:
            return None
        if not self.services.budgets.is_registered(name):
            # Its plugin is gone: the stored snapshot still names it and what it counted.
            return _restored(IterationBudget(name, 1, 1), self.resumption.budgets.get(name)
                             if self.resumption is not None else None)
        return self._later(name)()

    def _carried_budgets(self, present: set[str]) -> list[IterationBudget]:
        """Budgets the paused run had beyond those a run starts with (one a tool created, a
        per-tool one from budget_ceilings); spend windows are read again from the store
        (their use moved on meanwhile), and the wall clock is made anew."""
        assert self.resumption is not None
        present |= {limit.name for limit in parse_spend_limits(
            self.settings.get("spend_limits"))}
        return [self._resumed(self.services.budgets.create(name, settings=self.settings.get))
                for name in self.resumption.budgets
                if name not in present and name not in _PRODUCT_HELD]

    def _wall_clock(self) -> IterationBudget | None:
        """The run's time rail, the budget ``wall_clock_seconds``: payload ``max_seconds``
        (fractions kept), else ``budget_ceilings``, else its setting; unset, none."""
        registry = self.services.budgets
        seconds: float | None = self.spec.runtime.max_seconds
        if seconds is None:
            given = self.ceiling_overrides.get(WALL_CLOCK)
            seconds = float(given) if given is not None else None
        resolved = registry.resolve(
            WALL_CLOCK, None if seconds is None else max(1, math.ceil(seconds)),
            settings=self.settings.get)
        if resolved.limit is None:
            return None
        if resolved.clamped:
            self.warnings.append(str(resolved.warning()))
        if seconds is None:  # from the setting: checked by resolve, fractions kept
            seconds = float(cast(float, registry.raw_setting(WALL_CLOCK, self.settings.get)))
        rail = float(resolved.ceiling) if resolved.clamped else seconds
        # The wall clock is a hard rail: its hard ceiling equals its ceiling, so it is never
        # offered for extension, and its time rail keeps fractions of a second.
        return self._resumed(IterationBudget(WALL_CLOCK, resolved.ceiling,
                                             hard_ceiling=resolved.ceiling, max_seconds=rail))

    # -- the loop guard (DESIGN 23; datamachine.loop_guard) ---------------------------------
    def _loop_guard(self) -> LoopGuard | None:
        """The run's loop guard: payload ``loop_guard``, else the setting, else the default
        ladder; None when it is ``"off"``."""
        raw = self.spec.runtime.loop_guard
        where = "payload['loop_guard']"
        if raw is None:
            raw, where = self.settings.get("loop_guard"), "setting 'loop_guard'"
        ladder = parse_ladder(raw, where)
        if ladder is None:
            return None
        made_later = self._later(STUCK_TURNS)

        def stuck() -> IterationBudget:
            # No hard ceiling: a person who lets a stuck run go on resets the count, never
            # extends it, so one is asked even at the clamp's top.
            budget = made_later()
            return IterationBudget(STUCK_TURNS, budget.ceiling(), budget.current())
        # Made now only for a resumed run that had it counting (or a person declined it);
        # else at the first signal.
        resumption, made = self.resumption, None
        if resumption is not None and (STUCK_TURNS in resumption.budgets
                                       or resumption.declined_budget == STUCK_TURNS):
            made = stuck()
            if not made.current() and resumption.declined_budget != STUCK_TURNS:
                made = None  # approved: it starts again, and joins when it counts
        hook = self.services.pm.hook.detect_stuck
        detect = self._detector(hook) if hook.get_hookimpls() else None
        return LoopGuard(stuck, ladder, emit=self.events.emit, hidden=self.hidden_tools,
                         detect=detect, context={"mode": self.spec.mode,
                                                 "session_id": self.session_id},
                         budget=made)

    @staticmethod
    def _detector(hook: Any) -> Detect:
        def detect(turns: list[GuardTurn], context: dict[str, Any]) -> list[str | None]:
            try:
                return cast("list[str | None]", hook(turns=turns, context=context))
            except Exception:  # a broken detector must not end the run it watches
                logger.warning("datamachine: a detect_stuck hook failed", exc_info=True)
                return []
        return detect

    def _guarded(self, guard: LoopGuard, extra: list[dict[str, str]] | None,
                 offered: list[dict[str, Any]] | None
                 ) -> tuple[list[dict[str, str]] | None, list[dict[str, Any]] | None]:
        """The coming request as the loop guard leaves it: its nudge (this request only,
        never stored) after any pressure notice, without the tools it took away."""
        nudge = guard.take_nudge()
        if nudge is not None:
            extra = [*(extra or []), {"role": "user", "content": nudge}]
        hidden = self.hidden_tools
        if hidden:
            every = offered if offered is not None else self.provider_turn.tools
            offered = [tool for tool in every if tool["name"] not in hidden]
        return extra, offered

    # -- the context window (DESIGN 21; datamachine.context) ---------------------------------
    def _context_budget(self) -> IterationBudget | None:
        """``context_tokens`` when the model's window is known (see
        :mod:`datamachine.context.window` for where it is looked for), else None."""
        found = self._known_window()
        if found is None:
            return None
        resolved = self.services.budgets.resolve(CONTEXT_TOKENS, found)
        if resolved.clamped:
            self.warnings.append(str(resolved.warning()))
        # A window is a hard rail: no extension makes the model read more.
        return self._resumed(IterationBudget(CONTEXT_TOKENS, resolved.ceiling,
                                             hard_ceiling=resolved.ceiling))

    def _known_window(self) -> int | None:
        override = self.ceiling_overrides.get(CONTEXT_TOKENS)
        if override is not None:
            return override
        settings, model = self.settings, self.spec.model
        endpoints = settings.get("providers")
        entry = endpoints.get(self.spec.provider) if isinstance(endpoints, Mapping) else None
        endpoint = entry.get("context_window") if isinstance(entry, Mapping) else None
        if isinstance(endpoint, int) and not isinstance(endpoint, bool):
            return endpoint
        windows = settings.get("context_windows")
        if windows:
            from datamachine.context.window import parse_context_windows, window_for_model

            try:
                found = window_for_model(parse_context_windows(windows), model)
            except UsageError as exc:
                raise UsageError(f"{exc} Fix it with `datamachine settings set "
                                 "context_windows ...`.") from None
            if found is not None:
                return found
        setting = self.services.budgets.setting_ceiling(CONTEXT_TOKENS,
                                                        settings=settings.get)
        if setting is not None:
            return setting
        if endpoint == "auto":
            ask = getattr(self.provider, "reported_context_window", None)
            if callable(ask):
                reported = ask(model)
                if isinstance(reported, int) and reported > 0:
                    return int(reported)
        stored = self._stored_compaction()
        learned = stored.get("context_window") if stored is not None else None
        # A stored session's window, as an earlier run learned it (from an overflow answer).
        return learned if isinstance(learned, int) and learned > 0 else None

    def _stored_compaction(self) -> dict[str, Any] | None:
        """The session's latest compaction (a run on a stored session: chat, continue,
        resume), read once; None for any other run."""
        if self.writer is None:
            return None
        if self._stored is None:
            self._stored = self.services.transcripts.latest_compaction(
                self.writer.session_id) or {}
        return self._stored or None

    def _compaction(self) -> CompactionConfig | None:
        """``context_compaction``: the payload's, else the setting's (None: off)."""
        from datamachine.context.window import parse_compaction

        given = self.spec.runtime.context_compaction
        if given is not None:
            return parse_compaction(given, "payload['context_compaction']")
        return parse_compaction(self.settings.get("context_compaction"),
                                "setting 'context_compaction'")

    def _context_guard(self, budget: IterationBudget) -> ContextGuard:
        from datamachine.context.guard import ContextGuard
        from datamachine.context.window import answer_reserve

        caller = self.services.pm.hook.compact_context
        hook = None
        if caller.get_hookimpls():
            def hook(messages: list[Message], context: dict[str, Any]) -> object:
                return caller(messages=messages, context=context)
        guard = ContextGuard(
            budget, config=self._compaction(),
            reserve=answer_reserve(self.provider_turn.options, self.settings.get,
                                   budget.ceiling()),
            turn=self.provider_turn, emit=self.events.emit, hook=hook, meter=self.meter,
            mode=self.spec.mode, session_id=self.session_id)
        # A stored session (chat, continue, resume): start from its latest compacted view
        # instead of compacting, and summarizing, its history again.
        stored = self._stored_compaction()
        if stored is not None:
            guard.start_from(stored, self.spec.messages)
        return guard

    def _overflow_guard(self, budgets: Mapping[str, IterationBudget]) -> ContextGuard:
        """The guard of a run that learns its window from a provider's "prompt too long"
        (no window was known): its budget joins the run, to be lowered to what was sent."""
        from datamachine.context.window import MAX_WINDOW

        budget = IterationBudget(CONTEXT_TOKENS, MAX_WINDOW, hard_ceiling=MAX_WINDOW)
        cast(dict[str, IterationBudget], budgets).setdefault(CONTEXT_TOKENS, budget)
        self.context_budget = budget
        self.context = self.context_slot.hold(self._context_guard(budget))
        return self.context

    def _meter(self) -> RunMeter | None:
        """What the run's requests spend: its token and cost budgets, the model's price and
        the spend windows it counts against (None when there is nothing to count)."""
        spec, settings = self.spec, self.settings
        own = {b.name(): b for b in self.budgets if b.name() in METERED_BUDGETS}
        prices, limits_setting = settings.get("prices"), settings.get("spend_limits")
        if not own and not prices and not limits_setting:
            return None  # nothing to count: the run never enters the metering modules
        price = price_for(prices, spec.model)
        limits = parse_spend_limits(limits_setting)
        spend = None
        if limits:
            spend = SpendWindows(self.services.spend, limits,
                                 scopes_of(spec.payload, spec.runtime.token_name,
                                           self.session_id),
                                 spec.runtime.transcript_lock_ttl)
            taken = {b.name() for b in (self.turn_budget, *self.budgets)}
            for budget in spend.budgets:
                if budget.name() in taken:
                    raise UsageError(f"Spend limit {budget.name()!r} has the name of a budget of "
                                     "this run; rename it in the setting 'spend_limits'.")
            self.budgets += spend.budgets
            spend = spend if spend.budgets else None
        if not own and price is None and spend is None:
            return None
        units: dict[str, str] = {name: self.services.budgets.unit(name) for name in own}
        units.update({limit.name: limit.unit for limit in limits})
        check_metered_run(units, price, spec.model,
                          [*own, *(b.name() for b in spend.budgets)] if spend else list(own))
        return RunMeter(tokens=own.get(TOTAL_TOKENS), cost=own.get(COST), price=price,
                        spend=spend, units=units)

    def _pressure(self) -> PressureTracker | None:
        given, setting = (self.spec.runtime.budget_pressure,
                          self.settings.get("budget_pressure"))
        if given is None and setting is not True:
            return None  # pressure is off (the setting's default)
        rules = parse_budget_pressure(given, setting)
        if rules is False:
            return None
        units = dict(self.meter.units) if self.meter is not None else {}
        # The loop guard's count is no resource to economize: the guard tells the model
        # itself.
        skip: frozenset[str] = frozenset({STUCK_TURNS})
        if self.context_budget is not None:
            # The window takes part in pressure only when nothing compacts the context.
            if self._compaction() is None:
                units[CONTEXT_TOKENS] = "tokens"
            else:
                skip = frozenset({CONTEXT_TOKENS, STUCK_TURNS})
        return PressureTracker(rules, self.events.emit, units, skip=skip)

    def _provider_turn(self, on_text: Callable[[str], None] | None) -> ProviderTurn:
        spec, services, tools = self.spec, self.services, self.completion.tools
        # Setting allow_model_requests off (tests): only a provider that never leaves the
        # process (scripted) or a text_result hook may answer. Fails closed: anything but
        # true (false, 0, "no", a bad value) refuses.
        refused = (not getattr(self.provider, "answers_offline", False)
                   and self.settings.get("allow_model_requests", True) is not True)
        refusal = refusal_message(self.settings, spec.provider) if refused else ""
        hook = services.pm.hook
        hooked = frozenset([name for name in ("text_result", "provider_availability")
                            if getattr(hook, name).get_hookimpls()])
        if refused and "text_result" not in hooked:
            # Nothing in the process could answer: raised before anything runs or is stored
            # (a returned error result would let a test that forgets the status pass).
            raise ModelRequestsDisabled(refusal, provider=spec.provider)
        return ProviderTurn(
            provider=self.provider, provider_name=spec.provider, model=spec.model,
            mode=spec.mode, tools=[t.to_provider_dict() for t in tools.values()],
            tools_json="[" + ",".join(t.provider_json() for t in tools.values()) + "]",
            payload=spec.payload, options=self._model_options(),
            timeouts=resolve_timeouts(services, spec.mode, spec.provider, spec.model,
                                      spec.payload, self.settings.get),
            emit=self.events.emit, emit_active=self.events.active, first=services.first,
            hooked=hooked, refused=refused, refusal=refusal, on_text=on_text,
            report_content=any(map(wants_content, self.observers)),
            call_keys=self.executor.index.keys, timeline=self.timeline)

    def _model_options(self) -> dict[str, Any]:
        """The setting ``model_options`` (checked here too: an environment variable is not
        checked when it is set), under the payload's; with an output type, its schema as
        ``response_format`` unless one was given."""
        setting = self.settings.get(MODEL_OPTIONS_KEY)
        options = (self.spec.runtime.model_options if setting is None else merge_model_options(
            validate_model_options(setting, f"setting {MODEL_OPTIONS_KEY!r}"),
            self.spec.runtime.model_options))
        if self.output is not None and "response_format" not in options:
            options = {**options, "response_format": self.output.response_format()}
        return options

    def _executor(self) -> ToolExecutor:
        spec, resumption = self.spec, self.resumption
        # Built even without tools: a model that calls a tool anyway reads "not found", and bad
        # tool_runtime_rules are refused before the run starts.
        return ToolExecutor(
            self.completion.tools, mode=spec.mode, payload=spec.payload,
            engine_data=self.engine_data, registry=self.services.budgets,
            runtime_rules=spec.runtime.tool_runtime_rules, warnings=self.warnings,
            host=self.services, closed_tools=self.closed_tools, hidden_tools=self.hidden_tools,
            pauses=self.confirmation.pauses, ceiling_overrides=self.ceiling_overrides,
            approved_call=resumption.approved_call if resumption is not None else None,
            declined_call=resumption.declined_call if resumption is not None else None,
            approval_id=resumption.approval_id if resumption is not None else None,
            in_doubt=self.in_doubt)

    def _transcript(self) -> tuple[Any, Any, str | None]:
        """(persister, lock, session id): the payload's, else the host's store."""
        if self.writer is not None:
            return None, None, self.writer.session_id
        runtime = self.spec.runtime
        persister, lock = runtime.transcript_persister, runtime.transcript_lock
        if persister is None and runtime.persist_transcript:
            persister = self.services.transcripts
            lock = lock if lock is not None else self.services.transcripts
        session_id = runtime.transcript_session_id
        if session_id is None and persister is not None:
            session_id = uuid.uuid4().hex
        return persister, lock, session_id

    # -- running ----------------------------------------------------------------------------
    def run(self) -> ConversationResult:
        """Run synchronously (async providers and tools are awaited on a private loop)."""
        return drive_sync(self.steps())

    async def arun(self) -> ConversationResult:
        """Run inside the caller's event loop."""
        return await drive_async(self.steps())

    def steps(self) -> Steps[ConversationResult]:
        """The run as a step generator: what :meth:`run` and :meth:`arun` drive, and what a
        larger sequence (a chat turn holding its session's lock) runs inside its own steps."""
        try:
            refused = self._preflight()
            if refused is not None:
                return refused
            end = yield from hooked_steps(self.spec.messages, self._loop_settings(),
                                          self.budgets, self.events)
            return self._result(end)
        except BaseException as exc:  # cancelled, interrupted, closed mid-run
            close_observers(self.observers, exc)
            raise
        finally:
            close_observers(self.observers, None)  # a no-op after the terminal event

    def _preflight(self) -> ConversationResult | None:
        """A run whose required tools are missing is refused before any provider call."""
        unavailable = self.completion.unavailable_tools()
        if not unavailable:
            self.completion.start_job()
            return None
        budgets = {b.name(): b.snapshot() for b in [self.turn_budget, *self.budgets]}
        fields = self.completion.preflight_failure(unavailable, budgets,
                                                   len(self.spec.messages))
        return ConversationResult(
            messages=list(self.spec.messages), usage=empty_usage(), budgets=budgets,
            cumulative_turn_count=self.cumulative_base,
            warnings=[*self.warnings, *self.completion.warnings], mode=self.spec.mode,
            provider=self.spec.provider, model=self.spec.model, **fields)

    def _loop_settings(self) -> LoopSettings:
        spec, runtime, resumption = self.spec, self.spec.runtime, self.resumption
        return LoopSettings(
            hooks=self, turn_budget=self.turn_budget, mode=spec.mode, payload=spec.payload,
            estimates=(self.meter is not None and self.meter.estimates)
            or self.context is not None,
            persister=self.persister, lock=self.lock, writer=self.writer,
            session_id=self.session_id, ttl=runtime.transcript_lock_ttl,
            request={"provider": spec.provider, "model": spec.model, "mode": spec.mode,
                     "token_name": runtime.token_name},
            pending_calls=(resumption.pending_calls if resumption is not None
                           else waiting_calls(self.in_doubt.intents)
                           if self.in_doubt is not None else ()),
            stop_on_budget=resumption.declined_budget if resumption is not None else None)

    # -- the loop's hooks -------------------------------------------------------------------
    def run_turn(self, messages: list[Message], context: TurnContext
                 ) -> TurnAnswer | Awaitable[TurnAnswer]:
        """One provider turn: the request (with budget pressure), its answer, and what the
        answer means here (what it cost, a chat session's limit, a nudge)."""
        if self.between_turns is not None:
            return self._turn_when_ready(self.between_turns, messages, context)
        return self._turn(messages, context)

    async def _turn_when_ready(self, ready: Callable[[], Awaitable[None]],
                               messages: list[Message], context: TurnContext) -> TurnAnswer:
        """A streamed run's turn: once its consumer has taken every event so far."""
        await ready()
        answer = self._turn(messages, context)
        return answer if type(answer) is TurnAnswer else await cast(
            Awaitable[TurnAnswer], answer)

    def _turn(self, messages: list[Message], context: TurnContext
              ) -> TurnAnswer | Awaitable[TurnAnswer]:
        provider_turn = self.provider_turn
        if self.stop_requested:
            # The stream's consumer left: no more provider calls; the run ends aborted.
            return TurnAnswer("", [], {}, provider_turn.metadata, True, [])
        sent = messages  # what the request sends: the transcript, or its compacted view
        guard = self.context
        if guard is not None:
            if guard.prepared_turn != context.turn and not guard.fits(messages, context.turn):
                # A guard made after the loop's settings (an overflow taught the window):
                # the request is compacted here.
                return run_steps(self._compacted_turn(guard, messages, context))
            if guard.view is not None:
                sent = guard.view  # fits() brought it up to date
        extra, offered = self._pressure_notices(context)
        loop_guard = self.guard
        if loop_guard is not None and (loop_guard.nudge is not None or self.hidden_tools):
            extra, offered = self._guarded(loop_guard, extra, offered)
        request = provider_turn.request(sent, context.turn, extra=extra, tools=offered,
                                        deadline=context.deadline)
        try:
            response = provider_turn.send(request)
        except ProviderError as exc:
            self._failed(exc)
            if exc.code != CONTEXT_OVERFLOW:
                raise
            return run_steps(self._recovered(self.context or self._overflow_guard(
                context.budgets), exc, messages, context, extra, offered))
        except BaseException as exc:
            self._failed(exc)
            raise
        if type(response) is not ProviderResponse:
            return self._answer_later(cast(Awaitable[ProviderResponse], response), messages,
                                      context, extra, offered)
        return self._answer(response, messages, context)

    def _compacted_turn(self, guard: ContextGuard, messages: list[Message],
                        context: TurnContext) -> Steps[TurnAnswer]:
        """A turn whose request must be compacted first (the loop did not size it)."""
        yield from guard.prepare(messages, context.turn)
        answer = self._turn(messages, context)
        if type(answer) is not TurnAnswer:
            answer = cast(TurnAnswer, (yield cast(Awaitable[TurnAnswer], answer)))
        return answer

    def _pressure_notices(self, context: TurnContext
                          ) -> tuple[list[dict[str, str]] | None, list[dict[str, Any]] | None]:
        """Budget pressure notices for this request only (never the transcript), and the
        tools it offers (None: all)."""
        if self.pressure is None:
            return None, None
        extra, offered = self.pressure.apply(self.provider_turn.tools, context.budgets)
        self._close_hidden(offered)
        return extra, offered

    def _recovered(self, guard: ContextGuard, error: ProviderError, messages: list[Message],
                   context: TurnContext, extra: list[dict[str, str]] | None,
                   offered: list[dict[str, Any]] | None) -> Steps[TurnAnswer]:
        """The provider said the prompt was too long: the window is lowered to what was sent,
        the request compacted and sent again, at most twice a turn (no turn is counted); then
        the run stops on the window."""
        number = context.turn
        while True:
            if not guard.overflowed(error, number, self.provider_turn.sent_bytes):
                raise guard.spent(number)
            yield from guard.prepare(messages, number)
            request = self.provider_turn.request(guard.messages(messages), number,
                                                 extra=extra, tools=offered,
                                                 deadline=context.deadline)
            try:
                sent = self.provider_turn.send(request)
                response = sent if type(sent) is ProviderResponse else (
                    yield cast(Awaitable[ProviderResponse], sent))
            except ProviderError as exc:
                self._failed(exc)
                if exc.code != CONTEXT_OVERFLOW:
                    raise
                error = exc
                continue
            except BaseException as exc:
                self._failed(exc)
                raise
            return self._answer(cast(ProviderResponse, response), messages, context)

    def run_tool(self, call: ToolCall, messages: list[Message], context: TurnContext) -> object:
        """One call through the run's tool executor."""
        return self.executor.execute(call.name, call.id, call.parameters, messages, context)

    def after_tool(self, outcome: ToolOutcome, context: TurnContext) -> Decision | None:
        """The loop guard sees how the call ended; the completion rules have their word."""
        call = outcome.call
        if self.guard is not None:
            self.guard.ran(call.name, call.parameters, outcome.result, context.budgets)
        return self.completion.on_tool_result(call, outcome.result, context.turn)

    def estimate_request(self, messages: list[Message], context: TurnContext
                         ) -> Mapping[str, int] | Awaitable[Mapping[str, int] | None] | None:
        """The coming request's tokens and cost, with its spend reserved (metered runs); with
        a context window, the request sized (and compacted when it must be) first."""
        guard = self.context
        if guard is not None:
            if not guard.fits(messages, context.turn):
                return run_steps(self._estimate(guard, messages, context))
            if guard.view is not None:
                messages = guard.view
        if self.meter is None:
            return None
        return self.meter.estimate(self.provider_turn.request_bytes(messages))

    def _estimate(self, guard: ContextGuard, messages: list[Message], context: TurnContext
                  ) -> Steps[Mapping[str, int] | None]:
        yield from guard.prepare(messages, context.turn)
        if self.meter is None:
            return None
        return self.meter.estimate(self.provider_turn.request_bytes(guard.messages(messages)))

    def budget_spent(self, budget: IterationBudget, context: TurnContext) -> bool | Pause:
        """Ask ``confirm_continuation``; extend by ``extend_by``, else the original ceiling.
        With ``confirmation="pause"``: stop and wait for ``resume`` instead."""
        spec = self.spec
        # extend_by counts (turns, calls); a token or cost budget grows by its own ceiling.
        counted = self.meter is None or budget.name() not in self.meter.units
        by = ((spec.runtime.extend_by if counted else None)
              or self.ceilings.get(budget.name(), budget.ceiling()))
        if self.resumption is not None and self.resumption.declined_budget == budget.name():
            return False  # a person already said no
        # The loop guard's budget is not extended: a person who lets the run go on resets it.
        stuck = self.guard is not None and budget is self.guard.made
        if self.confirmation.pauses():
            return Pause({"kind": "stuck" if stuck else "budget", "budget": budget.name(),
                          "tool_call": None, "extend_by": by})
        answer = self.services.first("confirm_continuation", budget=budget, context={
            "turn": context.turn, "budget": budget.name(),
            "kind": "stuck" if stuck else "budget_exhausted",
            "mode": spec.mode, "session_id": self.session_id, "provider": spec.provider,
            "model": spec.model,
        })
        if answer is not True:
            return False
        if stuck:
            assert self.guard is not None
            self.guard.approved()
        else:
            budget.extend(by)
        return True

    def stop(self, stop: RunStop, context: TurnContext) -> StopVerdict | Awaitable[StopVerdict]:
        """The final summary, then the verdict, still under the lock and before anything is
        stored, so storage, job, events and result agree."""
        return run_steps(self._stop_steps(stop, context))

    # -- a turn's answer --------------------------------------------------------------------
    def _close_hidden(self, offered: list[dict[str, Any]]) -> None:
        closed = self.closed_tools
        closed.clear()
        every = self.provider_turn.tools
        if offered is not every:
            kept = {tool["name"] for tool in offered}
            closed.update(t["name"] for t in every if t["name"] not in kept)

    def _failed(self, error: BaseException) -> None:
        # A request that failed may have reached the provider (a timeout, a cut stream):
        # it is charged its estimate; its retries are counted.
        if self.meter is not None:
            self.meter.charge_failed()
        if isinstance(error, ProviderError) and self.retries is not None:
            self._count_retries(len(error.failed_attempts))
            if error.retries_spent:
                self.spent_retries = True

    def _count_retries(self, retried: int) -> None:
        """``provider_retries`` shows the most retries one request of the run took."""
        retries = self.retries
        if retries is not None and retried > retries.current():
            retries.set_current(retried)

    async def _answer_later(self, pending: Awaitable[ProviderResponse], messages: list[Message],
                            context: TurnContext, extra: list[dict[str, str]] | None,
                            offered: list[dict[str, Any]] | None) -> TurnAnswer:
        try:
            response = await pending
        except ProviderError as exc:
            self._failed(exc)
            if exc.code != CONTEXT_OVERFLOW:
                raise
            guard = self._overflow_guard(context.budgets)
            answer = run_steps(self._recovered(guard, exc, messages, context, extra, offered))
            return answer if type(answer) is TurnAnswer else await cast(
                Awaitable[TurnAnswer], answer)
        except BaseException as exc:
            self._failed(exc)
            raise
        return self._answer(response, messages, context)

    def _answer(self, response: ProviderResponse, messages: list[Message],
                context: TurnContext) -> TurnAnswer:
        if response.ignored_usage is not None and not self._usage_warned:
            self._usage_warned = True
            logger.warning(describe_ignored_usage(self.spec.provider, response.ignored_usage))
        if self.meter is not None:
            self.meter.settle(response.usage, response.content, response.tool_calls)
        if response.failed_attempts:
            self._count_retries(len(response.failed_attempts))
        if self.context is not None:
            self.context.observe(response.usage)
        # An answer without calls that the output token limit cut off (see verdict.decide).
        self.answer_truncated = (response.finish_reason == "length"
                                 and not response.tool_calls)
        if self.pressure is not None:
            self.pressure.observe(response.content, response.tool_calls)
        calls, complete, continuation = response.tool_calls, self.spec.single_turn, []
        gate = self.turn_gate
        if gate is not None and not gate(context.turn):
            # Declined at a chat session's limit: this turn's calls do not run, the run ends,
            # and the limit joins the run's budgets so the result (stored and returned) shows
            # what stopped it.
            calls, complete = [], True
            spent = gate.budget()
            cast(dict[str, IterationBudget], context.budgets).setdefault(spent.name(), spent)
        elif self.stop_requested:
            calls, complete = [], True  # the consumer left: this turn's calls do not run
        elif not calls:
            continuation = self._natural_completion(messages, response.content, context)
        if self.guard is not None and not complete and (calls or continuation):
            # A turn that ends the run (an answer nothing follows) is not judged.
            self.guard.answered(context.turn, response.content, len(calls), context.budgets)
        pause = None
        if gate is not None and gate.pending is not None and (calls or continuation) \
                and not complete:
            pause = gate.pending  # at the limit, paused: the calls wait for the answer
        # Every value here is the run's own (the response was normalized), so the loop takes
        # it as it is instead of validating a TurnResult every turn.
        return TurnAnswer(response.content, calls, response.usage, self.provider_turn.metadata,
                          complete, continuation, pause)

    def _natural_completion(self, messages: list[Message], content: str,
                            context: TurnContext) -> list[Message]:
        """What an answer without tool calls meets: an empty one after tool calls is asked
        again once, then the output type (an answer that does not fit is asked again), then
        the completion policy."""
        completion = self.completion
        if not content.strip() and completion.called_tools:
            return completion.on_empty_answer(messages, context.turn)
        if self.output is not None:
            retry = self.output.check(content)
            if retry:
                return retry
        return completion.on_natural_completion(messages, content, context.turn)

    # -- stopping ---------------------------------------------------------------------------
    def _stop_steps(self, stop: RunStop, context: TurnContext) -> Steps[StopVerdict]:
        spent = self._spent_repeat(stop)
        if spent is not None:
            self.events.emit("budget_exceeded", spent_payload(spent))
        meter = self.meter
        if meter is not None:
            meter.release()  # a request that never answered gives its reservation back
        summary = None
        if not self.provider_turn.partial_text:  # a stream cut mid-way keeps its own words
            summary = yield from self.summary.steps(
                stop, context.deadline,
                on_overflow=lambda exc: self._summary_overflowed(exc, context))
        usage = dict(self.summary.usage)
        if self.context is not None:
            for key, value in self.context.usage.items():
                usage[key] = usage.get(key, 0) + value
        if meter is not None:
            meter.release()
            if meter.cost_usd is not None:
                usage["cost_usd"] = meter.cost_usd  # the whole run's, summary included
        pending_extra = None
        if stop.status == "awaiting_confirmation":
            # What resuming needs beyond the loop's word: the tools to offer again, by name.
            pending_extra = {"tools": sorted(self.completion.tools),
                             "pause_id": uuid.uuid4().hex}
            if self.hidden_tools:
                pending_extra["hidden_tools"] = sorted(self.hidden_tools)
        verdict, self.diagnostics = self._decide(
            stop, summary=summary, summary_usage=usage, pending_extra=pending_extra,
            warnings=[*self.warnings, *self.completion.warnings],
            timeline=self.timeline.entries if self.timeline is not None else None,
            compactions=self.context.stored_records() if self.context is not None else None)
        self.verdict = verdict  # applied by the loop: its end carries our warnings
        return verdict

    def _summary_overflowed(self, error: BaseException, context: TurnContext) -> bool:
        """The final summary's prompt was too long for the model: the window is learned (or
        lowered) so the next try is made to fit it."""
        if not isinstance(error, ProviderError):
            return False
        guard = self.context or self._overflow_guard(context.budgets)
        guard.overflowed(error, context.turn, self.provider_turn.sent_bytes)
        return True

    def _repeat_snapshots(self, spent: IterationBudget | None
                          ) -> dict[str, dict[str, object]]:
        """The run's repeat counters that counted something or stopped the run (a result
        shows a budget that did not stop the run only when it counted)."""
        return {budget.name(): dict(budget.snapshot())
                for budget in (self.retries, self.completion.made_nudges,
                               self.output.retries if self.output is not None else None)
                if budget is not None and (budget.current() or budget is spent)}

    def _spent_repeat(self, stop: RunStop) -> IterationBudget | None:
        """The repeat counter that ended the run, if one did: a request with no retry left
        (the run ends ``error``), a nudge or an output re-ask the budget had no room for (the
        run ends ``incomplete``)."""
        if stop.status == "error":
            return self.retries if self.spent_retries else None
        if stop.status != "completed":
            return None
        if self.completion.nudges_spent:
            return self.completion.nudges
        output = self.output
        if output is not None and output.retries_spent and output.value is None:
            return output.retries
        return None

    def _decide(self, stop: RunStop, **extra: Any) -> tuple[StopVerdict, dict[str, Any]]:
        spent = self._spent_repeat(stop)
        return decide(stop, turn_ceiling=self.turn_budget.ceiling(), completion=self.completion,
                      abort=self._abort(), truncated=self.answer_truncated,
                      output=self.output, partial=self.provider_turn.partial_text,
                      metered_warning=self._metered_warning(stop),
                      spent=spent, budgets=self._repeat_snapshots(spent), **extra)

    def _metered_warning(self, stop: RunStop) -> str | None:
        """The warning of a stop on a token or cost budget, in tokens or dollars."""
        meter = self.meter
        if meter is None or stop.budget is None or stop.status != "budget_exceeded":
            return None
        return meter.stop_warning(stop.budget, stop.budgets.get(stop.budget, {}))

    def _abort(self) -> Abort | None:
        if self.stop_requested:
            return Abort(STREAM_LEFT)
        gate = self.turn_gate
        return Abort(gate.notice, gate.budget()) if gate is not None and gate.aborted else None

    def request_stop(self) -> None:
        """Stop at the next safe point (the consumer of a stream left): the provider's stream
        is closed, no further call or turn runs, and the run ends ``aborted``, its transcript
        stored and its lock released as at any other end."""
        self.stop_requested = True
        self.provider_turn.stop()

    def _result(self, end: RunStop) -> ConversationResult:
        """The run's one result: the loop's decided end, with the product's diagnostics; then
        the pipeline job is settled with it (after storage, so it records the stored id)."""
        self.completion.raise_policy_error()
        if self.verdict is None or self.verdict.status != end.status:
            # The stop hook never ran (lock contention) or failed, or the final write lost
            # the lock: the loop's own end is the run's; decide what it means now.
            warnings = ([*self.warnings, *self.completion.warnings, *end.warnings]
                        if self.verdict is None else end.warnings)
            verdict, self.diagnostics = self._decide(end, warnings=warnings)
            end = end.decided(verdict, end.budgets)
        spec, status = self.spec, end.status
        result = unchecked(
            ConversationResult,
            messages=end.messages, final_content=end.final_content,
            turn_count=end.turn_count,
            cumulative_turn_count=self._cumulative(end),
            completed=status == "completed", status=status,
            budget=end.budget, flags=list(end.flags),
            max_turns_reached=status == "budget_exceeded" and end.budget == CONVERSATION_TURNS,
            warning=end.warning, error=end.error, error_code=end.error_code,
            usage=end.usage,
            tool_execution_results=[r for r in end.tool_execution_results
                                    if not is_rejected(r["result"])],
            last_tool_calls=end.last_tool_calls,
            request_metadata=end.request_metadata or self.provider_turn.metadata,
            transcript_session_id=end.session_id, budgets=end.budgets,
            warnings=list(end.warnings), unavailable_required_tool_names=[],
            available_tool_names=[], mode=spec.mode, provider=spec.provider, model=spec.model,
            output=(self.output.value if self.output is not None
                    and status == "completed" else None),
            pending=end.pending,
            compactions=self.context.compactions if self.context is not None else 0,
            **_result_diagnostics(self.diagnostics))
        if status == "awaiting_confirmation" and result.transcript_session_id:
            paused_runs(self.services).keep(result.transcript_session_id, PausedRun(
                tools=dict(self.completion.tools),
                payload=kept_payload(spec.payload, spec.runtime),
                pause_id=str((end.pending or {}).get("pause_id"))))
        if self.completion.job is not None:  # a pipeline job's record, read only for one
            self.completion.settle_job(_job_fields(result))
        return result


    def _cumulative(self, end: RunStop) -> int:
        """Every run's turns on this transcript: a run given the id of a transcript the host
        already stores (``transcript_session_id``) goes on counting from its stored runs."""
        if (self.cumulative_base == 0 and self.spec.runtime.transcript_session_id is not None
                and self.persister is self.services.transcripts and end.session_id
                and end.status != "transcript_lock_contention"):
            try:
                stored = self.services.transcripts.summary(end.session_id)
                return int(stored.cumulative_turn_count)
            except DataMachineError:  # not stored after all (a failed write): this run's
                pass
        return self.cumulative_base + end.turn_count


# Budgets the product holds and counts itself (repeats; the loop never checks them): a run that
# resumes makes them anew from the stored snapshot, never as loop budgets.
_PRODUCT_HELD = frozenset({WALL_CLOCK, PROVIDER_RETRIES, COMPLETION_NUDGES, OUTPUT_RETRIES,
                           STUCK_TURNS})

_DIAGNOSTIC_DEFAULTS: dict[str, Any] = {
    "completion_nudge_count": 0, "completion_nudge": None, "blocker": None,
    "remaining_handlers": [], "completion_assertions_required": {},
    "completion_assertions_missing": {}, "completion_assertions_satisfied": {},
    "completion_assertions_complete": None,
}


_JOB_FIELDS = ("status", "completed", "turn_count", "usage", "transcript_session_id", "warning",
               "error", "error_code", "completion_nudge_count", "completion_nudge", "blocker",
               "completion_assertions_required", "completion_assertions_missing",
               "completion_assertions_satisfied", "completion_assertions_complete",
               "unavailable_required_tool_names", "available_tool_names", "remaining_handlers",
               "flags", "budget", "budgets")


def _job_fields(result: ConversationResult) -> dict[str, Any]:
    """What a pipeline job records of its run's result."""
    return {key: getattr(result, key) for key in _JOB_FIELDS}


def _ceiling_overrides(services: Services, given: Mapping[str, int],
                       warnings: list[str]) -> dict[str, int]:
    """payload ``budget_ceilings``, each checked against its budget's unit (0 only for a
    budget that counts repeats). A name nobody registered is kept (a tool may make that budget
    later), with a warning when it looks like a registered budget misspelt."""
    if not given:
        return {}
    registry = services.budgets
    for name, ceiling in given.items():
        knob = f"payload['budget_ceilings'][{name!r}]"
        registry.check_ceiling(name, knob, ceiling)
        meant = registry.meant(name)
        if meant is not None:
            warnings.append(f"{knob}: {MISNAMED} {name!r}, so this ceiling limits only "
                            f"a budget a tool makes under that name; did you mean {meant!r}?")
    return dict(given)


def _made(registry: IterationBudgetRegistry, name: str, override: int | None,
          warnings: list[str], settings: Callable[[str], Any],
          resumption: Resumption | None) -> IterationBudget:
    """Budget ``name`` from the registry (override, else setting, else default; a clamp
    reported in ``warnings``), carried on from the paused run a resumed run goes on from."""
    return _carried(registry.create(name, ceiling_override=override, warnings=warnings,
                                    settings=settings), resumption)


def _carried(budget: IterationBudget, resumption: Resumption | None) -> IterationBudget:
    """``budget`` with the count and ceiling its paused run stored (never past its hard
    ceiling), extended when an approval answered it; as it is for a new run."""
    if resumption is None:
        return budget
    budget = _restored(budget, resumption.budgets.get(budget.name()))
    if resumption.extend is not None and resumption.extend[0] == budget.name():
        if budget.name() == STUCK_TURNS:
            budget.set_current(0)  # a person let a stuck run go on: it counts anew
        else:
            budget.extend(resumption.extend[1])
    return budget


def _restored(budget: IterationBudget, snapshot: Mapping[str, Any] | None) -> IterationBudget:
    """``budget`` with the count and ceiling a paused run stored (never past its hard
    ceiling); as it is when the paused run had no such budget."""
    if not snapshot:
        return budget
    current, ceiling = snapshot.get("current"), snapshot.get("ceiling")
    if not isinstance(current, int) or not isinstance(ceiling, int):
        return budget
    hard = budget.hard_ceiling()
    return IterationBudget(budget.name(), min(ceiling, hard) if hard is not None else ceiling,
                           current, hard_ceiling=hard, max_seconds=budget.max_seconds(),
                           min_ceiling=budget.min_ceiling())


def _result_diagnostics(diagnostics: Mapping[str, Any]) -> dict[str, Any]:
    return {key: diagnostics.get(key, default) for key, default in _DIAGNOSTIC_DEFAULTS.items()}
