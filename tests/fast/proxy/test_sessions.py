"""SessionTracker alone: synthetic agents whose requests interleave, as the proxy sees them."""

from __future__ import annotations

import json
import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from saga_server.core.events import (
    LlmCallEnd,
    LlmCallStart,
    SessionEnd,
    SessionOutcome,
    SessionStart,
    ToolCallEnd,
    ToolCallStart,
)
from saga_server.proxy import HintFacts, MatchRule, SessionTracker, explicit_session_id
from saga_server.proxy.chat import CHAT
from saga_server.proxy.messages import MESSAGES, JsonMessages
from saga_server.proxy.responses import RESPONSES, JsonResponses

SYSTEM = {"role": "system", "content": "You are an airline agent. Tools: get_user, search, book."}


def kinds(hints) -> list[type]:
    return [type(h.event) for h in hints]


def of(hints, kind: type) -> list:
    return [h.event for h in hints if isinstance(h.event, kind)]


def ends(hints) -> list[tuple[str, str]]:
    return [(e.call_id, e.outcome.value) for e in of(hints, ToolCallEnd)]


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
    """Drive agents with requests overlapping at random; returns (agent, exchange, events) per request."""
    log, in_flight = [], []
    while any(not a.done for a in agents) or in_flight:
        idle = [a for a in agents if not a.done and all(a is not f[0] for f in in_flight)]
        if idle and (len(in_flight) < max_in_flight and (not in_flight or rng.random() < 0.5)):
            agent = rng.choice(idle)
            exchange, events = tracker.begin(agent.body())
            in_flight.append((agent, exchange))
            log.append((agent, exchange, events))
        else:
            agent, exchange = in_flight.pop(rng.randrange(len(in_flight)))
            answer = agent.answer()
            events = tracker.finish(exchange, [answer], {"prompt_tokens": 10, "completion_tokens": 2})
            log.append((agent, exchange, events))
            agent.take(answer)
    return log


def accuracy(log) -> float:
    """Share of requests in their agent's session (an agent's session: the one its
    first request opened), counting a session shared by two agents as wrong."""
    first: dict[str, str] = {}
    owners: dict[str, str] = {}
    right = total = 0
    for agent, exchange, events in log:
        if not of(events, LlmCallStart):
            continue
        total += 1
        home = first.setdefault(agent.name, exchange.session_id)
        owner = owners.setdefault(exchange.session_id, agent.name)
        right += exchange.session_id == home and owner == agent.name
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
    assert tracker.stats().by_rule[MatchRule.ANSWER] == sum(len(a.plan) for a in agents) - 30


def test_rewritten_answers_still_continue_the_session():
    rng = random.Random(3)
    tracker = SessionTracker()
    agents = [Agent(f"agent{i}", [[], [], ["book"], []], rng, rewrite=True) for i in range(5)]
    log = interleave(tracker, agents, rng)
    assert accuracy(log) == 1.0
    assert tracker.stats().by_rule[MatchRule.REQUEST] > 0


def test_tool_calls_start_with_the_answer_and_end_with_the_next_request():
    rng = random.Random(1)
    tracker = SessionTracker()
    agent = Agent("a", [["search", "get_user"], []], rng)
    exchange, events = tracker.begin(agent.body())
    sid = exchange.session_id
    assert kinds(events) == [SessionStart, LlmCallStart]
    assert events[1].event == LlmCallStart(sid, events[1].event.time, step=1, node="llm", request_id=f"{sid}:1")
    answer = agent.answer()
    events = tracker.finish(exchange, [answer], {"prompt_tokens": 12, "completion_tokens": 3})
    ids = [c["id"] for c in answer["tool_calls"]]
    t = events[0].event.time
    assert [h.event for h in events] == [
        LlmCallEnd(sid, t, step=1, node="llm", request_id=f"{sid}:1", prompt_tokens=12, output_tokens=3),
        ToolCallStart(sid, t, tool="search", call_id=ids[0]), ToolCallStart(sid, t, tool="get_user", call_id=ids[1])]
    agent.take(answer)
    exchange2, events = tracker.begin(agent.body())
    assert exchange2.session_id == sid and exchange2.step == 2
    assert kinds(events) == [ToolCallEnd, ToolCallEnd, LlmCallStart]
    assert ends(events) == [(ids[0], "ok"), (ids[1], "ok")]


