"""SessionTracker alone: synthetic agents whose requests interleave, as the proxy sees them."""

from __future__ import annotations

import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from saga_server.proxy.sessions import SessionTracker, explicit_session_id

SYSTEM = {"role": "system", "content": "You are an airline agent. Tools: get_user, search, book."}


class Agent:
    """An append-only chat history driven by a plan: each step's answer asks for
    these tools (several = parallel calls) or, when empty, gets a user reply."""

    def __init__(self, name: str, plan: list[list[str]], rng: random.Random, *, rewrite: bool = False):
        self.name, self.plan, self.rng, self.rewrite = name, plan, rng, rewrite
        self.messages = [SYSTEM, {"role": "user", "content": f"I am {name}, please help with my booking."}]
        self.step = 0

    @property
    def done(self) -> bool:
        return self.step >= len(self.plan)

    def body(self) -> dict:
        return {"model": "gpt-4o", "messages": json.loads(json.dumps(self.messages))}

    def answer(self) -> dict:
        tools = self.plan[self.step]
        if not tools:
            return {"role": "assistant", "content": f"step {self.step} for {self.name}: anything else?",
                    "refusal": None}
        return {"role": "assistant", "content": None, "refusal": None,
                "tool_calls": [{"id": f"call_{self.rng.getrandbits(64):016x}", "type": "function",
                                "function": {"name": t, "arguments": json.dumps({"who": self.name, "i": i})}}
                               for i, t in enumerate(tools)]}

    def take(self, answer: dict) -> None:
        """Append the answer the way clients do (dropping nulls, re-dumping arguments),
        then the tool results or the user's reply."""
        echoed = {k: v for k, v in answer.items() if v is not None}
        for call in echoed.get("tool_calls", ()):
            call["function"]["arguments"] = json.dumps(json.loads(call["function"]["arguments"]), indent=1)
        if self.rewrite and echoed.get("content"):
            echoed["content"] = echoed["content"].upper()  # a framework that rewrites answers
        self.messages.append(echoed)
        for call in answer.get("tool_calls") or ():
            self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"result of {call['id']}"})
        if not answer.get("tool_calls"):
            self.messages.append({"role": "user", "content": f"{self.name} says: continue ({self.step})"})
        self.step += 1


def interleave(tracker: SessionTracker, agents: list[Agent], rng: random.Random, max_in_flight: int = 8):
    """Drive agents with requests overlapping at random; returns (agent, turn, events) per request."""
    log, in_flight = [], []
    while any(not a.done for a in agents) or in_flight:
        idle = [a for a in agents if not a.done and all(a is not f[0] for f in in_flight)]
        if idle and (len(in_flight) < max_in_flight and (not in_flight or rng.random() < 0.5)):
            agent = rng.choice(idle)
            turn, events = tracker.begin(agent.body())
            in_flight.append((agent, turn))
            log.append((agent, turn, events))
        else:
            agent, turn = in_flight.pop(rng.randrange(len(in_flight)))
            answer = agent.answer()
            log.append((agent, turn, tracker.finish(turn, [answer], {"prompt_tokens": 10, "completion_tokens": 2})))
            agent.take(answer)
    return log


def accuracy(log) -> float:
    """Share of requests in their agent's session (an agent's session: the one its
    first request opened), counting a session shared by two agents as wrong."""
    first: dict[str, str] = {}
    owners: dict[str, str] = {}
    right = total = 0
    for agent, turn, events in log:
        if not any(e.kind == "llm_call_start" for e in events):
            continue
        total += 1
        home = first.setdefault(agent.name, turn.session_id)
        owner = owners.setdefault(turn.session_id, agent.name)
        right += turn.session_id == home and owner == agent.name
    return right / total


def random_plan(rng: random.Random) -> list[list[str]]:
    return [rng.choice([[], ["get_user"], ["search", "search"], ["book"], ["search", "get_user", "book"]])
            for _ in range(rng.randint(2, 12))]


def test_interleaved_agents_land_in_their_own_sessions():
    rng = random.Random(7)
    tracker = SessionTracker()
    agents = [Agent(f"agent{i}", random_plan(rng), rng) for i in range(30)]
    log = interleave(tracker, agents, rng)
    assert accuracy(log) == 1.0
    assert tracker.stats().sessions_started == 30
    assert tracker.stats().by_rule["answer"] == sum(len(a.plan) for a in agents) - 30


def test_rewritten_answers_still_continue_the_session():
    rng = random.Random(3)
    tracker = SessionTracker()
    agents = [Agent(f"agent{i}", [[], [], ["book"], []], rng, rewrite=True) for i in range(5)]
    log = interleave(tracker, agents, rng)
    assert accuracy(log) == 1.0
    assert tracker.stats().by_rule["request"] > 0


def test_tool_calls_start_with_the_answer_and_end_with_the_next_request():
    rng = random.Random(1)
    tracker = SessionTracker()
    agent = Agent("a", [["search", "get_user"], []], rng)
    turn, events = tracker.begin(agent.body())
    assert [e.kind for e in events] == ["session_start", "llm_call_start"]
    answer = agent.answer()
    events = tracker.finish(turn, [answer], {"prompt_tokens": 12, "completion_tokens": 3})
    assert [(e.kind, e.args.get("tool")) for e in events] == [
        ("llm_call_end", None), ("tool_call_start", "search"), ("tool_call_start", "get_user")]
    assert events[0].args["prompt_tokens"] == 12
    agent.take(answer)
    turn2, events = tracker.begin(agent.body())
    assert turn2.session_id == turn.session_id and turn2.step == 2
    ids = [c["id"] for c in answer["tool_calls"]]
    assert [(e.kind, e.args.get("call_id"), e.args.get("outcome")) for e in events] == [
        ("tool_call_end", ids[0], "ok"), ("tool_call_end", ids[1], "ok"), ("llm_call_start", None, None)]


