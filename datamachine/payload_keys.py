"""The payload keys that carry runtime objects or loop configuration (DESIGN.md 5.2).

One list, read by the adapter (which takes them out of the payload) and by the tool executor
(which never shows them to a tool, even when it is used without the adapter).
"""

from __future__ import annotations

__all__ = ["RUNTIME_KEYS"]

RUNTIME_KEYS = frozenset({
    "event_sink", "transcript_persister", "transcript_lock", "transcript_session_id",
    "transcript_lock_ttl", "completion_assertions", "completion_policy", "tool_runtime_rules",
    "budget_pressure", "final_summary", "persist_transcript", "script", "max_seconds",
    "extend_by",
})