def test_tool_calls_the_next_request_leaves_unanswered_are_cancelled():
    tracker = SessionTracker()
    msgs = [SYSTEM, {"role": "user", "content": "hi"}]
    exchange, _ = tracker.begin({"messages": msgs})
    answer = {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}},
        {"id": "c2", "type": "function", "function": {"name": "book", "arguments": "{}"}}]}
    tracker.finish(exchange, [answer])
    _, events = tracker.begin({"messages": msgs + [answer, {"role": "tool", "tool_call_id": "c2", "content": "x"}]})
    assert set(ends(events)) == {("c1", "cancelled"), ("c2", "ok")}


def test_a_retry_after_a_failure_stays_but_a_twin_request_is_new():
    tracker = SessionTracker()
    body = {"messages": [SYSTEM, {"role": "user", "content": "same words"}]}
    first, _ = tracker.begin(body)
    tracker.fail(first)
    retry, _ = tracker.begin(body)
    assert (retry.session_id, retry.how) == (first.session_id, MatchRule.RETRY)
    tracker.finish(retry, [{"role": "assistant", "content": "hello"}])
    twin, events = tracker.begin(body)
    assert twin.session_id != first.session_id and twin.how == MatchRule.NEW
    assert isinstance(events[0].event, SessionStart)


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
    assert isinstance(events[0].event, SessionStart)


def test_memory_is_bounded_by_the_cap_and_by_expiry():
    now = [0.0]
    rng = random.Random(5)
    tracker = SessionTracker(max_sessions=5, idle_ttl_s=60, points_per_session=2, clock=lambda: now[0])
    agents = [Agent(f"agent{i}", [["search"], [], ["book", "book"], [], []], rng) for i in range(20)]
    log = interleave(tracker, agents, rng, max_in_flight=3)
    evicted = [e for _, _, events in log for e in of(events, SessionEnd)]
    stats = tracker.stats()
    assert stats.sessions <= 5 and stats.sessions_evicted == len(evicted) > 0
    assert tracker.index_size() <= 5 * (2 + 1)
    now[0] += 61
    expired = tracker.expire()
    assert kinds(expired).count(SessionEnd) == stats.sessions
    assert tracker.stats().sessions == 0 and tracker.index_size() == 0


def test_expiry_spares_sessions_with_a_request_in_flight():
    now = [0.0]
    tracker = SessionTracker(idle_ttl_s=10, clock=lambda: now[0])
    exchange, _ = tracker.begin({"messages": [{"role": "user", "content": "slow"}]})
    now[0] = 100
    assert tracker.expire() == []
    tracker.finish(exchange, [{"role": "assistant", "content": "ok"}])
    now[0] = 111
    assert kinds(tracker.expire()) == [SessionEnd]


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
    exchange, events = tracker.begin(body)
    assert isinstance(events[-1].event, LlmCallStart)
    tracker.finish(exchange, answers, {"prompt_tokens": "x"})
    tracker.begin(body)


def test_tool_arguments_nested_deeper_than_the_parser_goes_still_match():
    """Arguments are compared as JSON values when they parse; ones nested past the
    parser's depth are compared as text, like any unparseable string."""
    call = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "[" * 100_000 + "]" * 100_000}}
    tracker = SessionTracker()
    history = [SYSTEM, {"role": "user", "content": "deep arguments"}]
    exchange, _ = tracker.begin({"messages": history})
    tracker.finish(exchange, [{"role": "assistant", "content": None, "tool_calls": [call]}])
    history += [{"role": "assistant", "tool_calls": [call]}, {"role": "tool", "tool_call_id": "c1", "content": "r"}]
    again, events = tracker.begin({"messages": history})
    assert (again.session_id, again.how) == (exchange.session_id, MatchRule.ANSWER)
    assert kinds(events) == [ToolCallEnd, LlmCallStart]


# -- the other APIs, text actions and session ends ----------------------------------------------

