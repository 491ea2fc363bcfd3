"""Load: 200 requests from 20 concurrent clients on one real server, no 5xx."""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx

from tests.a2a.conftest import MakeSite

CLIENTS = 20
REQUESTS_PER_CLIENT = 10
DEADLINE_SECONDS = 60.0


def test_two_hundred_requests_from_twenty_clients_complete_without_5xx(
    make_site: MakeSite,
) -> None:
    site = make_site("busy")
    # One token for all twenty clients: lift the per-token limits a real deployment would size.
    site.host.settings.set("chat_rate_limit", 0)
    site.host.settings.set("chat_max_concurrent", 0)
    statuses: list[int] = []
    latencies: list[float] = []
    sessions: dict[int, str] = {}

    async def client(index: int, http: httpx.AsyncClient) -> None:
        # Each client keeps one chat session going, so sessions are continued concurrently.
        for turn in range(REQUESTS_PER_CLIENT):
            body: dict[str, object] = {"message": f"client {index} turn {turn}"}
            if index in sessions:
                body["session_id"] = sessions[index]
            started = time.perf_counter()
            response = await http.post("/chat", json=body)
            latencies.append(time.perf_counter() - started)
            statuses.append(response.status_code)
            if response.status_code == 200:
                sessions.setdefault(index, response.json()["transcript_session_id"])

    async def main() -> float:
        limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
        async with httpx.AsyncClient(base_url=site.url, headers=site.auth(), limits=limits,
                                     timeout=30.0) as http:
            started = time.perf_counter()
            await asyncio.wait_for(
                asyncio.gather(*(client(i, http) for i in range(CLIENTS))), DEADLINE_SECONDS)
            return time.perf_counter() - started

    elapsed = asyncio.run(main())

    assert len(statuses) == CLIENTS * REQUESTS_PER_CLIENT
    assert [s for s in statuses if s >= 500] == []
    assert set(statuses) == {200}
    for session_id in sessions.values():
        assert site.host.chat_sessions.get(session_id).turn_count == REQUESTS_PER_CLIENT
        assert len(site.host.transcripts.get(session_id)) == 2 * REQUESTS_PER_CLIENT
    ordered = sorted(latencies)
    print(f"\n/chat load: {len(statuses)} requests, {CLIENTS} clients, {elapsed:.2f} s, "
          f"{len(statuses) / elapsed:.0f} req/s, p50 {statistics.median(ordered) * 1000:.0f} ms, "
          f"p95 {ordered[int(len(ordered) * 0.95) - 1] * 1000:.0f} ms, "
          f"max {ordered[-1] * 1000:.0f} ms")