def test_tool_calls_the_next_request_leaves_unanswered_are_cancelled():
    tracker = SessionTracker()
    msgs = [SYSTEM, {"role": "user", "content": "hi"}]
    turn, _ = tracker.begin({"messages": msgs})
    answer = {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}},
        {"id": "c2", "type": "function", "function": {"name": "book", "arguments": "{}"}}]}
    tracker.finish(turn, [answer])
    _, events = tracker.begin({"messages": msgs + [answer, {"role": "tool", "tool_call_id": "c2", "content": "x"}]})
    assert {(e.args["call_id"], e.args["outcome"]) for e in events if e.kind == "tool_call_end"} == {
        ("c1", "cancelled"), ("c2", "ok")}


def test_a_retry_after_a_failure_stays_but_a_twin_request_is_new():
    tracker = SessionTracker()
    body = {"messages": [SYSTEM, {"role": "user", "content": "same words"}]}
    first, _ = tracker.begin(body)
    tracker.fail(first)
    retry, _ = tracker.begin(body)
    assert (retry.session_id, retry.how) == (first.session_id, "retry")
    tracker.finish(retry, [{"role": "assistant", "content": "hello"}])
    twin, events = tracker.begin(body)
    assert twin.session_id != first.session_id and twin.how == "new"
    assert events[0].kind == "session_start"


def test_explicit_ids_come_first():
    assert explicit_session_id({}, {"helicone-session-id": " h1 "}) == "h1"
    assert explicit_session_id({"session_id": "b"}, {"x-session-id": "h"}) == "h"
    assert explicit_session_id({"vllm_xargs": {"session_id": 5}}, {}) == "5"
    assert explicit_session_id({"metadata": {"litellm_session_id": "l"}}, {}) == "l"
    assert explicit_session_id({"session_id": True, "metadata": "x"}, {"x-session-id": " "}) is None
    tracker = SessionTracker()
    msgs = [SYSTEM, {"role": "user", "content": "hi"}]
    a, events = tracker.begin({"messages": msgs}, {"x-session-id": "mine"})
    b, _ = tracker.begin({"messages": msgs + [{"role": "user", "content": "more"}]}, {"x-session-id": "other"})
    assert (a.session_id, a.how, b.session_id) == ("mine", "explicit", "other")
    assert events[0].kind == "session_start"


def test_memory_is_bounded_by_the_cap_and_by_expiry():
    now = [0.0]
    rng = random.Random(5)
    tracker = SessionTracker(max_sessions=5, idle_ttl_s=60, points_per_session=2, clock=lambda: now[0])
    agents = [Agent(f"agent{i}", [["search"], [], ["book", "book"], [], []], rng) for i in range(20)]
    log = interleave(tracker, agents, rng, max_in_flight=3)
    ends = [e for _, _, events in log for e in events if e.kind == "session_end"]
    stats = tracker.stats()
    assert stats.sessions <= 5 and stats.sessions_evicted == len(ends) > 0
    assert tracker.index_size() <= 5 * (2 + 1)
    now[0] += 61
    expired = tracker.expire()
    assert [e.kind for e in expired].count("session_end") == stats.sessions
    assert tracker.stats().sessions == 0 and tracker.index_size() == 0


def test_expiry_spares_sessions_with_a_request_in_flight():
    now = [0.0]
    tracker = SessionTracker(idle_ttl_s=10, clock=lambda: now[0])
    turn, _ = tracker.begin({"messages": [{"role": "user", "content": "slow"}]})
    now[0] = 100
    assert tracker.expire() == []
    tracker.finish(turn, [{"role": "assistant", "content": "ok"}])
    now[0] = 111
    assert [e.kind for e in tracker.expire()] == ["session_end"]


message = st.one_of(
    st.dictionaries(st.sampled_from(["role", "content", "tool_calls", "tool_call_id", "name", "function_call"]),
                    st.one_of(st.none(), st.text(max_size=5), st.integers(), st.lists(st.integers(), max_size=2),
                              st.just([{"id": 1, "function": "x"}]), st.just([{"function": {"arguments": "{"}}]))),
    st.text(max_size=5), st.integers(), st.none())


@settings(max_examples=200, deadline=None)
@given(body=st.one_of(st.dictionaries(st.sampled_from(["messages", "model", "session_id", "metadata"]),
                                      st.one_of(st.lists(message, max_size=4), st.text(max_size=5), st.none())),
                      st.lists(st.integers(), max_size=2)),
       answers=st.lists(message, max_size=2))
def test_junk_never_raises(body, answers):
    tracker = SessionTracker()
    turn, events = tracker.begin(body)
    assert events[-1].kind == "llm_call_start"
    tracker.finish(turn, answers, {"prompt_tokens": "x"})
    tracker.begin(body)