def test_responses_histories_match_with_or_without_what_clients_drop():
    """A resent history keeps or drops reasoning items, drops `id` and `status`
    fields and re-dumps arguments; it still continues the answer, and its outputs
    end the calls."""
    tracker = SessionTracker()
    body = {"model": "m", "instructions": "be brief", "input": [{"role": "user", "content": "book a flight"}]}
    exchange, _ = tracker.begin(RESPONSES.read(body, {}))
    output = [{"type": "reasoning", "id": "rs_1", "summary": []},
              {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": "Looking.", "annotations": []}]},
              {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "search", "arguments": '{"q":"x"}',
               "status": "completed"},
              {"type": "function_call", "id": "fc_2", "call_id": "c2", "name": "book", "arguments": "{}"}]
    events = tracker.finish(exchange, JsonResponses().read({"id": "resp_1", "output": output,
                                                        "usage": {"input_tokens": 9, "output_tokens": 4}}))
    assert kinds(events) == [LlmCallEnd, ToolCallStart, ToolCallStart]
    assert [e.tool for e in of(events, ToolCallStart)] == ["search", "book"]
    assert events[0].event.prompt_tokens == 9
    resent = [{"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "e"},
              {"role": "assistant", "content": "Looking."},
              {"type": "function_call", "call_id": "c1", "name": "search", "arguments": '{ "q": "x" }'},
              {"type": "function_call", "call_id": "c2", "name": "book", "arguments": "{}"},
              {"type": "function_call_output", "call_id": "c2", "output": "booked"}]
    exchange2, events = tracker.begin(RESPONSES.read({**body, "input": body["input"] + resent}, {}))
    assert (exchange2.session_id, exchange2.how) == (exchange.session_id, MatchRule.ANSWER)
    assert ends(events) == [("c1", "cancelled"), ("c2", "ok")]


def test_previous_response_ids_chain_and_an_unknown_one_starts_a_session():
    tracker = SessionTracker()
    exchange, _ = tracker.begin(RESPONSES.read({"model": "m", "input": "hi"}, {}))
    tracker.finish(exchange, JsonResponses().read({"id": "resp_a", "output": [
        {"type": "function_call", "call_id": "c1", "name": "search", "arguments": "{}"}]}))
    follow = {"model": "m", "previous_response_id": "resp_a",
              "input": [{"type": "function_call_output", "call_id": "c1", "output": "ok"}]}
    exchange2, events = tracker.begin(RESPONSES.read(follow, {}))
    assert (exchange2.session_id, exchange2.how) == (exchange.session_id, MatchRule.PREVIOUS)
    assert ends(events) == [("c1", "ok")]
    lost, events = tracker.begin(RESPONSES.read({**follow, "previous_response_id": "resp_gone"}, {}))
    assert lost.how == MatchRule.NEW and isinstance(events[0].event, SessionStart)


def test_messages_histories_match_across_moved_cache_markers_and_dropped_thinking():
    tracker = SessionTracker()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}
    first = [{"role": "user", "content": [{**image, "cache_control": {"type": "ephemeral"}},
                                          {"type": "text", "text": "fix the bug", "cache_control": {"type": "ephemeral"}}]}]
    body = {"model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "You code."}], "messages": first}
    exchange, _ = tracker.begin(MESSAGES.read(body, {}))
    content = [{"type": "thinking", "thinking": "hm", "signature": "s"}, {"type": "text", "text": "Reading."},
               {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "a.py"}},
               {"type": "tool_use", "id": "t2", "name": "grep", "input": {}}]
    events = tracker.finish(exchange, JsonMessages().read({"id": "msg_1", "content": content, "stop_reason": "tool_use",
                                                       "usage": {"input_tokens": 3, "cache_read_input_tokens": 7,
                                                                 "output_tokens": 2}}))
    assert events[0].event.prompt_tokens == 10
    assert kinds(events[1:]) == [ToolCallStart, ToolCallStart]
    assert [h.event.tool for h in events[1:]] == ["read", "grep"]
    resent = [{"role": "user", "content": [image, {"type": "text", "text": "fix the bug"}]},  # the markers moved on
              {"role": "assistant", "content": content[1:]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x = 1",
                                            "cache_control": {"type": "ephemeral"}}]}]
    exchange2, events = tracker.begin(MESSAGES.read({**body, "messages": resent}, {}))
    assert (exchange2.session_id, exchange2.how) == (exchange.session_id, MatchRule.ANSWER)
    assert ends(events) == [("t1", "ok"), ("t2", "cancelled")]


def text_agent_exchange(tracker, messages, answer, **finish):
    exchange, begun = tracker.begin({"model": "m", "messages": messages})
    done = tracker.finish(exchange, [{"role": "assistant", "content": answer}], **finish)
    messages.append({"role": "assistant", "content": answer})
    return exchange, begun, done


