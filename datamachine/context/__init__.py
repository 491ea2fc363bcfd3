"""The context window as a budget (DESIGN.md 21): how big it is (:mod:`.window`), how a run
keeps its requests under it (:mod:`.guard`), and the strategies that make a request smaller
than the history (:mod:`.compaction`)."""

from datamachine.context.compaction import CompactedView

__all__ = ["CompactedView"]
