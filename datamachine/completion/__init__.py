"""Completion: deciding when a run is actually done (DESIGN.md 5.2, 5.4; docs/completion.md).

- :mod:`~datamachine.completion.assertions`: the ``completion_assertions`` config, parsed and
  evaluated against a run's successful tool results and engine data.
- :mod:`~datamachine.completion.policies`: the built-in policies and the
  :class:`CompletionPolicy` protocol a payload's ``completion_policy`` follows.
- :mod:`~datamachine.completion.nudges`: the model-facing continuation text.
- :mod:`~datamachine.completion.preflight`: refusing runs whose required tools are missing.
- :mod:`~datamachine.completion.blocker`: the built-in ``report_blocker`` tool.
- :mod:`~datamachine.completion.controller`: one run's state, called by the adapter.
"""

from datamachine.completion.assertions import (
    AssertionTracker,
    CompletionAssertions,
    Evaluation,
    Outcome,
    ToolRequirement,
    parse_assertions,
)
from datamachine.completion.blocker import BLOCKER_TOOL, BLOCKER_TOOL_NAME
from datamachine.completion.controller import CompletionRun
from datamachine.completion.nudges import DESCRIBED_ACTION_TEXT, NUDGE_TEXT, build_nudge
from datamachine.completion.policies import (
    CompletionPolicy,
    DefaultCompletionPolicy,
    PipelineCompletionPolicy,
)
from datamachine.completion.preflight import ERROR_CODE as PREFLIGHT_ERROR_CODE
from datamachine.completion.preflight import unavailable_required_tool_names

__all__ = [
    "BLOCKER_TOOL",
    "BLOCKER_TOOL_NAME",
    "DESCRIBED_ACTION_TEXT",
    "NUDGE_TEXT",
    "PREFLIGHT_ERROR_CODE",
    "AssertionTracker",
    "CompletionAssertions",
    "CompletionPolicy",
    "CompletionRun",
    "DefaultCompletionPolicy",
    "Evaluation",
    "Outcome",
    "PipelineCompletionPolicy",
    "ToolRequirement",
    "build_nudge",
    "parse_assertions",
    "unavailable_required_tool_names",
]