def test_text_actions_start_a_tool_per_block_and_end_on_an_observation():
    tracker = SessionTracker()
    messages = [SYSTEM, {"role": "user", "content": "Fix the failing test."}]
    answer = "THOUGHT: look.\n\n```bash\ngrep -rn foo src\n```\nthen\n```sh\ncd repo && timeout 60 python -m pytest -x\n```"
    exchange, _, done = text_agent_exchange(tracker, messages, answer)
    starts = [(e.tool, e.category) for e in of(done, ToolCallStart)]
    assert starts == [("grep", "search"), ("pytest", "test")]
    messages.append({"role": "user", "content": "<returncode>1</returncode>\n<output>\n1 failed\n</output>"})
    exchange2, begun, done = text_agent_exchange(tracker, messages, "THOUGHT: edit.\n```bash\nsed -i s/a/b/ f.py\n```")
    assert exchange2.session_id == exchange.session_id
    assert [o for _, o in ends(begun)] == ["ok", "ok"]
    messages.append({"role": "user", "content": "Please always provide EXACTLY ONE action."})
    _, begun, _ = text_agent_exchange(tracker, messages,
                                      "THOUGHT: done.\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```")
    assert [o for _, o in ends(begun)] == ["cancelled"]  # that reply was no observation: the command never ran


def test_a_submit_marker_ends_the_session_and_a_continuation_revives_it():
    tracker = SessionTracker()
    messages = [SYSTEM, {"role": "user", "content": "Fix it."}]
    exchange, _, done = text_agent_exchange(tracker, messages,
                                            "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff\n```")
    assert kinds(done) == [LlmCallEnd, SessionEnd]
    assert of(done, SessionEnd)[0].outcome is SessionOutcome.COMPLETED
    assert tracker.session_ids() == [] and tracker.stats().sessions_ended == {"submit": 1}
    messages.append({"role": "user", "content": "<returncode>0</returncode>"})
    again, begun = tracker.begin({"model": "m", "messages": messages})
    assert again.session_id == exchange.session_id and not again.new_session
    assert kinds(begun) == [SessionStart, LlmCallStart]
    assert tracker.stats().sessions_revived == 1 and tracker.stats().sessions_started == 1


def test_the_idle_timeout_is_learnt_per_workflow_within_its_bounds():
    now = [0.0]
    tracker = SessionTracker(idle_ttl_s=600, idle_min_s=5, clock=lambda: now[0])
    rng = random.Random(2)
    for i in range(4):  # agents of one workflow, pausing 1-3 s between calls
        agent = Agent(f"agent{i}", [["search"]] * 8, rng)
        while not agent.done:
            exchange, _ = tracker.begin(agent.body())
            answer = agent.answer()
            tracker.finish(exchange, [answer])
            agent.take(answer)
            now[0] += rng.uniform(1.0, 3.0)
    learnt = tracker.pauses.idle_timeout(tracker._workflow(CHAT.read(agent.body(), {})))
    assert 5.0 <= learnt <= 6.0  # 2 x the 99th percentile of 1-3 s gaps
    fresh, _ = tracker.begin(Agent("late", [["search"]], rng).body())
    other, _ = tracker.begin({"model": "other-model", "messages": [{"role": "user", "content": "hi"}]})
    for exchange in (fresh, other):
        tracker.finish(exchange, [{"role": "assistant", "content": "ok"}])
    now[0] += learnt + 0.5
    ended = {e.session_id for e in of(tracker.expire(), SessionEnd)}
    assert fresh.session_id in ended and other.session_id not in ended and len(ended) == 5  # the workflow's
    now[0] += 600
    assert [e.session_id for e in of(tracker.expire(), SessionEnd)] == [other.session_id]
    assert tracker.stats().sessions == 0 and tracker.stats().sessions_expired == 6


def final_answer_session(tracker, now, words: str):
    """A session that calls a tool, then answers with text."""
    messages = [SYSTEM, {"role": "user", "content": words}]
    exchange, _ = tracker.begin({"model": "m", "messages": messages})
    call = {"role": "assistant", "tool_calls": [{"id": f"c-{words}", "type": "function",
                                                 "function": {"name": "search", "arguments": "{}"}}]}
    tracker.finish(exchange, [call])
    messages += [call, {"role": "tool", "tool_call_id": f"c-{words}", "content": "found"}]
    now[0] += 1
    exchange, _ = tracker.begin({"model": "m", "messages": messages})
    return exchange, messages, tracker.finish(exchange, [{"role": "assistant", "content": "Here you are."}])


