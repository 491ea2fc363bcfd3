"""``run_conversation``: one :class:`ConversationRun`, the product adapter over the generic loop
(DESIGN.md sections 5 and 11).

A run is built whole before anything runs: its arguments checked (:class:`RunSpec`), its budgets
resolved through the registry (clamps reported), its completion state, turn runner, tool
executor and transcript wired together through their constructors. Then ``agents_api``'s loop
runs it; when the loop stops, the run decides its verdict once (:mod:`.verdict`) and the result
is built once from the loop's result and that verdict. The loop owns mechanics; this module owns
policy.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Mapping
from typing import Any, Protocol, cast

from agents_api import (
    IterationBudget,
    LoopResult,
    Pause,
    RunStop,
    StopVerdict,
    TranscriptWriter,
    clock,
)
from agents_api.drive import Steps, drive_async, drive_sync, run_steps
from agents_api.errors import brief_repr
from agents_api.loop import loop_steps
from agents_api.names import per_tool_budget
from agents_api.unchecked import unchecked
from datamachine.budgets_builtin import (
    CONVERSATION_TURNS,
    COST,
    METERED_BUDGETS,
    TOOL_CALLS,
    TOTAL_TOKENS,
    WALL_CLOCK,
)
from datamachine.completion.controller import CompletionRun
from datamachine.conversation.exhaustion import FinalSummary
from datamachine.conversation.metering import RunMeter, check_metered_run, price_for
from datamachine.conversation.output import OutputContract
from datamachine.conversation.pausing import (
    Confirmation,
    PausedRun,
    Resumption,
    kept_payload,
    paused_runs,
)
from datamachine.conversation.payload import base_log_context, split_payload
from datamachine.conversation.pressure import PressureTracker, parse_budget_pressure
from datamachine.conversation.result import ConversationResult, empty_usage
from datamachine.conversation.spec import RunSpec
from datamachine.conversation.spending import SpendWindows, parse_spend_limits, scopes_of
from datamachine.conversation.timeline import TIMELINE_EVENTS, RunTimeline
from datamachine.conversation.timeouts import resolve_timeouts
from datamachine.conversation.turns import ProviderTurnRunner, TurnGate
from datamachine.conversation.verdict import ProductVerdict, decide
from datamachine.errors import UsageError
from datamachine.observe import RunInfo, RunObserver, close_observers, wants_content
from datamachine.providers.options import (
    MODEL_OPTIONS_KEY,
    merge_model_options,
    validate_model_options,
)
from datamachine.registry import unit_maximum, validate_budget_value
from datamachine.services import Services
from datamachine.tools.results import is_rejected

__all__ = ["ConversationRun", "RunEmitter", "emit_outside_run", "run_emitter"]

logger = logging.getLogger("datamachine.conversation")


class RunEmitter(Protocol):
    """A run's ``emit(event, payload)``: to the payload's sink and the ``on_loop_event`` hook.

    ``active`` is False when neither exists: then nothing is built per event, and the loop is
    given no sink at all.
    """

    active: bool

    def __call__(self, event: str, payload: dict[str, Any]) -> None:
        """Deliver one event (with the run's base log context) to every listener."""


def run_emitter(services: Services, sink: Any, base: dict[str, Any],
                observers: tuple[RunObserver, ...] = (),
                timeline: RunTimeline | None = None) -> RunEmitter:
    """The :class:`RunEmitter` of one run (``sink``: the payload's ``event_sink``;
    ``observers``: what the ``run_observer`` hook returned for the run; ``timeline``: where
    the run records its rare events, listened to or not).

    A closure rather than an object with ``__call__``: calling an instance looks ``__call__``
    up and binds it on every call, and a run emits several events per turn.
    """
    if sink is not None and not callable(sink):
        sink = sink.emit
    caller = services.pm.hook.on_loop_event
    hook = caller if caller.get_hookimpls() else None
    active = sink is not None or hook is not None or bool(observers)

    def emit(event: str, payload: dict[str, Any]) -> None:
        if timeline is not None and event in TIMELINE_EVENTS:
            try:
                timeline.record(event, payload)
            except Exception:  # the loop calls this unguarded (never_raises)
                logger.warning("datamachine: recording %r on the run's timeline failed", event,
                               exc_info=True)
        if not active:
            return
        data = {**base, **payload}
        for observer in observers:
            try:
                observer.event(event, data)
            except Exception:
                logger.warning("datamachine: run observer %r failed on %r", observer, event,
                               exc_info=True)
        if sink is not None:
            try:
                sink(event, data)
            except Exception:
                logger.warning("datamachine: event sink failed on %r", event, exc_info=True)
        if hook is not None:
            try:
                hook(event=event, payload=data)
            except Exception:
                logger.warning("datamachine: on_loop_event hook failed on %r", event,
                               exc_info=True)

    emit.active = active  # type: ignore[attr-defined]
    # Per-turn events only for listeners; the loop's rare ones always (the timeline's).
    emit.per_turn_events = active  # type: ignore[attr-defined]
    emit.never_raises = True  # type: ignore[attr-defined]  # the loop calls it unguarded
    return cast(RunEmitter, emit)


def emit_outside_run(services: Services, payload: Mapping[str, Any] | None, event: str,
                     data: dict[str, Any]) -> None:
    """Emit an event for a run that never reached the loop (the payload's sink and the hook)."""
    _, runtime = split_payload(payload)
    run_emitter(services, runtime.event_sink, {})(event, data)


STREAM_LEFT = "The consumer of the stream stopped reading; the run was ended early."


class ConversationRun:
    """One ``run_conversation`` call (see the module docstring).

    ``writer``: the transcript writer of a session whose lock the caller already holds (chat and
    continuation read the stored history under it); ``turn_gate``: asked after every provider
    turn (a chat session's limit); ``cumulative_base``: the session's turns before this run;
    ``resumption``: where a paused run stopped, for the run that resumes it.
    """


    def __init__(self, services: Services, spec: RunSpec, *,
                 writer: TranscriptWriter | None = None, turn_gate: TurnGate | None = None,
                 cumulative_base: int = 0, resumption: Resumption | None = None) -> None:
        self.services = services
        self.spec = spec
        self.writer = writer
        self.turn_gate = turn_gate
        self.cumulative_base = cumulative_base
        self.resumption = resumption
        self.warnings: list[str] = []
        runtime = spec.runtime
        self.confirmation = Confirmation(services, runtime)
        self.persister, self.lock, self.session_id = self._transcript()
        base = base_log_context(spec.mode, spec.payload)
        self.observers = self._observers(base)
        self.timeline = RunTimeline()
        self.emit = run_emitter(services, runtime.event_sink, base, self.observers,
                                self.timeline)
        found = spec.payload.get("engine_data")
        self.engine_data: dict[str, Any] = found if isinstance(found, dict) else {}
        self.completion = CompletionRun.prepare(
            services, spec.modes, spec.payload, runtime, spec.tools, emit=self.emit,
            engine_data=self.engine_data, single_turn=spec.single_turn)
        self.provider = self._provider()
        self.output = (OutputContract(runtime.output_type)
                       if runtime.output_type is not None else None)
        self.ceiling_overrides = _ceiling_overrides(services, runtime.budget_ceilings)
        self.turn_budget = services.budgets.create(
            CONVERSATION_TURNS,
            ceiling_override=(spec.max_turns if spec.max_turns is not None
                              else self.ceiling_overrides.get(CONVERSATION_TURNS)),
            warnings=self.warnings)
        self.budgets = self._other_budgets()
        # What a confirmed extension adds by default: the budget's ceiling at the start.
        self.ceilings = {b.name(): b.ceiling() for b in (self.turn_budget, *self.budgets)}
        if resumption is not None:
            self._resume_budgets(resumption)
        self._number_timeline()
        self.meter = self._meter()
        self.executor = self._executor()
        self.runner = self._turn_runner()
        self.runner.report_content = any(wants_content(o) for o in self.observers)
        self.runner.closed_tools = self.executor.closed_tools  # one set: hidden = refused
        if self.meter is not None:
            self.runner.meter = self.meter
            self.meter.request_bytes = self.runner.request_bytes
        self.summary = FinalSummary(self.runner.summarize, self.emit,
                                    enabled=runtime.final_summary,
                                    usage=self.runner.summary_usage)
        # Decided once, by the stop handler (or after the loop for a run that never ran).
        self.verdict: ProductVerdict | None = None

    @classmethod
    def create(cls, services: Services, messages: Any, tools: Any, provider: Any, model: Any,
               mode: Any = "pipeline", payload: Any = None, max_turns: Any = None,
               single_turn: Any = False, **options: Any) -> ConversationRun:
        """Check the arguments and build the run (``options``: see the class)."""
        with services.settings.batch():  # one consistent read of the settings set-up uses
            spec = RunSpec.build(messages, tools, provider, model, mode, payload, max_turns,
                                 single_turn, known_modes=services.modes)
            run = cls.__new__(cls)
            try:
                run.__init__(services, spec, **options)  # type: ignore[misc]
            except BaseException as exc:
                # Refused during set-up (a budget ceiling, a bad option): observers that
                # started a span for the run end it, failed.
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
        provider: Any = self.services.providers.get(spec.provider)
        start_run = getattr(provider, "start_run", None)
        script = spec.runtime.script
        if callable(start_run):
            return start_run(script) if script is not None else start_run()
        if script is not None:
            raise UsageError(
                f"payload['script'] only applies to the scripted provider, not {spec.provider!r}.")
        return provider

    def _other_budgets(self) -> list[IterationBudget]:
        registry, overrides = self.services.budgets, self.ceiling_overrides
        budgets = [registry.create(TOOL_CALLS, ceiling_override=overrides.get(TOOL_CALLS),
                                   warnings=self.warnings)]
        # A registered tool_calls_<tool> budget bounds that tool in every run that offers it
        # (and so does a ceiling for it in budget_ceilings).
        budgets += [registry.create(name, ceiling_override=overrides.get(name),
                                    warnings=self.warnings)
                    for name in map(per_tool_budget, self.completion.tools)
                    if registry.is_registered(name) or name in overrides]
        # Token and cost budgets join a run only when a ceiling is set for it.
        budgets += [registry.create(name, ceiling_override=overrides.get(name),
                                    warnings=self.warnings)
                    for name in METERED_BUDGETS
                    if name in overrides or registry.setting_ceiling(name) is not None]
        max_seconds = self.spec.runtime.max_seconds
        if max_seconds is None:
            setting = self.services.settings.get("max_run_seconds")
            if setting is not None:
                if clock.duration(setting) is None:
                    raise UsageError(
                        "setting 'max_run_seconds' must be a finite positive number of seconds, "
                        f"got {brief_repr(setting)}: fix it with `datamachine settings set "
                        "max_run_seconds SECONDS` (or delete it).")
                max_seconds = setting
        if max_seconds is not None:
            # The wall clock is a hard rail: its hard ceiling equals its ceiling, so it is never
            # offered for extension, and its time rail keeps fractions of a second.
            seconds = max(1, math.ceil(max_seconds))
            budgets.append(IterationBudget(WALL_CLOCK, seconds, hard_ceiling=seconds,
                                           max_seconds=float(max_seconds)))
        return budgets

    def _meter(self) -> RunMeter | None:
        """What the run's requests spend: its token and cost budgets, the model's price and
        the spend windows it counts against (None when there is nothing to count)."""
        spec, settings = self.spec, self.services.settings
        own = {b.name(): b for b in self.budgets if b.name() in METERED_BUDGETS}
        price = price_for(settings.get("prices"), spec.model)
        limits = parse_spend_limits(settings.get("spend_limits"))
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

    def _turn_runner(self) -> ProviderTurnRunner:
        spec, tools = self.spec, self.completion.tools
        rules = parse_budget_pressure(spec.runtime.budget_pressure,
                                      self.services.settings.get("budget_pressure"))
        return ProviderTurnRunner(
            self.services, provider=self.provider, provider_name=spec.provider,
            model=spec.model, mode=spec.mode,
            tools=[t.to_provider_dict() for t in tools.values()], payload=spec.payload,
            timeouts=resolve_timeouts(self.services, spec.mode, spec.provider, spec.model,
                                      spec.payload),
            emit=self.emit, single_turn=spec.single_turn,
            pressure=None if rules is False else PressureTracker(
                rules, self.emit, self.meter.units if self.meter is not None else {}),
            tools_json="[" + ",".join(t.provider_json() for t in tools.values()) + "]",
            on_natural_completion=self._on_natural_completion(),
            turn_gate=self.turn_gate, call_keys=self.executor.index.keys,
            options=self._model_options(), timeline=self.timeline)

    def _model_options(self) -> dict[str, Any]:
        """The setting ``model_options`` (checked here too: an environment variable is not
        checked when it is set), under the payload's; with an output type, its schema as
        ``response_format`` unless one was given."""
        setting = self.services.settings.get(MODEL_OPTIONS_KEY)
        options = (self.spec.runtime.model_options if setting is None else merge_model_options(
            validate_model_options(setting, f"setting {MODEL_OPTIONS_KEY!r}"),
            self.spec.runtime.model_options))
        if self.output is not None and "response_format" not in options:
            options = {**options, "response_format": self.output.response_format()}
        return options

    def _on_natural_completion(self) -> Any:
        """What an answer without tool calls meets: the output type first (an answer that
        does not fit is asked again), then the completion policy."""
        policy = self.completion.on_natural_completion
        output = self.output
        if output is None:
            return policy

        def check(messages: list[Any], content: str, context: dict[str, Any]) -> list[Any]:
            if context.get("final_summary"):
                return []
            retry = output.check(content)
            return retry or policy(messages, content, context)

        return check

    def _executor(self) -> Any:
        from datamachine.tools import ToolExecutor

        spec = self.spec
        # Built even without tools: a model that calls a tool anyway reads "not found", and bad
        # tool_runtime_rules are refused before the run starts.
        executor = ToolExecutor(
            self.completion.tools, mode=spec.mode, payload=spec.payload,
            engine_data=self.engine_data, registry=self.services.budgets,
            runtime_rules=spec.runtime.tool_runtime_rules, warnings=self.warnings,
            host=self.services)
        executor.pauses = self.confirmation.pauses
        executor.ceiling_overrides = self.ceiling_overrides
        resumption = self.resumption
        if resumption is not None:
            executor.approved_call = resumption.approved_call
            executor.declined_call = resumption.declined_call
        return executor

    def _number_timeline(self) -> None:
        """The timeline numbers turns as the stored messages do: from 1 in every run (a
        resumed run's budget carries the paused run's count), after ``cumulative_base``
        turns of the session's earlier runs.

        Closes over the budget, never over the run: a run the timeline pointed back at would
        live until the cyclic garbage collector found it (and every collection would walk
        it), instead of going the moment its caller drops it."""
        budget, start = self.turn_budget, self.turn_budget.current()
        self.timeline.turn = lambda: budget.current() - start
        self.timeline.run_base = self.cumulative_base

    def _resume_budgets(self, resumption: Resumption) -> None:
        """Counts and ceilings carry on from the paused run; an approval extends the budget
        that stopped it."""
        restored = [_restored(b, resumption.budgets.get(b.name()))
                    for b in (self.turn_budget, *self.budgets)]
        # Budgets the paused run had beyond those a run starts with (one a tool created, a
        # per-tool one from budget_ceilings) carry on too.
        # Spend windows are read again from the store (their use moved on meanwhile).
        present = {b.name() for b in restored} | {
            limit.name for limit in parse_spend_limits(
                self.services.settings.get("spend_limits"))}
        for name, snapshot in resumption.budgets.items():
            if name not in present and name != WALL_CLOCK:
                restored.append(_restored(self.services.budgets.create(name), snapshot))
        self.turn_budget, self.budgets = restored[0], restored[1:]
        if resumption.extend is not None:
            name, by = resumption.extend
            for budget in restored:
                if budget.name() == name:
                    budget.extend(by)

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
            outcome = yield from loop_steps(self.spec.messages, self.runner,
                                            **self._loop_arguments())
            return self._result(outcome)
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

    def _loop_arguments(self) -> dict[str, Any]:
        spec = self.spec
        arguments: dict[str, Any] = {
            "turn_budget": self.turn_budget,
            "budgets": self.budgets,
            "tool_executor": self.executor,
            "on_event": self.emit,
            "context": {"mode": spec.mode, "payload": spec.payload},
            "request": {"provider": spec.provider, "model": spec.model, "mode": spec.mode,
                        "token_name": spec.runtime.token_name},
            "on_budget_exhausted": self._confirm_extension,
            "on_tool_result": self.completion.on_tool_result,
            "on_stop": self._on_stop,
        }
        if self.resumption is not None and self.resumption.pending_calls:
            arguments["pending_tool_calls"] = self.resumption.pending_calls
        if self.meter is not None and self.meter.estimates:
            arguments["estimate_request"] = self.meter.estimate
        if self.writer is not None:
            arguments["transcript_writer"] = self.writer
        else:
            arguments.update(transcript_persister=self.persister, transcript_lock=self.lock,
                             transcript_session_id=self.session_id,
                             transcript_lock_ttl=spec.runtime.transcript_lock_ttl)
        return arguments

    def _confirm_extension(self, budget: IterationBudget,
                           context: dict[str, Any]) -> bool | Pause:
        """Ask ``confirm_continuation``; extend by ``extend_by``, else the original ceiling.
        With ``confirmation="pause"``: stop and wait for ``resume`` instead."""
        spec = self.spec
        # extend_by counts (turns, calls); a token or cost budget grows by its own ceiling.
        counted = self.meter is None or budget.name() not in self.meter.units
        by = ((spec.runtime.extend_by if counted else None)
              or self.ceilings.get(budget.name(), budget.ceiling()))
        if self.resumption is not None and self.resumption.declined_budget == budget.name():
            return False  # a person already said no
        if self.confirmation.pauses():
            return Pause({"kind": "budget", "budget": budget.name(), "tool_call": None,
                          "extend_by": by})
        answer = self.services.first("confirm_continuation", budget=budget, context={
            **context, "kind": "budget_exhausted", "mode": spec.mode,
            "session_id": self.session_id, "provider": spec.provider, "model": spec.model,
        })
        if answer is not True:
            return False
        budget.extend(by)
        return True

    # -- stopping ---------------------------------------------------------------------------
    def _on_stop(self, stop: RunStop, context: dict[str, Any]) -> Any:
        """The loop's stop handler: the final summary, then the verdict, still under the lock
        and before anything is stored, so storage, job, events and result agree."""
        return run_steps(self._stop_steps(stop, context))

    def _stop_steps(self, stop: RunStop, context: dict[str, Any]) -> Steps[StopVerdict]:
        meter = self.meter
        if meter is not None:
            meter.release()  # a request that never answered gives its reservation back
        summary = None
        if not self.runner.partial_text:  # a stream cut mid-way keeps its own words instead
            summary = yield from self.summary.steps(stop, context.get("deadline"))
        usage = dict(self.runner.summary_usage)
        if meter is not None:
            meter.release()
            if meter.cost_usd is not None:
                usage["cost_usd"] = meter.cost_usd  # the whole run's, summary included
        verdict = self._decide(stop, summary, usage)
        if verdict.pending is not None:
            # What resuming needs beyond the loop's word: the tools to offer again, by name.
            verdict.pending = {**verdict.pending, "tools": sorted(self.completion.tools),
                               "pause_id": uuid.uuid4().hex}
        answer = verdict.for_the_loop([*self.warnings, *self.completion.warnings],
                                      self.timeline.entries)
        self.verdict = verdict  # applied by the loop: its result carries our warnings
        return answer

    def _decide(self, stop: RunStop, summary: Any = None,
                summary_usage: dict[str, Any] | None = None) -> ProductVerdict:
        return decide(stop, turn_ceiling=self.turn_budget.ceiling(), completion=self.completion,
                      summary=summary, summary_usage=summary_usage, chat_abort=self._abort(),
                      truncated=self.runner.answer_truncated, output=self.output,
                      partial=self.runner.partial_text, metered_warning=self._metered_warning(stop))

    def _metered_warning(self, stop: RunStop) -> str | None:
        """The warning of a stop on a token or cost budget, in tokens or dollars."""
        meter = self.meter
        if meter is None or stop.budget is None or stop.status != "budget_exceeded":
            return None
        return meter.stop_warning(stop.budget, stop.budgets.get(stop.budget, {}))

    def _abort(self) -> str | None:
        if self.runner.stop_requested:
            return STREAM_LEFT
        gate = self.turn_gate
        return gate.notice if gate is not None and gate.aborted else None

    def request_stop(self) -> None:
        """Stop at the next safe point (the consumer of a stream left): the provider's stream
        is closed, no further call or turn runs, and the run ends ``aborted``, its transcript
        stored and its lock released as at any other end."""
        self.runner.stop_requested = True

    def _result(self, loop: LoopResult) -> ConversationResult:
        """The run's one result: the loop's, with the product's verdict and diagnostics; then
        the pipeline job is settled with it (after storage, so it records the stored id)."""
        self.completion.raise_policy_error()
        verdict, warnings = self.verdict, loop.warnings
        if verdict is None or verdict.status != loop.status:
            # The stop handler never ran (lock contention) or failed, or the final write lost
            # the lock: decide now, from what the loop says.
            warnings = ([*self.warnings, *self.completion.warnings, *loop.warnings]
                        if verdict is None else loop.warnings)
            verdict = self.verdict = self._decide(RunStop.of(loop))
        spec = self.spec
        result = unchecked(
            ConversationResult,
            messages=loop.messages, final_content=verdict.final_content,
            turn_count=loop.turn_count,
            cumulative_turn_count=self.cumulative_base + loop.turn_count,
            completed=verdict.status == "completed", status=verdict.status,
            budget=verdict.budget, flags=list(verdict.flags),
            max_turns_reached=verdict.max_turns_reached, warning=verdict.warning,
            error=loop.error, error_code=loop.error_code, usage=loop.usage,
            tool_execution_results=[r for r in loop.tool_execution_results
                                    if not is_rejected(r["result"])],
            last_tool_calls=loop.last_tool_calls,
            request_metadata=loop.request_metadata or self.runner.last_request_metadata,
            transcript_session_id=loop.transcript_session_id, budgets=loop.budgets,
            warnings=list(warnings), unavailable_required_tool_names=[],
            available_tool_names=[], mode=spec.mode, provider=spec.provider, model=spec.model,
            output=(self.output.value if self.output is not None
                    and verdict.status == "completed" else None),
            pending=loop.pending, **_result_diagnostics(verdict.diagnostics))
        if result.status == "awaiting_confirmation" and result.transcript_session_id:
            paused_runs(self.services).keep(result.transcript_session_id, PausedRun(
                tools=dict(self.completion.tools),
                payload=kept_payload(spec.payload, spec.runtime),
                pause_id=str((loop.pending or {}).get("pause_id"))))
        if self.completion.job is not None:  # a pipeline job's record, read only for one
            self.completion.settle_job(_job_fields(result))
        return result


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
               "unavailable_required_tool_names", "available_tool_names", "remaining_handlers")


def _job_fields(result: ConversationResult) -> dict[str, Any]:
    """What a pipeline job records of its run's result."""
    return {key: getattr(result, key) for key in _JOB_FIELDS}


def _ceiling_overrides(services: Services, given: Mapping[str, int]) -> dict[str, int]:
    """payload ``budget_ceilings``, each checked against its budget's unit."""
    if not given:
        return {}
    if WALL_CLOCK in given:
        raise UsageError(f"payload['budget_ceilings'] cannot set {WALL_CLOCK!r}: give the run "
                         "its time with payload['max_seconds'] (seconds, fractions allowed).")
    registry = services.budgets
    for name, ceiling in given.items():
        validate_budget_value(f"payload['budget_ceilings'][{name!r}]", ceiling,
                              maximum=unit_maximum(registry.unit(name)))
    return dict(given)


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
                           current, hard_ceiling=hard, max_seconds=budget.max_seconds())


def _result_diagnostics(diagnostics: Mapping[str, Any]) -> dict[str, Any]:
    return {key: diagnostics.get(key, default) for key, default in _DIAGNOSTIC_DEFAULTS.items()}

