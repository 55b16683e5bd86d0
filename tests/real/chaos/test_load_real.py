"""Many agents at once through `saga proxy` to the real engine (chaos table row 5).

Each agent is two chat steps with tiny prompts and a structured-output choice of
one word (so every answer is known: "ok", then "done"), all agents in flight
together on one asyncio loop. Every response must be well formed and its own
agent's, each agent must be its own session in the proxy's tracker (its first
request a new session, its second found by the answer it continues), and the
tracker's index must stay within its bound. One agent alone first gives the
no-load latency.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import pytest

from tests.support.chaos_table import ChaosRow, added_median, percentiles
from tests.support.http import REQUEST_TIMEOUT_S

ANSWERS = ("ok", "done")


async def agent(client: httpx.AsyncClient, url: str, model: str, name: str) -> tuple[list[float], int]:
    """Two steps; returns their latencies and how many answers were malformed."""
    messages = [{"role": "system", "content": "Reply."}, {"role": "user", "content": f"Agent {name}."}]
    latencies, malformed = [], 0
    for word in ANSWERS:
        t0 = time.perf_counter()
        response = await client.post(url, json={"model": model, "messages": messages, "max_tokens": 4,
                                                "temperature": 0, "seed": 0,
                                                "structured_outputs": {"choice": [word]}})
        latencies.append(time.perf_counter() - t0)
        if response.status_code >= 400:  # an HTTP error is an agent error; the proxy's body says why
            raise AssertionError(f"HTTP {response.status_code}: {response.text[:300]}")
        body = response.json()
        choice = (body.get("choices") or [{}])[0]
        content = (choice.get("message") or {}).get("content")
        malformed += not (body.get("object") == "chat.completion" and content == word
                          and choice.get("finish_reason") in ("stop", "length")
                          and 0 < body["usage"]["completion_tokens"] <= 4)
        messages += [{"role": "assistant", "content": content or ""}, {"role": "user", "content": "Again."}]
    return latencies, malformed


def crowd(url: str, model: str, names: list[str]) -> list:
    async def everyone():
        limits = httpx.Limits(max_connections=len(names) + 8, max_keepalive_connections=len(names) + 8)
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
            return await asyncio.gather(*(agent(client, url, model, n) for n in names), return_exceptions=True)

    return asyncio.run(everyone())


@pytest.mark.parametrize("agents", [50, 200])
def test_concurrent_agents_through_the_proxy(saga_server, make_proxy, server_after, chaos_row, agents):
    # Sessions stay until the proxy stops: none may end for quiet while the crowd runs.
    proxy = make_proxy(saga_server.openai_url, saga_server.hint_addr, idle_min_s=3600.0, idle_ttl_s=3600.0)
    url, tracker, tag = proxy.url + "/v1/chat/completions", proxy.app.tracker, uuid.uuid4().hex[:6]
    (alone,) = crowd(url, saga_server.model, [f"{tag}-alone"])
    assert not isinstance(alone, BaseException) and alone[1] == 0
    before = tracker.stats()

    results = crowd(url, saga_server.model, [f"{tag}-{i}" for i in range(agents)])

    errors = [r for r in results if isinstance(r, BaseException)]
    done = [r for r in results if not isinstance(r, BaseException)]
    malformed = sum(m for _, m in done)
    assert errors == [], errors[:3]
    assert malformed == 0
    after = tracker.stats()
    grew = {rule: after.by_rule[rule] - before.by_rule[rule] for rule in after.by_rule}
    assert after.sessions_started - before.sessions_started == agents  # each agent its own session...
    assert grew["new"] == grew["answer"] == agents                        # ...which its second step found
    assert after.sessions == agents + 1                                   # the crowd and the lone agent, all live
    bound = after.sessions * (2 * tracker.points_per_session + 1)
    assert agents <= tracker.index_size() <= bound
    assert proxy.app.errors == dict.fromkeys(proxy.app.errors, 0)

    latencies = [s for lat, _ in done for s in lat]
    p50, p99 = percentiles(latencies)
    chaos_row(ChaosRow(
        f"{agents} concurrent agents x 2 steps through the proxy", len(errors), added_median(alone[0], latencies),
        len(errors) + malformed, server_after(),
        f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms per request; {agents} sessions in the tracker, "
        f"index {tracker.index_size()} entries (bound {bound}); "
        f"{proxy.app.upstream_retries} requests sent again after a connection closed unanswered"))