def test_final_answers_end_sessions_once_the_workflow_shows_they_are_final():
    now = [0.0]
    tracker = SessionTracker(idle_ttl_s=600, idle_min_s=5, clock=lambda: now[0])
    _, _, done = final_answer_session(tracker, now, "first")
    assert SessionEnd not in kinds(done)  # nothing known yet: the idle timeout decides
    now[0] += 601
    assert kinds(tracker.expire()) == [SessionEnd]
    exchange, messages, done = final_answer_session(tracker, now, "second")
    assert kinds(done) == [LlmCallEnd, SessionEnd]  # quiet after a final answer: it was final
    assert tracker.stats().sessions_ended["final"] == 1
    # This one does come back (its user replied): the same session, and the workflow learns it.
    again, begun = tracker.begin({"model": "m", "messages": messages + [
        {"role": "assistant", "content": "Here you are."}, {"role": "user", "content": "And a hotel?"}]})
    assert again.session_id == exchange.session_id and isinstance(begun[0].event, SessionStart)
    _, _, done = final_answer_session(tracker, now, "third")
    assert SessionEnd not in kinds(done)  # one quiet, one resumed: not final enough


def test_an_abandoned_call_ends_its_session_after_the_grace_unless_retried():
    now = [0.0]
    tracker = SessionTracker(abandon_grace_s=5, clock=lambda: now[0])
    body = {"messages": [SYSTEM, {"role": "user", "content": "slow one"}]}
    exchange, _ = tracker.begin(body)
    tracker.fail(exchange, abandoned=True)
    now[0] += 3
    retry, _ = tracker.begin(body)
    assert (retry.session_id, retry.how) == (exchange.session_id, MatchRule.RETRY)
    tracker.fail(retry, abandoned=True)
    now[0] += 6
    assert [(type(e), e.outcome) for e in (h.event for h in tracker.expire())] == [
        (SessionEnd, SessionOutcome.CANCELLED)]
    assert tracker.stats().sessions_ended == {"gone": 1}


# -- what an observer (the recorder) learns beyond the hints -------------------------------------

def facts(hints, kind: type) -> list[HintFacts]:
    return [h.facts for h in hints if isinstance(h.event, kind)]


