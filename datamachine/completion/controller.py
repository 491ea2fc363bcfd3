"""One run's completion machinery: :class:`CompletionRun`, built whole before the run starts.

It owns everything the completion rules need for one run: the parsed assertions, the policy
(built-in or the payload's ``completion_policy``), the nudge count, the blocker, the pipeline
job. The conversation run builds it first (bad config fails before anything runs; the
``report_blocker`` tool joins the tool set here), hands its two hooks to the loop and the turn
runner as constructor arguments, and asks it once, when the run stops, for its judgement and
diagnostics (:meth:`CompletionRun.judge`, :meth:`CompletionRun.diagnostics`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from agents_api import Decision, IterationBudget, Message
from agents_api.records import LoopStatus, ToolCall
from agents_api.results import empty_usage
from datamachine.budgets_builtin import CONVERSATION_TURNS
from datamachine.completion.assertions import (
    AssertionTracker,
    CompletionAssertions,
    Evaluation,
    parse_assertions,
)
from datamachine.completion.blocker import (
    BLOCKER_TOOL,
    BLOCKER_TOOL_NAME,
    blocker_reason,
    is_blocker_tool,
)
from datamachine.completion.jobs import (
    PipelineJob,
    failure_reason,
    job_diagnostics,
    job_outcome,
)
from datamachine.completion.nudges import build_nudge, describes_tool_action, diagnostic_copy
from datamachine.completion.policies import (
    DefaultCompletionPolicy,
    PipelineCompletionPolicy,
    normalize_slugs,
)
from datamachine.completion.preflight import ERROR_CODE as PREFLIGHT_ERROR_CODE
from datamachine.completion.preflight import (
    unavailable_message,
    unavailable_required_tool_names,
)
from datamachine.errors import InvalidCompletionPolicy, UsageError

if TYPE_CHECKING:
    from datamachine.host import Services
    from datamachine.payload_keys import RuntimeOptions
    from datamachine.tools import Tool

__all__ = ["CompletionRun", "Judgement"]

NUDGE_METADATA_TYPE = "completion_nudge"
# What a model that answered with nothing after its tool calls reads (once).
EMPTY_ANSWER_NUDGE = ("Your last answer was empty. The results of your tool calls are above: "
                      "write your final answer now.")
Emit = Callable[[str, dict[str, Any]], None]


# Never changed once made; slotted, not frozen (see agents_api.records).
@dataclass(slots=True)
class Judgement:
    """The completion rules' word on a stopped run: its status and warning."""

    status: LoopStatus
    warning: str | None


