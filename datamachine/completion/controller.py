"""One run's completion machinery, wired into ``run_conversation`` at four seams.

:class:`CompletionRun` owns everything the completion rules need for one run: the parsed
assertions, the policy (built-in or the payload's ``completion_policy``), the nudge count, the
blocker, the pipeline job. The adapter calls it at clear points and nowhere else:

1. ``CompletionRun.prepare(...)`` while the run is validated (bad config fails before anything
   runs; the ``report_blocker`` tool joins the tool set here);
2. :meth:`CompletionRun.start` just before the loop: preflight and job start, or an error
   result without a provider call;
3. :meth:`CompletionRun.attach` while building the loop's arguments: it returns the loop's
   ``on_tool_result`` hook and gives the turn runner its natural-completion callback;
4. :meth:`CompletionRun.finish` on the mapped result: diagnostics, status, job.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from agents_api import Decision, Message
from agents_api.construct import assign
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
from datamachine.completion.jobs import PipelineJob, failure_reason
from datamachine.completion.nudges import build_nudge, describes_tool_action, diagnostic_copy
from datamachine.completion.policies import (
    DefaultCompletionPolicy,
    PipelineCompletionPolicy,
    normalize_slugs,
)
from datamachine.completion.preflight import (
    ERROR_CODE,
    unavailable_message,
    unavailable_required_tool_names,
)
from datamachine.errors import InvalidCompletionPolicy, UsageError

if TYPE_CHECKING:
    from datamachine.conversation.result import ConversationResult
    from datamachine.host import Host
    from datamachine.tools import Tool

__all__ = ["TURN_BUDGET", "CompletionRun"]

TURN_BUDGET = "conversation_turns"
NUDGE_METADATA_TYPE = "completion_nudge"


def _no_event(event: str, payload: dict[str, Any]) -> None:
    return None


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
        self.emit: Any = _no_event
        self.engine_data: dict[str, Any] = {}
        self.single_turn = False
        self.nudge_count = 0
        self.last_nudge: str | None = None
        self.blocker: str | None = None
        # True while the policy's latest word on a final answer was "not yet".
        self.pending = False
        self._attached = False
        # Nothing to assert and no handler list: only terminal tools, handler tools and
        # narrated tool actions can change the outcome, so everything else skips the policy.
        self.trivial = (self.builtin and not assertions.configured
                        and not getattr(policy, "configured_handlers", None))
        self.policy_error: InvalidCompletionPolicy | None = None

    # -- seam 1: validation ---------------------------------------------------------------
    @classmethod
    def prepare(cls, host: Host, modes: list[str], payload: dict[str, Any], runtime: Any,
                tools: dict[str, Tool]) -> CompletionRun:
        """Parse the run's completion config; raise a UsageError before anything runs."""
        assertions, warnings = parse_assertions(runtime.completion_assertions)
        custom = runtime.completion_policy
        if custom is not None:
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
            slugs = [s for s in slugs if s in handled]

        policy: Any
        if custom is not None:
            policy = custom
        elif slugs or "pipeline" in modes:
            policy = PipelineCompletionPolicy(assertions, slugs)
        else:
            policy = DefaultCompletionPolicy(assertions)

        offered = sorted(tools)
        run_tools = dict(tools)
        if assertions.configured and BLOCKER_TOOL_NAME not in run_tools:
            run_tools[BLOCKER_TOOL_NAME] = BLOCKER_TOOL
        job = PipelineJob.resolve(host.jobs, modes, payload, warnings)
        return cls(assertions=assertions, policy=policy, tools=run_tools,
                   offered_tool_names=offered, modes=modes, payload=payload, warnings=warnings,
                   job=job)

    # -- seam 2: before the loop ----------------------------------------------------------
    def start(self, run: Any) -> ConversationResult | None:
        """Preflight and job start; an error result (no provider call) when a required tool is
        missing, else None and the run goes ahead."""
        self.attach(run)
        unavailable = unavailable_required_tool_names(self.assertions, self.offered_tool_names)
        if not unavailable:
            if self.job is not None:
                self.job.start()
            return None
        return self._preflight_error(run, unavailable)

    def _preflight_error(self, run: Any, unavailable: list[str]) -> ConversationResult:
        from datamachine.conversation.result import ConversationResult, empty_usage

        message = unavailable_message(unavailable)
        evaluation = self.evaluate()
        self.emit("completion_assertions_unavailable", {
            "required_tool_names": list(self.assertions.required_tool_names),
            "unavailable_required_tool_names": unavailable,
            "available_tool_names": self.offered_tool_names,
            "error_message": message,
        })
        budgets = {b.name(): b.snapshot() for b in [run.turn_budget, *run.budgets]}
        result = ConversationResult.model_construct(
            messages=list(run.messages), status="error", completed=False, error=message,
            error_code=ERROR_CODE, usage=empty_usage(), budgets=budgets,
            unavailable_required_tool_names=unavailable,
            available_tool_names=self.offered_tool_names,
            completion_assertions_required=evaluation.required,
            completion_assertions_missing=evaluation.missing,
            completion_assertions_satisfied=evaluation.satisfied,
            completion_assertions_complete=False,
            warnings=[*run.warnings, *self.warnings],
            mode=run.mode, provider=run.provider_name, model=run.model,
        )
        if self.job is not None:
            self.job.settle({}, self._job_diagnostics(result), ERROR_CODE, result.warnings)
        self.emit("failed", {
            "status": "error", "turn": 0, "turn_count": 0,
            "message_count": len(result.messages), "tool_results": 0, "budget": None,
            "budgets": budgets, "error": message, "error_code": ERROR_CODE,
        })
        return result

    # -- seam 3: the loop's hooks ---------------------------------------------------------
    def attach(self, run: Any) -> Any:
        """Bind to the prepared run; return the loop's ``on_tool_result`` hook.

        Also hands the turn runner its natural-completion callback. Safe to call again.
        """
        if not self._attached:
            self.emit = run.emit
            self.single_turn = bool(run.single_turn)
            executor = run.executor
            if executor is not None:
                self.engine_data = executor.engine_data
            else:
                found = run.payload.get("engine_data")
                self.engine_data = found if isinstance(found, dict) else {}
            run.runner.on_natural_completion = self.on_natural_completion
            self._attached = True
        return self.on_tool_result

    def _context(self, loop_context: Mapping[str, Any]) -> dict[str, Any]:
        return {"mode": self.mode, "modes": list(self.modes), "turn": loop_context.get("turn"),
                "payload": self.payload, "engine_data": self.engine_data,
                "tool_names": list(self.tools)}

    def on_tool_result(self, call: dict[str, Any], result: dict[str, Any],
                       context: dict[str, Any]) -> Decision | None:
        """The loop's hook after every executed tool call."""
        name = str(call.get("name", ""))
        tool = self.tools.get(name)
        if self.trivial and (tool is None or not (tool.terminal or tool.handler)) and (
                "runtime" not in result):
            return None
        parameters = call.get("parameters")
        if not isinstance(parameters, Mapping):
            parameters = result.get("parameters")
        if is_blocker_tool(tool):
            return self._blocker(call, result, context)
        policy_context = self._context(context)
        policy_context["parameters"] = (dict(parameters) if isinstance(parameters, Mapping)
                                        else {})
        policy_context["tool_call_id"] = call.get("id")
        if self.builtin:
            decision: Decision | None = self.policy.record_tool_result(name, tool, result,
                                                                       policy_context)
        else:
            if self.assertions.configured:  # the counts only feed assertions
                self.tracker.record(name, result, policy_context["parameters"])
            method = getattr(self.policy, "record_tool_result", None)
            if not callable(method):
                return None
            decision = self._decision(method(name, tool, result, policy_context),
                                      "record_tool_result")
        if decision is not None and decision.complete:
            self.pending = False
        return decision

    def _blocker(self, call: dict[str, Any], result: dict[str, Any],
                 context: Mapping[str, Any]) -> Decision | None:
        reason = blocker_reason(result)
        if reason is None:
            return None  # an empty reason: the model reads the error and may try again
        if self.blocker is None:
            self.blocker = reason
            evaluation = self.evaluate()
            self.emit("blocker_reported", {
                "turn": context.get("turn"), "tool_call_id": call.get("id"), "reason": reason,
                "completion_assertions_missing": evaluation.missing,
                "completion_assertions_satisfied": evaluation.satisfied,
            })
        self.pending = False
        return Decision(complete=True, context={"reason": "blocker_reported",
                                                "blocker": self.blocker})

    def on_natural_completion(self, messages: list[Message], content: str,
                              context: dict[str, Any]) -> list[Message]:
        """The turn runner's callback for an answer without tool calls: the continuation
        messages (a nudge) when the policy says the task is not done, else nothing."""
        if self.single_turn or self.blocker is not None or context.get("final_summary"):
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
        decision = self._decision(method(transcript, content, self._context(context)),
                                  "record_natural_completion")
        if decision.complete:
            self.pending = False
            return []
        # "Not done" with nothing to say still needs words for the model: the generic nudge.
        text = decision.message.strip() or build_nudge(messages)
        self.pending = True
        self.nudge_count += 1
        self.last_nudge = text
        self._report_nudge(text, decision, context, len(transcript) + 1)
        return [Message.text("user", text, {"type": NUDGE_METADATA_TYPE,
                                            "completion_nudge_count": self.nudge_count})]

    def _report_nudge(self, text: str, decision: Decision, context: Mapping[str, Any],
                      message_count: int) -> None:
        evaluation = self.evaluate()
        diagnostics: dict[str, Any] = {
            "completion_nudge_count": self.nudge_count,
            "completion_nudge": diagnostic_copy(text),
            "completion_assertions_required": evaluation.required,
            "completion_assertions_missing": evaluation.missing,
            "completion_assertions_satisfied": evaluation.satisfied,
            "completion_nudge_turn": context.get("turn"),
        }
        extra: dict[str, Any] = {key: decision.context[key]
                                 for key in ("reason", "remaining_handlers")
                                 if key in decision.context}
        self.emit("completion_nudge_added", {**diagnostics, **extra,
                                             "message_count": message_count})
        if self.job is not None:
            record = {k: v for k, v in diagnostics.items() if k != "completion_nudge_turn"}
            record["completion_nudge_last_turn"] = context.get("turn")
            self.job.merge(record, self.warnings)

    def _decision(self, value: Any, method: str) -> Decision:
        try:
            return self._coerce(value, method)
        except InvalidCompletionPolicy as exc:
            # Raised inside the turn runner, the loop would turn it into an error result;
            # finish() raises it instead, so a broken policy fails the same way on every path.
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

    # -- seam 4: the result ---------------------------------------------------------------
    def evaluate(self) -> Evaluation:
        """The assertions against this run's successful tool results and engine data."""
        return self.tracker.evaluate(self.engine_data)

    @property
    def remaining_handlers(self) -> list[str]:
        """Configured handlers that never fired (built-in pipeline policy only)."""
        if isinstance(self.policy, PipelineCompletionPolicy):
            return self.policy.remaining_handlers
        return []

    def finish(self, result: ConversationResult, run: Any) -> ConversationResult:
        """Add the completion diagnostics to ``result``, correct its status, settle the job.

        Raises the :class:`InvalidCompletionPolicy` a custom policy caused during the run.
        """
        if self.policy_error is not None:
            if self.job is not None:
                # Never leave the job running: it failed with the policy.
                self.job.settle(self.engine_data, {"completed": False,
                                                   "error": str(self.policy_error)},
                                "invalid_completion_policy", [])
                self.job = None
            raise self.policy_error
        evaluation = self.evaluate()
        remaining = self.remaining_handlers
        if evaluation.configured:
            assign(result, completion_assertions_required=evaluation.required,
                   completion_assertions_missing=evaluation.missing,
                   completion_assertions_satisfied=evaluation.satisfied,
                   completion_assertions_complete=evaluation.complete)
        assign(result, completion_nudge_count=self.nudge_count,
               completion_nudge=(diagnostic_copy(self.last_nudge)
                                 if self.last_nudge is not None else None),
               blocker=self.blocker, remaining_handlers=remaining,
               warnings=[*result.warnings, *self.warnings])
        unmet = not evaluation.complete or bool(remaining)
        if result.status == "completed":
            if self.blocker is not None:
                result.status, result.completed = "incomplete", False
                result.warning = f"The model reported a blocker: {self.blocker}"
            elif unmet or self.pending:
                result.status, result.completed = "incomplete", False
                result.warning = self._unmet_warning(evaluation, remaining)
        elif (result.status == "budget_exceeded" and result.budget == TURN_BUDGET
              and (unmet or self.pending)):
            result.max_turns_reached, result.completed = True, False
            result.warning = (f"Maximum conversation turns ({run.turn_budget.ceiling()}) "
                              "reached before completion policy was satisfied.")
        if self.job is not None:
            reason = failure_reason(result, remaining_handlers=remaining)
            self.job.settle(self.engine_data, self._job_diagnostics(result), reason,
                            result.warnings)
        return result

    @staticmethod
    def _unmet_warning(evaluation: Evaluation, remaining: list[str]) -> str:
        parts = [f"{group}: {', '.join(str(item) for item in items)}"
                 for group, items in evaluation.missing.items()]
        if remaining:
            parts.append(f"handlers: {', '.join(remaining)}")
        if not parts:
            return "The run ended before its completion policy was satisfied."
        return ("The run ended before its completion policy was satisfied (missing "
                + "; ".join(parts) + ").")

    def _job_diagnostics(self, result: ConversationResult) -> dict[str, Any]:
        data: dict[str, Any] = {
            "conversation_status": result.status,
            "completed": result.completed,
            "turn_count": result.turn_count,
            "usage": result.usage,
            "transcript_session_id": result.transcript_session_id,
            "warning": result.warning,
            "error": result.error,
            "error_code": result.error_code,
            "completion_nudge_count": result.completion_nudge_count,
            "completion_nudge": result.completion_nudge,
            "blocker": result.blocker,
        }
        if result.completion_assertions_complete is not None:
            data.update({
                "completion_assertions_required": result.completion_assertions_required,
                "completion_assertions_missing": result.completion_assertions_missing,
                "completion_assertions_satisfied": result.completion_assertions_satisfied,
                "completion_assertions_complete": result.completion_assertions_complete,
            })
        if result.unavailable_required_tool_names:
            data["unavailable_required_tool_names"] = result.unavailable_required_tool_names
            data["available_tool_names"] = result.available_tool_names
        if result.remaining_handlers:
            data["remaining_handlers"] = result.remaining_handlers
        return {key: value for key, value in data.items() if value is not None}
