"""Load for the chaos suite (`tests/real/chaos`): agents to run while faults happen,
and hint floods.

- `tool_agent`: a forced tool-calling chat loop through the real OpenAI SDK (one
  named tool per step, strict schema, one enum argument: at temperature 0 the same
  loop gets the same answers, run after run); `run_agents` runs several at once and
  collects their errors; `Phases` holds them at step boundaries while a fault is
  injected, so where a fault lands does not depend on timing.
- `flood_hints`: one client streaming pre-built hint batches to a hint service as
  fast as it takes them; `flood_with_client`: the same through the SDK's
  `HintClient` (which drops, and counts, what its queue cannot hold).
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence, TypeVar

from saga_proto import hints_pb2 as pb
from saga_proto import hints_pb2_grpc
from saga_sdk import ClientStats, HintClient
from saga_sdk.channel import hint_channel

__all__ = ["AgentRun", "FloodResult", "Phases", "TOOL_PLAN", "flood_hints", "flood_with_client", "run_agents",
           "tool_agent", "tool_specs"]

T = TypeVar("T")

TOOL_PLAN = ("lookup_customer", "search_flights", "book_seat", "send_receipt")
CITIES = ["Oslo", "Rome", "Lima"]
SYSTEM = "You are an airline agent. Use the tools."


def tool_specs(names: Sequence[str] = TOOL_PLAN) -> list[dict]:
    """Strict tools with one bounded argument: guided decoding cannot ramble, and the
    model's only choice is which city."""
    return [{"type": "function", "function": {
        "name": name, "description": f"{name.replace('_', ' ')} for the customer", "strict": True,
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": CITIES}},
                       "required": ["city"], "additionalProperties": False}}} for name in names]


@dataclass
class AgentRun:
    answers: list[tuple] = field(default_factory=list)     # per step: ((tool, arguments), ...) it called
    latencies_s: list[float] = field(default_factory=list)  # per step


def tool_agent(client, model: str, customer: str, *, plan: Sequence[str] = TOOL_PLAN,
               before_step: Callable[[int], None] | None = None, max_tokens: int = 48) -> AgentRun:
    """Run the loop: step i forces tool `plan[i]` (`client` is an `openai.OpenAI`);
    each call's result goes back as a tool message. Arguments are compared parsed:
    guided decoding may place whitespace either way."""
    tools = tool_specs(plan)
    messages: list = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": customer}]
    run = AgentRun()
    for step, tool in enumerate(plan):
        if before_step is not None:
            before_step(step)
        t0 = time.perf_counter()
        message = client.chat.completions.create(
            model=model, messages=messages, tools=tools, max_tokens=max_tokens, temperature=0, seed=0,
            tool_choice={"type": "function", "function": {"name": tool}}).choices[0].message
        run.latencies_s.append(time.perf_counter() - t0)
        calls = message.tool_calls or []
        run.answers.append(tuple((c.function.name, _parsed(c.function.arguments)) for c in calls))
        messages.append(message)
        messages += [{"role": "tool", "tool_call_id": c.id, "content": json.dumps({"ok": c.function.name})}
                     for c in calls]
    return run


def _parsed(arguments: str):
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


class Phases:
    """Agents and one conductor meet before the steps in `at`: each agent calls
    `before_step(step)` (pass it to `tool_agent`); the conductor calls `arrived()`,
    which returns once every agent finished the steps before, does its fault, then
    `release()`. A failed agent calls `abort()` so nobody waits for it."""

    def __init__(self, agents: int, at: Sequence[int], timeout_s: float) -> None:
        self._barrier = threading.Barrier(agents + 1, timeout=timeout_s)
        self.at = frozenset(at)

    def before_step(self, step: int) -> None:
        if step in self.at:
            self._barrier.wait()  # arrived
            self._barrier.wait()  # released

    def arrived(self) -> None:
        self._barrier.wait()

    def release(self) -> None:
        self._barrier.wait()

    def abort(self) -> None:
        self._barrier.abort()


