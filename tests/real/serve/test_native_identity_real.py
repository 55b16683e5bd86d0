"""Coding agents' own session headers on a real `saga serve`, straight to the engine
and through `saga proxy`: the real `anthropic` SDK sending Claude Code's headers (a
root and two subagents, with `cache_control` blocks) and the real `openai` SDK sending
Codex's and OpenCode's become exactly those sessions and that tree on the server, with
no history inference; a last-request marker ends a session at once, with none of its
KV held after; bad header values and a hint service that is down cost the agent
nothing. SmolLM2 answers with temperature 0 and a few tokens: only who asked matters."""

from __future__ import annotations

import uuid

import openai
import pytest

from saga_sdk import HintReader
from saga_server.serve_child import free_port
from tests.support.http import REQUEST_TIMEOUT_S
from tests.support.proxies import start_proxy, stop_proxy

anthropic = pytest.importorskip("anthropic")

SYSTEM = [{"type": "text", "text": "You are a coding agent. Tools: Read, Grep, Task.",
           "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
GREEDY = {"temperature": 0}  # anthropic 2.x takes it in the body only


def claude_code_call(base_url: str, model: str, session: str, agent: str | None = None,
                     parent_agent: str | None = None, task: str = "fix the bug") -> None:
    """One Messages call as Claude Code sends it: its session header, a subagent's
    agent and parent-agent ids, cached system and history blocks."""
    headers = {"x-claude-code-session-id": session}
    if agent:
        headers["x-claude-code-agent-id"] = agent
    if parent_agent:
        headers["x-claude-code-parent-agent-id"] = parent_agent
    client = anthropic.Anthropic(base_url=base_url, api_key="none", max_retries=0, timeout=REQUEST_TIMEOUT_S)
    answer = client.messages.create(
        model=model, system=SYSTEM, max_tokens=4, extra_headers=headers, extra_body=GREEDY,
        messages=[{"role": "user", "content": [{"type": "text", "text": task,
                                                "cache_control": {"type": "ephemeral", "ttl": "5m"}}]}])
    assert answer.content


def openai_call(openai_url: str, model: str, headers: dict, task: str = "list the files") -> None:
    client = openai.OpenAI(base_url=openai_url, api_key="none", max_retries=0, timeout=REQUEST_TIMEOUT_S)
    completion = client.chat.completions.create(
        model=model, max_tokens=4, temperature=0, seed=1, extra_headers=headers,
        messages=[{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": task}])
    assert completion.choices[0].message is not None


def run_agents(base_url: str, openai_url: str, model: str, tag: str) -> dict[str, str]:
    """Claude Code (a root, two subagents), Codex and OpenCode (a root and a child
    each); the child of Codex sends its last request marked final. Returns session id
    -> the parent the server must know ("" for a root)."""
    cc, codex, oc = f"cc-{tag}", f"codex-{tag}", f"oc-{tag}"
    claude_code_call(base_url, model, cc)
    claude_code_call(base_url, model, cc, agent="explore", task="find the failing test")
    claude_code_call(base_url, model, cc, agent="review", parent_agent="explore", task="review the fix")
    openai_call(openai_url, model, {"thread-id": codex, "session-id": codex})
    openai_call(openai_url, model, {"thread-id": f"{codex}-sub", "x-codex-parent-thread-id": codex})
    openai_call(openai_url, model, {"X-Session-Id": oc})
    openai_call(openai_url, model, {"X-Session-Id": f"{oc}-sub", "x-parent-session-id": oc})
    openai_call(openai_url, model, {"x-dynamo-session-id": f"{codex}-sub", "x-dynamo-session-final": "true"},
                task="report back")
    return {cc: "", f"{cc}:explore": cc, f"{cc}:review": f"{cc}:explore", codex: "", f"{codex}-sub": codex,
            oc: "", f"{oc}-sub": oc}


def assert_tree(reader: HintReader, tree: dict[str, str], ended: str) -> None:
    states = {sid: reader.session(sid) for sid in tree}
    assert {sid: s.parent_session_id for sid, s in states.items()} == tree
    assert states[next(iter(tree))].live_children == 1  # the root's: "explore" (whose child is "review")
    assert states[ended].state == "ended" and states[ended].metrics["kv_held_blocks"] == 0
    parent = tree[ended]
    assert states[parent].live_children == 0 and states[parent].state != "ended"


def test_agents_own_headers_name_sessions_and_subagents_on_the_engine(saga_server):
    tag = uuid.uuid4().hex[:8]
    tree = run_agents(saga_server.base_url, saga_server.openai_url, saga_server.model, tag)
    with HintReader(saga_server.hint_addr) as reader:
        assert_tree(reader, tree, f"codex-{tag}-sub")


def test_through_the_proxy_the_same_agents_are_the_same_tree_and_nothing_is_inferred(saga_server):
    proxy = start_proxy(saga_server.openai_url, saga_server.hint_addr)
    try:
        tag = uuid.uuid4().hex[:8]
        tree = run_agents(proxy.url, proxy.url + "/v1", saga_server.model, tag)
        assert proxy.app.hints.flush(10)
        stats = proxy.app.tracker.stats()
        assert stats.requests == 8 and stats.by_rule["explicit"] == 8  # no history inference used
        assert stats.sessions_ended.get("marked_final") == 1
        with HintReader(saga_server.hint_addr) as reader:
            assert_tree(reader, tree, f"codex-{tag}-sub")
    finally:
        stop_proxy(proxy)


@pytest.mark.parametrize("headers", [
    {"x-claude-code-session-id": "", "x-claude-code-agent-id": "a"},            # blank: no session
    {"thread-id": "t" * 5000, "x-codex-parent-thread-id": "p" * 5000},         # overlong: cut
    {"x-dynamo-session-id": "d-bad", "x-dynamo-session-final": "maybe"},      # not a yes
    {"x-session-id": "loop", "x-parent-session-id": "loop"},                   # its own parent
])
def test_bad_header_values_and_a_hint_service_that_is_down_cost_the_agent_nothing(saga_server, headers):
    openai_call(saga_server.openai_url, saga_server.model, headers)  # straight to the engine
    proxy = start_proxy(saga_server.openai_url, f"127.0.0.1:{free_port()}")  # nobody listens there
    try:
        openai_call(proxy.url + "/v1", saga_server.model, headers)
    finally:
        stop_proxy(proxy, 0.1)
