"""Tool runtime rules: inspection budgets, required prior tools, blocks until a follow-up."""

from __future__ import annotations

from typing import Any, cast

import pytest

from agents_api.records import ToolRecord
from datamachine.errors import InvalidToolRuntimeRule, UsageError
from datamachine.tools import POLICY_PREFIX, ToolExecutor, parse_runtime_rules, tool
from datamachine.tools.results import REJECTED
from tests.tools.helpers import call, run_turns, tool_results


def _noop(name: str, *, repeatable: bool = True) -> Any:
    # Untyped arguments and repeatable calls, so the rules (not the schema check or the
    # duplicate check) decide every outcome below.
    def function(**kwargs: Any) -> dict[str, Any]:
        if kwargs.get("target") == "fail":
            return {"success": False, "error": f"{name} failed"}
        return {"success": True, "result": f"{name}:{kwargs.get('target', '')}"}

    return tool(name=name, description=f"The {name} tool.",
                parameters={"type": "object", "properties": {}},
                runtime={"duplicate_policy": "repeatable" if repeatable else "reject"})(function)


TOOLS = [_noop(name) for name in
         ("fetch_context", "read_file", "list_dir", "write_patch", "draft", "review", "publish",
          "verify", "summarize")]


def run_rules(rules: list[dict[str, Any]], *calls: tuple[str, dict[str, Any]],
              tools: list[Any] = TOOLS) -> list[Any]:
    """One call per turn; returns the tool_result envelopes."""
    executor = ToolExecutor(tools, mode="pipeline", payload={"tool_runtime_rules": rules})
    turns = [[call(name, f"c{i}", **params)] for i, (name, params) in enumerate(calls)]
    return tool_results(run_turns(executor, turns))


def verdicts(results: list[Any]) -> list[str]:
    return ["ok" if m.payload["success"] else m.payload.get("error_type", "?") for m in results]


INSPECTION = {"after_tool": "fetch_context", "limited_tools": ["read_file", "list_dir"],
              "max_calls": 2, "then_require_one_of": ["write_patch"]}


def test_inspection_budget_allows_up_to_max_calls_then_requires_the_next_tool() -> None:
    results = run_rules(
        [INSPECTION],
        ("read_file", {}), ("read_file", {}), ("read_file", {}),  # before the trigger: free
        ("fetch_context", {}),
        ("read_file", {}), ("list_dir", {}),
        ("read_file", {}),          # third inspection: rejected
        ("summarize", {}),          # not one of the required next tools: rejected too
        ("write_patch", {}),        # the required action is always allowed
        ("read_file", {}),          # after it succeeded the limit is lifted
    )
    assert verdicts(results) == ["ok"] * 6 + ["tool_runtime_rule_rejected"] * 2 + ["ok", "ok"]
    rejection = results[6]
    assert rejection.content == (
        f"{POLICY_PREFIX} After fetch_context, you already used 2 of 2 allowed calls of the "
        "inspection tools (read_file, list_dir). Do not inspect further. The next tool must be "
        "one of: write_patch."
    )
    assert rejection.payload[REJECTED] is True
    assert rejection.payload["policy"] == {
        "rule_id": "tool-runtime-rule-0", "type": "inspection_budget",
        "after_tool": "fetch_context", "limited_tools": ["read_file", "list_dir"],
        "limited_count": 2, "max_calls": 2, "then_require_one_of": ["write_patch"],
        "rejected_tool": "read_file",
    }


def test_inspection_budget_restarts_at_the_latest_trigger() -> None:
    results = run_rules(
        [INSPECTION],
        ("fetch_context", {}), ("read_file", {"target": 1}),
        ("fetch_context", {"target": "again"}),   # the count starts over here
        ("read_file", {"target": 2}), ("read_file", {"target": 3}),
        ("read_file", {"target": 4}),
    )
    assert verdicts(results) == ["ok"] * 5 + ["tool_runtime_rule_rejected"]


