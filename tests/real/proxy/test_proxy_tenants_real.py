"""`saga proxy --api-keys` in front of a real `saga serve`: the same prompt from two
tenants shares no prefix-cache KV (the proxy salts each tenant's requests), while one
tenant repeating it hits its own; the same `X-Session-ID` from both is two sessions on
the server, each its tenant's."""

from __future__ import annotations

import uuid

import openai
import pytest

from saga_sdk import HintClient, HintReader
from saga_server.proxy import ProxyConfig, SagaProxy
from saga_server.proxy.server import BackgroundServer
from saga_server.proxy.tenants import Tenants
from saga_server.rpc import KeyRing
from tests.support.http import REQUEST_TIMEOUT_S

KEY_A, KEY_B, KEY_OPS = "sk-real-team-a-01234567", "sk-real-team-b-76543210", "sk-real-ops-admin-555"
# About 15 blocks of 32 tokens: enough to see a cache hit in whole blocks.
CONTEXT = " ".join(f"Rule {i}: a refund over {i * 10} euros needs a manager's approval." for i in range(30))


@pytest.fixture(scope="module")
def tenant_proxy(saga_server, tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "keys"
    path.write_text(f"{KEY_A} team-a agent\n{KEY_B} team-b agent\n{KEY_OPS} ops admin\n")
    ring = KeyRing(str(path))
    hints = HintClient(endpoint=saga_server.hint_addr, api_key=ring.admin_key(), flush_interval_s=0.001,
                       rpc_timeout_s=0.5)
    app = SagaProxy(ProxyConfig(upstream=saga_server.openai_url), hints=hints, tenants=Tenants(ring))
    server = BackgroundServer(app).start()
    server.app = app
    yield server
    server.stop()
    hints.close(1)


def cached_tokens(proxy, key: str, model: str, messages: list, session_id: str) -> int:
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0, timeout=REQUEST_TIMEOUT_S)
    completion = client.chat.completions.create(model=model, messages=messages, temperature=0, seed=0, max_tokens=1,
                                                extra_headers={"X-Session-ID": session_id})
    assert completion.usage.prompt_tokens > 300
    return completion.usage.prompt_tokens_details.cached_tokens or 0


def test_two_tenants_never_share_prefix_cache_but_each_hits_its_own(saga_server, tenant_proxy):
    nonce = uuid.uuid4().hex  # first, so that no earlier run left this prompt cached
    messages = [{"role": "system", "content": f"Case {nonce}. You are a support agent. {CONTEXT}"},
                {"role": "user", "content": "May I get a refund of 120 euros?"}]
    sid = f"refund-{nonce[:8]}"
    run = lambda key: cached_tokens(tenant_proxy, key, saga_server.model, messages, sid)  # noqa: E731
    a_first, a_again = run(KEY_A), run(KEY_A)
    b_first, b_again = run(KEY_B), run(KEY_B)
    assert a_first == 0 and a_again > 0        # team-a hits its own KV
    assert b_first == 0                        # the same prompt as team-b: nothing of team-a's
    assert b_again > 0                         # and team-b's own KV is its to hit
    assert tenant_proxy.app.tenants.stats().requests == {"team-a": 2, "team-b": 2}
    assert tenant_proxy.app.hints.flush(10)
    with HintReader(saga_server.hint_addr, api_key=KEY_OPS) as reader:
        for tenant in ("team-a", "team-b"):
            state = reader.session(f"{tenant}/{sid}")
            assert (state.tenant, state.steps) == (tenant, 2)