def test_facts_say_what_each_request_continues_its_sizes_and_why_a_session_ended():
    tracker = SessionTracker(idle_ttl_s=1.0, idle_min_s=1.0)
    first = [SYSTEM, {"role": "user", "content": "hello"}]
    exchange, events = tracker.begin({"model": "gpt-4o", "messages": first})
    [start] = facts(events, LlmCallStart)
    assert start == HintFacts(extends="", prompt_chars=len(SYSTEM["content"]) + 5, model="gpt-4o")
    answer = {"role": "assistant", "content": None,
              "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}]}
    events = tracker.finish(exchange, [answer], {"prompt_tokens": 30, "completion_tokens": 4,
                                             "prompt_tokens_details": {"cached_tokens": 16}})
    assert facts(events, LlmCallEnd) == [HintFacts(cached_tokens=16, output_chars=len("search{}"))]
    extended = first + [answer, {"role": "tool", "tool_call_id": "c1", "content": "r"}]
    exchange, events = tracker.begin({"model": "gpt-4o", "messages": extended})
    assert facts(events, LlmCallStart)[0].extends == "answer"
    assert facts(tracker.fail(exchange), LlmCallEnd) == [HintFacts(failed=True)]
    exchange, events = tracker.begin({"model": "gpt-4o", "messages": extended})  # the retry
    assert (exchange.how, facts(events, LlmCallStart)[0].extends) == (MatchRule.RETRY, "request")
    rewritten = extended + [{"role": "assistant", "content": "DONE"}, {"role": "user", "content": "more"}]
    tracker.finish(exchange, [{"role": "assistant", "content": "done"}], {"prompt_tokens": 40})
    exchange, events = tracker.begin({"model": "gpt-4o", "messages": rewritten})
    assert (exchange.how, facts(events, LlmCallStart)[0].extends) == (MatchRule.REQUEST, "request")
    tracker.finish(exchange, [{"role": "assistant", "content": "ok"}])
    explicit, events = tracker.begin({"model": "m", "messages": first}, {"x-session-id": "mine"})
    tracker.finish(explicit, [{"role": "assistant", "content": "ok"}])
    _, events = tracker.begin({"model": "m", "messages": first + [{"role": "assistant", "content": "ok"},
                                                                {"role": "user", "content": "and?"}]},
                              {"x-session-id": "mine"})
    assert facts(events, LlmCallStart)[0].extends == "answer"
    assert [f.end_reason for f in facts(tracker.close(), SessionEnd)] == ["closed", "closed"]


def test_cached_tokens_are_read_from_each_apis_usage_and_none_when_not_reported():
    chat = CHAT.reply([{"role": "assistant", "content": "x"}], {"prompt_tokens": 9,
                                                                "prompt_tokens_details": {"cached_tokens": 5}})
    assert (chat.cached_tokens, CHAT.reply([{"role": "assistant", "content": "x"}], {"prompt_tokens": 9}).cached_tokens
            ) == (5, None)
    responses = JsonResponses().read({"id": "r", "output": [], "usage": {
        "input_tokens": 9, "input_tokens_details": {"cached_tokens": 6}}})
    assert responses.cached_tokens == 6
    messages = JsonMessages().read({"id": "m", "content": [], "usage": {
        "input_tokens": 3, "cache_read_input_tokens": 7, "output_tokens": 1}})
    assert (messages.prompt_tokens, messages.cached_tokens) == (10, 7)
    assert JsonMessages().read({"id": "m", "content": [], "usage": {"input_tokens": 3}}).cached_tokens is None


def test_a_subagent_names_its_parent_and_the_final_marker_ends_its_session_at_once():
    tracker = SessionTracker()
    msgs = [SYSTEM, {"role": "user", "content": "fix the bug"}]
    root, root_hints = tracker.begin({"messages": msgs}, {"x-claude-code-session-id": "cc"})
    tracker.finish(root, [{"role": "assistant", "content": "",
                           "tool_calls": [{"id": "t1", "type": "function",
                                           "function": {"name": "Task", "arguments": "{}"}}]}])
    child_headers = {"x-claude-code-session-id": "cc", "x-claude-code-agent-id": "explore"}
    child, child_hints = tracker.begin({"messages": [SYSTEM, {"role": "user", "content": "explore"}]}, child_headers)
    assert of(root_hints, SessionStart)[0].parent_id == ""
    assert (child.session_id, child.how, of(child_hints, SessionStart)[0].parent_id) == ("cc:explore", "explicit", "cc")
    # Its last request, so marked: it ends once answered, whatever the answer asks for.
    last, _ = tracker.begin({"messages": [SYSTEM, {"role": "user", "content": "report"}]},
                            {**child_headers, "x-saga-session-id": "", "x-dynamo-session-id": "cc:explore",
                             "x-dynamo-session-final": "true"})
    done = tracker.finish(last, [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "t9", "type": "function", "function": {"name": "grep", "arguments": "{}"}}]}])
    assert kinds(done) == [LlmCallEnd, SessionEnd] and done[-1].facts.end_reason == "marked_final"
    stats = tracker.stats()
    assert stats.by_rule[MatchRule.EXPLICIT] == 3 and stats.by_rule[MatchRule.NEW] == 0
    assert stats.sessions == 1  # the root lives


def test_a_tenants_parent_id_is_namespaced_like_its_session():
    tracker = SessionTracker()
    request = CHAT.read({"messages": [SYSTEM]}, {"x-session-id": "c", "x-parent-session-id": "p"})
    _, hints = tracker.begin(replace(request, tenant="team-a"))
    start = of(hints, SessionStart)[0]
    assert start.session_id.startswith("team-a") and start.parent_id.startswith("team-a")
    assert start.parent_id != "p" and start.session_id != "c"


def test_requests_under_different_prompt_cache_keys_never_continue_one_another():
    tracker = SessionTracker()
    msgs = [SYSTEM, {"role": "user", "content": "hi"}]
    a, _ = tracker.begin({"messages": msgs, "prompt_cache_key": "conv-1"})
    tracker.finish(a, [{"role": "assistant", "content": "hello"}])
    follow = msgs + [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    same, _ = tracker.begin({"messages": follow, "prompt_cache_key": "conv-1"})
    other, _ = tracker.begin({"messages": follow, "prompt_cache_key": "conv-2"})
    assert (same.session_id, same.how) == (a.session_id, MatchRule.ANSWER)
    assert other.session_id != a.session_id and other.how == MatchRule.NEW