def run_agents(agents: Sequence[Callable[[], T]], *,
               on_error: Callable[[], None] = lambda: None) -> tuple[list[T | None], list[str]]:
    """Run every agent on its own thread; returns each one's result (None if it
    raised) and the errors, as "agent i: ExcType: message". `on_error` is called
    on the failing agent's thread (e.g. `Phases.abort`). Returns when all are done."""
    errors: list[str] = []
    lock = threading.Lock()

    def guarded(i: int, agent: Callable[[], T]) -> T | None:
        try:
            return agent()
        except Exception as exc:
            with lock:
                errors.append(f"agent {i}: {type(exc).__name__}: {exc}")
            on_error()
            return None

    with ThreadPoolExecutor(max(1, len(agents)), thread_name_prefix="chaos-agent") as pool:
        results = list(pool.map(guarded, range(len(agents)), agents))
    return results, errors


@dataclass(frozen=True, slots=True)
class FloodResult:
    sent: int      # events the service acknowledged
    accepted: int
    rejected: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.sent / self.seconds if self.seconds > 0 else 0.0


def flood_hints(endpoint: str, stop: threading.Event, *, name: str, sessions: int = 128,
                api_key: str | None = None, max_s: float = 60.0) -> FloodResult:
    """Stream hints to `endpoint` until `stop` is set (at most `max_s`): `sessions`
    sessions named `{name}-i` start (workflow and tenant "chaos-flood"), then
    batches of 4 x `sessions` events (an LLM call and a tool call per session)
    repeat as fast as the service acknowledges them, and the sessions end."""
    ids = [f"{name}-{i}" for i in range(sessions)]
    opening = pb.HintBatch(client_id=name, events=[
        pb.HintEvent(session_id=s, session_start=pb.SessionStart(tenant="chaos-flood", workflow="chaos-flood"))
        for s in ids])
    cycle = pb.HintBatch(client_id=name)
    for s in ids:
        cycle.events.add(session_id=s, llm_call_start=pb.LlmCallStart(step=1, node="flood"))
        cycle.events.add(session_id=s, llm_call_end=pb.LlmCallEnd(step=1, node="flood", prompt_tokens=100,
                                                                   output_tokens=10))
        cycle.events.add(session_id=s, tool_call_start=pb.ToolCallStart(tool="bash", call_id="c"))
        cycle.events.add(session_id=s, tool_call_end=pb.ToolCallEnd(tool="bash", call_id="c"))
    closing = pb.HintBatch(client_id=name, events=[pb.HintEvent(session_id=s, session_end=pb.SessionEnd())
                                                   for s in ids])
    deadline = time.monotonic() + max_s

    def batches():
        sequence = 1
        opening.sequence = sequence
        yield opening
        while not stop.is_set() and time.monotonic() < deadline:
            sequence += 1
            cycle.sequence = sequence  # serialised as it is taken: reusing the message is safe
            yield cycle
        closing.sequence = sequence + 1
        yield closing

    sent = accepted = rejected = 0
    t0 = time.perf_counter()
    with hint_channel(endpoint, api_key) as channel:
        for ack in hints_pb2_grpc.WorkflowHintsStub(channel).StreamHints(batches(), timeout=max_s + 60):
            sent += ack.accepted + ack.rejected
            accepted += ack.accepted
            rejected += ack.rejected
    return FloodResult(sent, accepted, rejected, time.perf_counter() - t0)


def flood_with_client(endpoint: str, stop: threading.Event, *, name: str, sessions: int = 64,
                      max_s: float = 60.0) -> tuple[int, ClientStats]:
    """Emit hints through a `HintClient` in a tight loop until `stop` (at most
    `max_s`), then end its sessions `{name}-i`; returns how many were emitted and
    the client's stats after a short close (what its full queue could not hold
    was dropped and counted: the caller never waits)."""
    client = HintClient(endpoint=endpoint)
    ids = [f"{name}-{i}" for i in range(sessions)]
    emitted, deadline = 0, time.monotonic() + max_s
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            for i in range(512):
                if i % 2:
                    client.llm_call_end(ids[i % sessions], step=1, prompt_tokens=100, output_tokens=10)
                else:
                    client.llm_call_start(ids[i % sessions], step=1, node="flood")
            emitted += 512
            time.sleep(0)  # let the other threads of this process run
        client.flush(10.0)
        for sid in ids:
            client.session_end(sid)
        emitted += len(ids)
    finally:
        client.close(5.0)
    return emitted, client.stats()
