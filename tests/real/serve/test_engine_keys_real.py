"""`saga serve --api-keys FILE` guards the engine's own OpenAI port with the hint
service's keys (`saga_server.proxy.engine_port`, loaded by vLLM's `--middleware`):

- no key (or an unknown one): 401, and the engine computes nothing; health and
  metrics stay open;
- a key of tenant A is A's whatever the body says: its session ids are `team-a/...`,
  its `vllm_xargs.tenant` is team-a (ranked and charged as team-a: the fair-share
  ledger's tokens per tenant), and its hints, sent with the same agent key, name the
  same scoped session (the one whose KV the engine then holds);
- A's requests never hit B's cached prefix (vLLM's prefix-hit counts), while each
  tenant hits its own.

STARTS ITS OWN ENGINE beside the tier's shared one (which it takes so that the
model is prepared).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid

import pytest

from saga_sdk import HintClient, HintReader
from tests.support.own_engine import OwnEngine

READY_TIMEOUT_S = 600
KEY_A, KEY_B, KEY_OPS = "sk-engine-team-a-0123", "sk-engine-team-b-3210", "sk-engine-ops-admin-99"
# About 12 blocks of 32 tokens: enough to see a hit in whole blocks.
CONTEXT = " ".join(f"Clause {i}: a claim over {i * 10} euros needs two signatures." for i in range(25))


@pytest.fixture(scope="module")
def engine(saga_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("engine-keys-real")
    keys = tmp / "keys"
    keys.write_text(f"{KEY_A} team-a agent\n{KEY_B} team-b agent\n{KEY_OPS} ops admin\n")
    own = OwnEngine("keys", tmp, ["--api-keys", str(keys), "--max-model-len", "2048"])
    try:
        own.wait_ready(READY_TIMEOUT_S)
        own.model = saga_server.model
        yield own
    finally:
        own.stop()


def chat(engine: OwnEngine, key: str | None, content: str, header_session_id: str, **body) -> dict:
    headers = {"X-Session-ID": header_session_id, **({"Authorization": f"Bearer {key}"} if key else {})}
    return engine.post("/v1/chat/completions",
                       {"model": engine.model, "messages": [{"role": "user", "content": content}],
                        "max_tokens": 1, "temperature": 0, "seed": 0, **body}, headers)


def cached(reply: dict) -> int:
    return (reply["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def test_without_a_key_nothing_reaches_the_engine(engine):
    before = engine.computed_tokens()
    for key in (None, "sk-not-in-the-file-000"):
        with pytest.raises(urllib.error.HTTPError) as err:
            chat(engine, key, "Hello", "no-key")
        assert err.value.code == 401
        assert json.loads(err.value.read())["error"]["code"] == "invalid_api_key"
    with urllib.request.urlopen(engine.base_url + "/health", timeout=30) as resp:
        assert resp.status == 200  # probes need no key; /metrics neither (computed_tokens reads it)
    assert engine.computed_tokens() == before


def test_a_tenant_never_hits_anothers_prefix_but_hits_its_own(engine):
    nonce = uuid.uuid4().hex
    prompt = f"Case {nonce}. {CONTEXT} May I claim 120 euros?"
    a_first, a_again = (cached(chat(engine, KEY_A, prompt, f"c-{nonce[:6]}")) for _ in range(2))
    b_first, b_again = (cached(chat(engine, KEY_B, prompt, f"c-{nonce[:6]}")) for _ in range(2))
    assert a_first == 0 and a_again > 0
    assert b_first == 0 and b_again > 0  # the same prompt and session id: nothing of team-a's


def test_a_key_is_its_tenant_whatever_the_body_says_and_its_hints_meet_its_requests(engine):
    sid = f"s-{uuid.uuid4().hex[:8]}"
    with HintClient(endpoint=engine.hint_addr, api_key=KEY_A, flush_interval_s=0.001) as hints:
        hints.session_start(sid, workflow="claims")
        assert hints.flush(30)

    def served() -> dict[str, float]:
        with HintReader(engine.hint_addr, api_key=KEY_OPS) as reader:
            return dict(reader.server_stats().served_tokens_by_tenant)

    before = served()
    chat(engine, KEY_A, "Which tenant am I?", sid, vllm_xargs={"tenant": "team-b", "session_id": f"team-b/{sid}"},
         session_id=f"team-b/{sid}")
    deadline = time.monotonic() + 30  # service is recorded after the engine's step
    while served().get("team-a", 0) <= before.get("team-a", 0) and time.monotonic() < deadline:
        time.sleep(0.5)
    chat(engine, KEY_A, "Which tenant am I?", sid)  # the hinted session's own request
    after = served()
    assert after.get("team-a", 0) > before.get("team-a", 0)
    assert after.get("team-b", 0) == before.get("team-b", 0)  # nothing charged to team-b
    with HintReader(engine.hint_addr, api_key=KEY_OPS) as reader:
        ids = {s.session_id: (s.tenant, s.workflow) for s in reader.sessions(1000)}
        resident = {r.session_id for r in reader.resident()}
    # the body named team-b's session: it became team-a's own `team-a/team-b/<sid>`;
    # the hint's session is team-a's scoped one, as its key's requests' would be
    assert ids.get(f"team-a/{sid}") == ("team-a", "claims") and f"team-a/{sid}" in resident
    assert ids.get(f"team-a/team-b/{sid}", ("",))[0] == "team-a"
    assert f"team-b/{sid}" not in ids and sid not in ids