def test_rejected_calls_do_not_count_against_the_inspection_budget() -> None:
    results = run_rules(
        [{**INSPECTION, "max_calls": 1}],
        ("fetch_context", {}), ("read_file", {}),
        ("list_dir", {}), ("list_dir", {}),  # both rejected: the count stays at 1
        ("write_patch", {}),
    )
    assert verdicts(results) == ["ok", "ok", "tool_runtime_rule_rejected",
                                 "tool_runtime_rule_rejected", "ok"]
    assert results[3].payload["policy"]["limited_count"] == 1


PRIOR = {"type": "require_prior_tool", "before_tool": "publish", "require_prior_tool": "review"}


def test_require_prior_tool_rejects_until_the_required_tool_succeeded() -> None:
    results = run_rules(
        [PRIOR],
        ("draft", {}),
        ("publish", {}),
        ("review", {"target": "fail"}),   # a failed review is no review
        ("publish", {"target": "x"}),
        ("review", {}),
        ("publish", {"target": "y"}),
    )
    assert verdicts(results) == ["ok", "tool_runtime_rule_rejected", "tool_error",
                                 "tool_runtime_rule_rejected", "ok", "ok"]
    assert results[1].content == f"{POLICY_PREFIX} Before using publish, first use one of: review."


def test_require_prior_tool_accepts_a_list_and_parameter_conditions() -> None:
    rule = {"type": "require_prior_tool", "before_tool": "publish",
            "require_prior_tool": ["review", "verify"],
            "require_prior_tool_parameters": {"review": {"status": "approved"}}}
    results = run_rules(
        [rule],
        ("review", {"status": "changes_requested"}),
        ("publish", {}),
        ("review", {"status": "approved"}),
        ("publish", {"target": "x"}),
    )
    assert verdicts(results) == ["ok", "tool_runtime_rule_rejected", "ok", "ok"]
    assert results[1].content == (f'{POLICY_PREFIX} Before using publish, first use one of: '
                                  'review (with status="approved"), verify.')
    # Any listed tool without conditions satisfies the rule too.
    assert verdicts(run_rules([rule], ("verify", {}), ("publish", {}))) == ["ok", "ok"]


def test_parameter_conditions_compare_strictly() -> None:
    rule = {"type": "require_prior_tool", "before_tool": "publish",
            "require_prior_tool": "review",
            "require_prior_tool_parameters": {"review": {"attempt": 1}}}
    results = run_rules([rule], ("review", {"attempt": True}), ("review", {"attempt": "1"}),
                        ("review", {}), ("publish", {}),
                        ("review", {"attempt": 1.0}), ("publish", {"target": "x"}))
    assert verdicts(results) == ["ok", "ok", "ok", "tool_runtime_rule_rejected", "ok", "ok"]


BLOCK = {"type": "block_until_tool", "after_tool": "publish", "blocked_tools": ["publish", "draft"],
         "until_one_of": ["verify"]}


def test_block_until_tool_blocks_after_the_trigger_until_a_follow_up_succeeds() -> None:
    results = run_rules(
        [BLOCK],
        ("draft", {}),                      # before the trigger: allowed
        ("publish", {}),                    # the trigger
        ("publish", {"target": "x"}),       # blocked
        ("draft", {"target": "x"}),         # blocked
        ("summarize", {}),                  # not a blocked tool
        ("verify", {"target": "fail"}),     # a failed follow-up does not unblock
        ("draft", {"target": "y"}),
        ("verify", {}),
        ("draft", {"target": "z"}),         # unblocked
    )
    assert verdicts(results) == ["ok", "ok", "tool_runtime_rule_rejected",
                                 "tool_runtime_rule_rejected", "ok", "tool_error",
                                 "tool_runtime_rule_rejected", "ok", "ok"]
    assert results[2].content == (
        f"{POLICY_PREFIX} After publish, do not use publish again until one of these follow-up "
        "tools succeeds: verify."
    )


def test_a_failed_trigger_does_not_block_its_own_retry() -> None:
    results = run_rules([BLOCK], ("publish", {"target": "fail"}), ("publish", {"target": "ok"}))
    assert verdicts(results) == ["tool_error", "ok"]