class CompletionRun:
    """The completion state of one run (see the module docstring for the seams)."""

    def __init__(
        self,
        *,
        assertions: CompletionAssertions,
        policy: Any,
        tools: dict[str, Tool],
        offered_tool_names: list[str],
        modes: list[str],
        payload: dict[str, Any],
        warnings: list[str],
        emit: Emit,
        engine_data: dict[str, Any],
        single_turn: bool = False,
        nudges: Callable[[], IterationBudget],
        job: PipelineJob | None = None,
    ) -> None:
        self.assertions = assertions
        self.policy = policy
        self.builtin = isinstance(policy, DefaultCompletionPolicy)
        # A custom policy keeps its own state; the assertions still feed the diagnostics.
        self.tracker: AssertionTracker = (policy.tracker if self.builtin
                                          else AssertionTracker(assertions))
        self.tools = tools
        self.offered_tool_names = offered_tool_names
        self.modes = modes
        self.mode = ",".join(modes)
        self.payload = payload
        self.warnings = warnings
        self.job = job
        self.emit = emit
        # The run's engine data: the tool executor's dict, which tools write through.
        self.engine_data = engine_data
        self.single_turn = single_turn
        self.nudge_count = 0
        # The budget completion_nudges, made at the first nudge: a nudge is given only while
        # it has room; the one that would pass its ceiling is not, and the run ends incomplete
        # on it (``nudges_spent``).
        self._make_nudges = nudges
        self.made_nudges: IterationBudget | None = None
        self.nudges_spent = False
        self.last_nudge: str | None = None
        self.blocker: str | None = None
        # True while the policy's latest word on a final answer was "not yet".
        self.pending = False
        # Nothing to assert and no handler list: only terminal tools, handler tools and
        # narrated tool actions can change the outcome, so everything else skips the policy.
        self.trivial = (self.builtin and not assertions.configured
                        and not getattr(policy, "configured_handlers", None))
        self.policy_error: InvalidCompletionPolicy | None = None
        self.asserting = assertions.configured
        # A tool call ran (or was refused) in this run; then an empty answer is nudged once
        # (``empty_nudged``), and one still empty ends the run incomplete (``empty_answer``).
        self.called_tools = False
        self.empty_nudged = False
        self.empty_answer = False

    # -- building it -----------------------------------------------------------------------
    @classmethod
    def prepare(cls, services: Services, modes: list[str], payload: dict[str, Any],
                runtime: RuntimeOptions, tools: dict[str, Tool], *, emit: Emit,
                engine_data: dict[str, Any], nudges: Callable[[], IterationBudget],
                single_turn: bool = False) -> CompletionRun:
        """Parse the run's completion config; raise a UsageError before anything runs.
        ``nudges``: makes the run's ``completion_nudges`` budget (at the first nudge)."""
        assertions, warnings = parse_assertions(runtime.completion_assertions)
        custom = runtime.completion_policy
        if custom is not None:
            _check_custom_policy(custom, warnings)
        slugs = _handler_slugs(payload, tools, warnings)
        policy: Any
        if custom is not None:
            policy = custom
        elif slugs or "pipeline" in modes:
            policy = PipelineCompletionPolicy(assertions, slugs)
        else:
            policy = DefaultCompletionPolicy(assertions)
        run_tools = dict(tools)
        if assertions.configured and BLOCKER_TOOL_NAME not in run_tools:
            run_tools[BLOCKER_TOOL_NAME] = BLOCKER_TOOL
        job = (PipelineJob.resolve(services.jobs, modes, payload, warnings,
                                   runtime.job_retry_codes)
               if payload.get("job_id") not in (None, "") else None)
        return cls(assertions=assertions, policy=policy, tools=run_tools,
                   offered_tool_names=sorted(tools), modes=modes, payload=payload,
                   warnings=warnings, emit=emit, engine_data=engine_data,
                   single_turn=single_turn, job=job, nudges=nudges)

    # -- before the loop ---------------------------------------------------------------------
    def unavailable_tools(self) -> list[str]:
        """Tools the assertions require that the run does not offer (preflight)."""
        if not self.asserting:
            return []  # nothing is required
        return unavailable_required_tool_names(self.assertions, self.offered_tool_names)

    def start_job(self) -> None:
        """The pipeline job moves to ``running`` as the run starts."""
        if self.job is not None:
            self.job.start()

    def preflight_failure(self, unavailable: list[str], budgets: dict[str, Any],
                          message_count: int) -> dict[str, Any]:
        """Report a run refused before any provider call (events, job); its result fields."""
        message = unavailable_message(unavailable)
        evaluation = self.evaluate()
        self.emit("completion_assertions_unavailable", {
            "required_tool_names": list(self.assertions.required_tool_names),
            "unavailable_required_tool_names": unavailable,
            "available_tool_names": self.offered_tool_names,
            "error_message": message,
        })
        fields: dict[str, Any] = {
            "status": "error", "completed": False, "error": message,
            "error_code": PREFLIGHT_ERROR_CODE, "unavailable_required_tool_names": unavailable,
            "available_tool_names": self.offered_tool_names,
            "completion_assertions_required": evaluation.required,
            "completion_assertions_missing": evaluation.missing,
            "completion_assertions_satisfied": evaluation.satisfied,
            "completion_assertions_complete": False,
        }
        self.settle_job({**fields, "turn_count": 0, "usage": empty_usage(),
                         "completion_nudge_count": 0}, PREFLIGHT_ERROR_CODE)
        self.emit("failed", {
            "status": "error", "turn": 0, "turn_count": 0, "message_count": message_count,
            "tool_results": 0, "budget": None, "budgets": budgets, "error": message,
            "error_code": PREFLIGHT_ERROR_CODE,
        })
        return fields

    # -- the hooks the loop and the turn runner call ----------------------------------------

    def _context(self, turn: int) -> dict[str, Any]:
        return {"mode": self.mode, "modes": list(self.modes), "turn": turn,
                "payload": self.payload, "engine_data": self.engine_data,
                "tool_names": list(self.tools)}

    def on_tool_result(self, call: ToolCall, result: dict[str, Any],
                       turn: int) -> Decision | None:
        """After every call the run ran (or refused) in turn ``turn``: the policy's word."""
        self.called_tools = True
        name = call.name
        tool = self.tools.get(name)
        if self.trivial and (tool is None or not (tool.terminal or tool.handler)) and (
                "runtime" not in result):
            return None
        parameters = call.parameters
        if type(parameters) is not dict and not isinstance(parameters, Mapping):
            parameters = result.get("parameters")
        if is_blocker_tool(tool):
            return self._blocker(call, result, turn)
        policy_context = self._context(turn)
        policy_context["parameters"] = (dict(parameters) if type(parameters) is dict
                                        or isinstance(parameters, Mapping) else {})
        policy_context["tool_call_id"] = call.id
        if self.builtin:
            decision: Decision | None = self.policy.record_tool_result(name, tool, result,
                                                                       policy_context)
        else:
            if self.asserting:  # the counts only feed assertions
                self.tracker.record(name, result, policy_context["parameters"])
            method = getattr(self.policy, "record_tool_result", None)
            if not callable(method):
                return None
            decision = self._decision(method(name, tool, result, policy_context),
                                      "record_tool_result")
        if decision is not None and decision.complete:
            self.pending = False
        return decision

    def _blocker(self, call: ToolCall, result: dict[str, Any], turn: int) -> Decision | None:
        reason = blocker_reason(result)
        if reason is None:
            return None  # an empty reason: the model reads the error and may try again
        if self.blocker is None:
            self.blocker = reason
            evaluation = self.evaluate()
            self.emit("blocker_reported", {
                "turn": turn, "tool_call_id": call.id, "reason": reason,
                "completion_assertions_missing": evaluation.missing,
                "completion_assertions_satisfied": evaluation.satisfied,
            })
        self.pending = False
        return Decision(complete=True, context={"reason": "blocker_reported",
                                                "blocker": self.blocker})

    def on_natural_completion(self, messages: list[Message], content: str,
                              turn: int) -> list[Message]:
        """An answer without tool calls in turn ``turn``: the continuation messages (a nudge)
        when the policy says the task is not done, else nothing."""
        if self.single_turn or self.blocker is not None:
            return []
        if self.trivial and not describes_tool_action(content):
            self.pending = False
            return []
        method = getattr(self.policy, "record_natural_completion", None)
        if not callable(method):
            self.pending = False
            return []
        transcript = [*messages, Message.text("assistant", content)] if content else list(
            messages)
        decision = self._decision(method(transcript, content, self._context(turn)),
                                  "record_natural_completion")
        if decision.complete:
            self.pending = False
            return []
        self.pending = True
        if not self._nudge_allowed():
            return []
        # "Not done" with nothing to say still needs words for the model: the generic nudge.
        text = decision.message.strip() or build_nudge(messages)
        self.nudge_count += 1
        self.last_nudge = text
        self._report_nudge(text, decision, turn, len(transcript) + 1)
        return [Message.text("user", text, {"type": NUDGE_METADATA_TYPE,
                                            "completion_nudge_count": self.nudge_count})]

    def on_empty_answer(self, messages: list[Message], turn: int) -> list[Message]:
        """An answer with no text after the run's tool calls (DESIGN 25): nudged once to
        answer; a second empty answer ends the run, which is then ``incomplete`` (flag
        ``empty_answer``), never completed with an earlier turn's words."""
        if self.empty_nudged or self.single_turn or not self._nudge_allowed():
            self.empty_answer = True
            return []
        self.empty_nudged = True
        text = EMPTY_ANSWER_NUDGE
        self.nudge_count += 1
        self.last_nudge = text
        self._report_nudge(text, Decision(complete=False, context={"reason": "empty_answer"}),
                           turn, len(messages) + 1)
        return [Message.text("user", text, {"type": NUDGE_METADATA_TYPE,
                                            "completion_nudge_count": self.nudge_count})]

    @property
    def nudges(self) -> IterationBudget:
        """The run's ``completion_nudges`` (made now if no nudge made it yet)."""
        if self.made_nudges is None:
            self.made_nudges = self._make_nudges()
        return self.made_nudges

    def _nudge_allowed(self) -> bool:
        """Count one more nudge when ``completion_nudges`` has room for it; else mark the
        budget spent (the run ends incomplete on it)."""
        nudges = self.nudges
        if nudges.current() >= nudges.ceiling():
            self.nudges_spent = True
            return False
        nudges.increment()
        return True

    def _report_nudge(self, text: str, decision: Decision, turn: int,
                      message_count: int) -> None:
        evaluation = self.evaluate()
        diagnostics: dict[str, Any] = {
            "completion_nudge_count": self.nudge_count,
            "completion_nudge": diagnostic_copy(text),
            "completion_assertions_required": evaluation.required,
            "completion_assertions_missing": evaluation.missing,
            "completion_assertions_satisfied": evaluation.satisfied,
            "completion_nudge_turn": turn,
        }
        extra: dict[str, Any] = {key: decision.context[key]
                                 for key in ("reason", "remaining_handlers")
                                 if key in decision.context}
        self.emit("completion_nudge_added", {**diagnostics, **extra,
                                             "message_count": message_count})
        if self.job is not None:
            record = {k: v for k, v in diagnostics.items() if k != "completion_nudge_turn"}
            record["completion_nudge_last_turn"] = turn
            self.job.merge(record, self.warnings)

    def _decision(self, value: Any, method: str) -> Decision:
        try:
            return self._coerce(value, method)
        except InvalidCompletionPolicy as exc:
            # Raised inside the turn runner, the loop would turn it into an error result;
            # raise_policy_error() raises it after the run, so a broken policy fails the same
            # way on every path.
            self.policy_error = exc
            raise

    def _coerce(self, value: Any, method: str) -> Decision:
        if type(value) is Decision:
            return value
        where = f"payload['completion_policy'].{method}"
        if inspect.isawaitable(value):
            close = getattr(value, "close", None)
            if callable(close):
                close()
            raise InvalidCompletionPolicy(
                f"{where} returned an awaitable; completion policies are called synchronously "
                "between turns, so define it with def, not async def.")
        if value is None:
            return Decision(complete=False)
        if isinstance(value, Decision):
            return value
        if isinstance(value, Mapping):
            try:
                return Decision.model_validate(dict(value))
            except ValidationError as exc:
                raise InvalidCompletionPolicy(f"{where} returned an invalid decision: "
                                              f"{exc.errors()[0]['msg']}.") from None
        raise InvalidCompletionPolicy(
            f"{where} returned {type(value).__name__}; return an agents_api.Decision "
            "(datamachine.Decision), a dict of its fields, or None for no opinion.")

    # -- when the run stops ------------------------------------------------------------------
    def evaluate(self) -> Evaluation:
        """The assertions against this run's successful tool results and engine data."""
        if not self.asserting:
            return Evaluation(configured=False)  # nothing to evaluate
        return self.tracker.evaluate(self.engine_data)

    @property
    def remaining_handlers(self) -> list[str]:
        """Configured handlers that never fired (built-in pipeline policy only)."""
        if isinstance(self.policy, PipelineCompletionPolicy):
            return self.policy.remaining_handlers
        return []

    def judge(self, status: LoopStatus, budget: str | None, warning: str | None,
              turn_ceiling: int) -> Judgement:
        """The run's status and warning once the completion rules are applied: an answer that
        leaves assertions unmet, handlers unfired or a blocker reported is ``incomplete``."""
        evaluation = self.evaluate()
        remaining = self.remaining_handlers
        unmet = not evaluation.complete or bool(remaining)
        if status == "completed":
            if self.blocker is not None:
                return Judgement("incomplete", f"The model reported a blocker: {self.blocker}")
            if unmet or self.pending:
                return Judgement("incomplete", _unmet_warning(evaluation, remaining))
        elif status == "budget_exceeded" and budget == CONVERSATION_TURNS and (
                unmet or self.pending):
            return Judgement(status, f"Maximum conversation turns ({turn_ceiling}) reached "
                                     "before completion policy was satisfied.")
        return Judgement(status, warning)

    def diagnostics(self) -> dict[str, Any]:
        """The completion fields of the run's result (DESIGN.md 5.4)."""
        evaluation = self.evaluate()
        fields: dict[str, Any] = {
            "completion_nudge_count": self.nudge_count,
            "completion_nudge": (diagnostic_copy(self.last_nudge)
                                 if self.last_nudge is not None else None),
            "blocker": self.blocker, "remaining_handlers": self.remaining_handlers}
        if evaluation.configured:
            fields.update({
                "completion_assertions_required": evaluation.required,
                "completion_assertions_missing": evaluation.missing,
                "completion_assertions_satisfied": evaluation.satisfied,
                "completion_assertions_complete": evaluation.complete})
        return fields

    def settle_job(self, result: Mapping[str, Any], reason: str | None = None) -> None:
        """Write the run's engine data and diagnostics to its pipeline job, then complete or
        fail it, with the run's flags, budget and budgets. ``result``: the result's fields;
        ``reason`` overrides the failure reason."""
        if self.job is None:
            return
        if reason is None:
            reason = failure_reason(result, remaining_handlers=self.remaining_handlers)
        self.job.settle(self.engine_data, job_diagnostics(result), reason, self.warnings,
                        job_outcome(result))
        self.job = None  # settled once

    def raise_policy_error(self) -> None:
        """Raise the :class:`InvalidCompletionPolicy` a custom policy caused during the run
        (after failing its job: a job never stays running)."""
        if self.policy_error is None:
            return
        if self.job is not None:
            self.job.settle(self.engine_data, {"completed": False,
                                               "error": str(self.policy_error)},
                            "invalid_completion_policy", [])
            self.job = None
        raise self.policy_error


