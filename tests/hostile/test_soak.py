"""Bounded memory: a long-running ``/chat`` server keeps no per-request data without a bound.

5,000 requests against a real server process after a warm-up, a mix of what a busy site sees
(new sessions, continued ones, refusals); the server's resident memory may grow by less than
10 MiB. The warm-up fills what is bounded on purpose (the scripted provider's record, SQLite's
page cache, the settings caches, pooled threads) so what is measured is growth per request.
"""

from __future__ import annotations

import asyncio
import itertools

import httpx

from tests.hostile.conftest import Served

WARM_UP = 1_000
REQUESTS = 5_000
CLIENTS = 4
MAX_GROWTH = 10 * 1024 * 1024
BODY_TEXT = "x" * 4096  # a few KB per message: a leak of each request would show at once


SESSIONS = 100


def bodies(session_ids: list[str]) -> itertools.cycle[dict[str, object]]:
    """The mix: mostly new conversations, some continued (round the session pool, so each
    grows by a few turns), some malformed or unknown."""
    mix: list[dict[str, object]] = []
    for session_id in session_ids:
        mix += [{"message": BODY_TEXT},
                {"messages": [{"role": "system", "content": "be brief"},
                              {"role": "user", "content": BODY_TEXT}]},
                {"message": "again", "session_id": session_id},
                {"message": 42},  # 422
                {"message": "x", "session_id": "nobody-has-this"}]  # 404
    return itertools.cycle(mix)


async def send(served: Served, token: str, count: int, session_ids: list[str]) -> list[int]:
    """``count`` requests from ``CLIENTS`` concurrent clients; their statuses."""
    statuses: list[int] = []
    mix = bodies(session_ids)
    async with httpx.AsyncClient(base_url=served.url, timeout=30.0,
                                 headers={"Authorization": f"Bearer {token}"}) as http:
        async def client(share: int) -> None:
            for _ in range(share):
                response = await http.post("/chat", json=next(mix))
                statuses.append(response.status_code)

        await asyncio.gather(*(client(count // CLIENTS) for _ in range(CLIENTS)))
    return statuses


def test_five_thousand_requests_grow_the_server_by_less_than_10_mib(served: Served) -> None:
    served.host.settings.set("chat_rate_limit", 0)  # one token plays every caller here
    served.host.settings.set("chat_max_turns", "unlimited")  # one session takes many turns
    token = served.token("soak")
    session_ids = [served.post(token, {"message": "hello"}).json()["transcript_session_id"]
                   for _ in range(SESSIONS)]

    warm = asyncio.run(send(served, token, WARM_UP, session_ids))
    assert set(warm) <= {200, 404, 409, 422}, sorted(set(warm))
    before = served.rss_bytes()
    statuses = asyncio.run(send(served, token, REQUESTS, session_ids))
    after = served.rss_bytes()

    assert len(statuses) == REQUESTS
    assert set(statuses) <= {200, 404, 409, 422}, sorted(set(statuses))  # 409: session busy
    assert statuses.count(200) >= REQUESTS // 2
    growth = after - before
    assert growth < MAX_GROWTH, f"RSS grew {growth / 2**20:.1f} MiB over {REQUESTS} requests"
