"""What one compaction costs, by strategy, on a 200-turn history (DESIGN.md 21).

``python3 bench/context_cost.py`` (``--turns N``, ``--result-bytes B``, ``--json``): a history
of N tool turns, each a call and a result of B bytes (default 200 turns of 5 KB, about a
megabyte), compacted once by each built-in strategy as a run compacts it: the strategy, then
the new view projected to learn its size (what the run sends next). ``summarize`` is measured
without its model call (a scripted answer: the model's own latency is not the loop's cost);
what it pays is choosing what to summarize, writing the text the model reads, and projecting
the view. Each figure is the median of repeated runs, in milliseconds.

The other half of DESIGN 21's speed bound, what a turn that needs no compaction adds, is
``bench/compare.py --context`` (a window set, never filled, against the commit before).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agents_api import Message  # noqa: E402
from datamachine.context.compaction import (  # noqa: E402
    clear_tool_results,
    drop_oldest,
    split_for_summary,
    summary_message,
    summary_request_text,
)
from datamachine.conversation.projection import ChatProjector  # noqa: E402
from datamachine.conversation.provider_turn import ProviderTurn  # noqa: E402


def history(turns: int, result_bytes: int) -> list[Message]:
    """A system message, the question, then ``turns`` tool turns."""
    line = "lorem ipsum dolor sit amet, consectetur adipiscing elit. "
    text = (line * (result_bytes // len(line) + 1))[:result_bytes]
    messages = [Message.text("system", "You read pages."),
                Message.text("user", "Read every page, then summarize.")]
    for number in range(1, turns + 1):
        call_id = f"call_{number}"
        messages.append(Message.tool_call("read_page", {"n": number}, number, call_id))
        messages.append(Message.tool_result("read_page", {"success": True, "result": text},
                                            number, call_id, text))
    return messages


def _projected_bytes(view: list[Message]) -> int:
    projector = ChatProjector()
    projector.sync(view)
    return projector.bytes


def strategies(messages: list[Message]) -> dict[str, Callable[[], Any]]:
    """Each strategy as a run applies it, then sizes the view it made."""

    def tokens(size: int) -> int:
        return size // 4

    total = _projected_bytes(messages)

    def clear() -> int:
        view, _count = clear_tool_results(messages, 3, tokens)
        return _projected_bytes(view)

    def drop() -> int:  # half the history goes
        view, _count = drop_oldest(messages, 3, total // 2, ProviderTurn.message_bytes)
        return _projected_bytes(view)

    def summarize() -> int:
        parts = split_for_summary(messages, 3)
        assert parts is not None
        head, summarized, tail = parts
        summary_request_text(summarized, 24_000)  # what the model would read
        view = [*head, summary_message("Notes: pages 1 to 197 read.", turn=201,
                                       covers=len(summarized)), *tail]
        return _projected_bytes(view)

    return {"clear_tool_results": clear, "summarize": summarize, "drop_oldest": drop,
            "(projecting the whole history)": lambda: _projected_bytes(messages)}


def measure(turns: int, result_bytes: int, repeat: int = 15) -> dict[str, float]:
    """Median milliseconds of each strategy on a fresh history of ``turns`` turns."""
    messages = history(turns, result_bytes)
    found: dict[str, float] = {}
    for name, run in strategies(messages).items():
        run()  # warm
        samples = []
        for _ in range(repeat):
            start = time.perf_counter()
            run()
            samples.append((time.perf_counter() - start) * 1000)
        found[name] = statistics.median(samples)
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--result-bytes", type=int, default=5_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    found = measure(args.turns, args.result_bytes)
    if args.json:
        print(json.dumps(found, indent=2))
        return
    print(f"| one compaction, {args.turns} turns of {args.result_bytes:,}-byte results | ms |")
    print("|---|---|")
    for name, ms in found.items():
        print(f"| {name} | {ms:.2f} |")


if __name__ == "__main__":
    main()