def _check_custom_policy(custom: Any, warnings: list[str]) -> None:
    methods = [m for m in ("record_tool_result", "record_natural_completion")
               if callable(getattr(custom, m, None))]
    for name in methods:
        if inspect.iscoroutinefunction(getattr(custom, name)):
            raise InvalidCompletionPolicy(
                f"payload['completion_policy'].{name} is async; completion policies "
                "are called synchronously between turns, so define it with def.")
    if not methods:
        warnings.append(
            f"payload['completion_policy'] ({type(custom).__name__}) has neither "
            "record_tool_result nor record_natural_completion; it has no effect.")


def _handler_slugs(payload: Mapping[str, Any], tools: Mapping[str, Tool],
                   warnings: list[str]) -> list[str]:
    raw_slugs = payload.get("configured_handler_slugs")
    if raw_slugs is not None and not (
        isinstance(raw_slugs, str)
        or (isinstance(raw_slugs, list | tuple) and all(isinstance(s, str) for s in raw_slugs))
    ):
        raise UsageError("payload['configured_handler_slugs'] must be a list of handler "
                         f"slugs (strings), got {raw_slugs!r}.")
    slugs = normalize_slugs(raw_slugs)
    handled = {t.handler for t in tools.values() if t.handler}
    ignored = [s for s in slugs if s not in handled]
    if ignored:
        # A handler no tool stands for can never fire: waiting for it would nudge the model
        # until the turns run out.
        warnings.append(
            f"configured_handler_slugs {', '.join(ignored)} have no handler tool in this "
            "run and are ignored.")
    return [s for s in slugs if s in handled]


def _unmet_warning(evaluation: Evaluation, remaining: list[str]) -> str:
    parts = [f"{group}: {', '.join(str(item) for item in items)}"
             for group, items in evaluation.missing.items()]
    if remaining:
        parts.append(f"handlers: {', '.join(remaining)}")
    if not parts:
        return "The run ended before its completion policy was satisfied."
    return ("The run ended before its completion policy was satisfied (missing "
            + "; ".join(parts) + ").")