def test_rules_are_evaluated_in_order_and_the_first_rejection_wins() -> None:
    first = {"id": "needs review!", **PRIOR}
    second = {"type": "block_until_tool", "after_tool": "draft", "blocked_tools": "publish",
              "until_one_of": "verify"}
    results = run_rules([first, second], ("draft", {}), ("publish", {}))
    assert results[1].payload["policy"]["rule_id"] == "needsreview"  # unsafe characters dropped
    results = run_rules([second, first], ("draft", {}), ("publish", {}))
    assert results[1].payload["policy"]["rule_id"] == "tool-runtime-rule-0"
    assert results[1].content.startswith(f"{POLICY_PREFIX} After draft")


def test_duplicates_are_checked_before_runtime_rules() -> None:
    results = run_rules([BLOCK], ("publish", {"target": "a"}), ("publish", {"target": "a"}),
                        tools=[_noop("publish", repeatable=False), _noop("verify")])
    assert results[1].payload["error_type"] == "duplicate_tool_call"


def test_runtime_rule_rejections_are_marked_rejected() -> None:
    executor = ToolExecutor(TOOLS, payload={"tool_runtime_rules": [PRIOR]})
    result = run_turns(executor, [[call("publish", "1")]])
    entry = cast("list[ToolRecord]", result.tool_execution_results)[0]
    assert entry["result"][REJECTED] is True
    assert entry["result"]["error_type"] == "tool_runtime_rule_rejected"


def test_explicit_runtime_rules_argument_wins_over_the_payload() -> None:
    executor = ToolExecutor(TOOLS, payload={"tool_runtime_rules": [PRIOR]}, runtime_rules=[])
    result = run_turns(executor, [[call("publish", "1")]])
    assert result.tool_execution_results[0]["success"] is True


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ({"after_tool": "a"}, r"^tool_runtime_rules must be a list"),
        (["x"], r"^tool_runtime_rules\[0\] must be a dict, got str"),
        ([INSPECTION, {"type": "sometimes"}], r"^tool_runtime_rules\[1\]\.type: unknown rule type"),
        ([{**INSPECTION, "max_calls": 0}],
         r"^tool_runtime_rules\[0\]\.max_calls: .*greater than 0"),
        ([{**INSPECTION, "max_calls": "2"}], r"^tool_runtime_rules\[0\]\.max_calls: .*integer"),
        ([{k: v for k, v in INSPECTION.items() if k != "after_tool"}],
         r"^tool_runtime_rules\[0\]\.after_tool: Field required"),
        ([{**INSPECTION, "limited_tools": []}],
         r"^tool_runtime_rules\[0\]\.limited_tools: must name at least one tool"),
        ([{**INSPECTION, "max_call": 2}], r"^tool_runtime_rules\[0\]\.max_call: Extra inputs"),
        ([PRIOR, {"type": "block_until_tool", "after_tool": "a", "blocked_tools": "b"}],
         r"^tool_runtime_rules\[1\]\.until_one_of: Field required"),
        ([{**PRIOR, "require_prior_tool_parameters": {"verify": {"x": 1}}}],
         r"^tool_runtime_rules\[0\]\.require_prior_tool_parameters: names verify"),
    ],
)
def test_invalid_rules_name_the_index_and_field(rules: Any, message: str) -> None:
    with pytest.raises(InvalidToolRuntimeRule, match=message) as info:
        parse_runtime_rules(rules)
    assert isinstance(info.value, UsageError)


def test_source_spellings_of_rule_fields_are_accepted() -> None:
    rules = parse_runtime_rules([
        {"after_tool": "a", "limited_tool_names": "b", "max_calls": 1,
         "then_require_one_of": "c"},
        {"type": "require_prior_tool", "before_tool": "p", "require_prior_tools": ["r"]},
        {"type": "block_until_tool", "after_tool": "a", "blocked_tool_names": ["b"],
         "then_require_one_of": ["c"]},
    ])
    assert [rule.type for rule in rules] == ["inspection_budget", "require_prior_tool",
                                            "block_until_tool"]
    assert parse_runtime_rules(None) == []
