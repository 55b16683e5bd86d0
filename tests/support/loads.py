"""Load for the chaos suite (`tests/real/chaos`): agents to run while faults happen,
and hint floods.

- `tool_agent`: a forced tool-calling chat loop through the real OpenAI SDK (one
  named tool per step, strict schema, one enum argument: at temperature 0 the same
  loop gets the same answers, run after run); `run_agents` runs several at once and
  collects their errors; `Phases` holds them at step boundaries while a fault is
  injected, so where a fault lands does not depend on timing.
- `flood_hints`: one client streaming pre-serialised hint batches to a hint
  service, as fast as it takes them or paced (shedding, and counting, what falls
  due while the stream is full); `flood_with_client`: hints through the SDK's
  `HintClient` (which drops, and counts, what its queue cannot hold);
  `HintFlood`: several of both, each in its own process, so that the flood is
  not bound by one interpreter's lock.
"""

from __future__ import annotations

import json
import multiprocessing
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence, TypeVar

from saga_proto import hints_pb2 as pb
from saga_sdk import HintClient
from saga_sdk.channel import hint_channel

__all__ = ["AgentRun", "FloodResult", "HintFlood", "Phases", "TOOL_PLAN", "flood_hints", "flood_with_client",
           "run_agents", "tool_agent", "tool_specs"]

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
    """What one flood client did. `offered`: the events it had to send (due by its
    pace, or emitted) over `offer_s` seconds; the service acknowledged `accepted` +
    `rejected` of them by the end, `seconds` after the offer began; `shed` is the
    rest, dropped at the client while the service could not take more (a stream
    not ready, a full `HintClient` queue): nothing ever waits."""

    offered: int
    accepted: int
    rejected: int
    offer_s: float
    seconds: float

    @property
    def shed(self) -> int:
        return self.offered - self.accepted - self.rejected

    @property
    def offered_rate(self) -> float:
        return self.offered / self.offer_s if self.offer_s > 0 else 0.0

    @property
    def accepted_rate(self) -> float:
        return self.accepted / self.seconds if self.seconds > 0 else 0.0


_STREAM_HINTS = "/saga.v1.WorkflowHints/StreamHints"


def _flood_batches(name: str, sessions: int) -> tuple[bytes, bytes, bytes, int]:
    """(opening, cycle, closing, events per cycle) of a flood, serialised once:
    `sessions` sessions named `{name}-i` start (workflow and tenant "chaos-flood"),
    each cycle is an LLM call and a tool call per session, and the sessions end."""
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
    return opening.SerializeToString(), cycle.SerializeToString(), closing.SerializeToString(), len(cycle.events)


def _numbered(batch: bytes, sequence: int) -> bytes:
    # Serialised messages concatenate as a merge (protobuf's wire format): the
    # batch's bytes need not be built again for each sequence number.
    return batch + pb.HintBatch(sequence=sequence).SerializeToString()


def flood_hints(endpoint: str, stop, *, name: str, sessions: int = 128, api_key: str | None = None,
                max_s: float = 60.0, rate: float | None = None) -> FloodResult:
    """Stream hints to `endpoint` until `stop` (a `threading` or `multiprocessing`
    Event) is set, at most `max_s`: the sessions of `_flood_batches` start, cycles
    of 4 x `sessions` events follow, and the sessions end. Unpaced (`rate` None),
    a cycle goes whenever the stream takes one, as fast as the service
    acknowledges. Paced, cycles fall due at `rate` events/s until `stop`; one
    that falls due while the stream takes nothing is shed (offered, never sent):
    the client never catches up. Batches are serialised once, up front."""
    opening, cycle, closing, per_cycle = _flood_batches(name, sessions)
    every = per_cycle / rate if rate else 0.0
    began = time.monotonic()  # again once the opening batch went
    deadline, stopped = began + max_s, []
    sent = 0

    def batches():
        nonlocal sent, began
        yield _numbered(opening, 1)
        began = time.monotonic()
        upcoming = 0  # the next cycle of the schedule (paced)
        while not stop.is_set() and time.monotonic() < deadline:
            if every:
                now = time.monotonic()
                due = int((now - began) / every)
                if due < upcoming:
                    time.sleep(min(0.05, began + upcoming * every - now))
                    continue  # look at `stop` again
                upcoming = due + 1  # the cycles between the last one sent and this one are shed
            sent += 1
            yield _numbered(cycle, sent + 1)
        stopped.append(time.monotonic())
        yield _numbered(closing, sent + 2)

    # The offer ends when `stop` is set, also while the stream is full (when the
    # batches above do not see it at once).
    watch = threading.Thread(target=lambda: stop.wait(max_s) and stopped.append(time.monotonic()),
                             name=f"{name}-stop", daemon=True)
    watch.start()
    accepted = rejected = 0
    with hint_channel(endpoint, api_key) as channel:
        stream = channel.stream_stream(_STREAM_HINTS, request_serializer=None,
                                       response_deserializer=pb.HintAck.FromString)
        for ack in stream(batches(), timeout=max_s + 60):
            accepted += ack.accepted
            rejected += ack.rejected
    if stop.is_set():
        watch.join(1.0)
    offer_end = min([*stopped, deadline])
    cycles = max(sent, int((offer_end - began) / every) + 1) if every else sent
    # the opening and closing batches always go: offered too
    return FloodResult(cycles * per_cycle + 2 * sessions, accepted, rejected, max(0.0, offer_end - began),
                       time.monotonic() - began)


def flood_with_client(endpoint: str, stop, *, name: str, sessions: int = 64, max_s: float = 60.0,
                      rate: float | None = None) -> FloodResult:
    """Emit hints through a `HintClient` until `stop` (at most `max_s`), in bursts of
    512 (an LLM call's start and end per session in turn), flat out or at `rate`
    events/s; then end its sessions `{name}-i` and close the client briefly. What
    the client did not deliver (its queue was full, or it closed first) is `shed`,
    and the client counted it: the caller never waits. `rejected` is what the
    service refused."""
    client = HintClient(endpoint=endpoint)
    ids = [f"{name}-{i}" for i in range(sessions)]
    emitted, burst = 0, 512
    start = time.monotonic()
    deadline = start + max_s
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            wait = start + emitted / rate - time.monotonic() if rate else 0.0
            if wait > 0:
                time.sleep(min(0.01, wait))
                continue
            for i in range(burst):
                if i % 2:
                    client.llm_call_end(ids[i % sessions], step=1, prompt_tokens=100, output_tokens=10)
                else:
                    client.llm_call_start(ids[i % sessions], step=1, node="flood")
            emitted += burst
            time.sleep(0)  # let the client's sender run
        offer_s = time.monotonic() - start
        client.flush(10.0)
        for sid in ids:
            client.session_end(sid)
        emitted += len(ids)
    finally:
        client.close(5.0)
    stats = client.stats()
    return FloodResult(emitted, stats.sent - stats.rejected, stats.rejected, offer_s, time.monotonic() - start)


def _flood_process(index: int, kind: str, kwargs: dict, stop, go, results) -> None:
    """A flood client's process: says it is up, waits for `go`, floods until `stop`,
    and puts (index, its FloodResult or what went wrong) on `results`."""
    results.put((index, "up"))
    go.wait()
    try:
        flood = flood_hints if kind == "stream" else flood_with_client
        results.put((index, flood(stop=stop, **kwargs)))
    except BaseException as exc:  # the test reports it; the process must still answer
        results.put((index, f"{type(exc).__name__}: {exc}"))


class HintFlood:
    """Hint flood clients, each in a process of its own (spawned: no GIL shared with
    the test, its agents or one another): `streams` paced `flood_hints` streams of
    `stream_rate` events/s each, and `clients` `flood_with_client` HintClients of
    `client_rate` each (None: unpaced). Sessions are named `{name}-{i}-{j}`
    (streams) and `{name}-c{i}-{j}` (clients).

        with HintFlood(endpoint, name="f", streams=3, stream_rate=30_000) as flood:
            ...                  # every client is flooding
        flood.results            # one FloodResult per client, streams first

    Entering returns once every process runs and has been told to go; leaving
    stops them and raises if any failed or never answered."""

    def __init__(self, endpoint: str, *, name: str, streams: int = 3, stream_rate: float | None = 30_000,
                 clients: int = 1, client_rate: float | None = 10_000, api_key: str | None = None,
                 max_s: float = 120.0, ready_timeout_s: float = 120.0) -> None:
        self._plan = ([("stream", dict(endpoint=endpoint, name=f"{name}-{i}", api_key=api_key, max_s=max_s,
                                       rate=stream_rate)) for i in range(streams)]
                      + [("client", dict(endpoint=endpoint, name=f"{name}-c{i}", max_s=max_s, rate=client_rate))
                         for i in range(clients)])
        self._max_s = max_s
        self._ready_timeout_s = ready_timeout_s
        self.results: list[FloodResult] = []

    @property
    def streams(self) -> list[FloodResult]:
        return [r for (kind, _), r in zip(self._plan, self.results) if kind == "stream"]

    @property
    def clients(self) -> list[FloodResult]:
        return [r for (kind, _), r in zip(self._plan, self.results) if kind == "client"]

    def __enter__(self) -> "HintFlood":
        ctx = multiprocessing.get_context("spawn")
        self._stop, go, self._answers = ctx.Event(), ctx.Event(), ctx.Queue()
        self._procs = [ctx.Process(target=_flood_process, args=(i, kind, kwargs, self._stop, go, self._answers),
                                   name=f"hint-flood-{i}", daemon=True)
                       for i, (kind, kwargs) in enumerate(self._plan)]
        for proc in self._procs:
            proc.start()
        try:
            if len(self._collect(self._ready_timeout_s)) < len(self._procs):
                raise RuntimeError("flood clients did not start")
        except BaseException:
            self._stop.set()
            go.set()
            self._reap(10.0)
            raise
        go.set()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        try:
            got = self._collect(self._max_s + 90)
        finally:
            self._reap(30.0)
        failed = {i: got.get(i, "no answer") for i in range(len(self._procs))
                  if not isinstance(got.get(i), FloodResult)}
        if failed and exc == (None, None, None):
            raise RuntimeError(f"flood clients failed: {failed}")
        self.results = [] if failed else [got[i] for i in range(len(self._procs))]

    def _collect(self, timeout_s: float) -> dict[int, object]:
        """One answer per process, until `timeout_s` or until no process is left to answer."""
        got: dict[int, object] = {}
        deadline = time.monotonic() + timeout_s
        while len(got) < len(self._procs) and time.monotonic() < deadline:
            try:
                index, answer = self._answers.get(timeout=0.5)
            except queue.Empty:
                if not any(proc.is_alive() for proc in self._procs):
                    break
                continue
            got[index] = answer
        return got

    def _reap(self, timeout_s: float) -> None:
        for proc in self._procs:
            proc.join(timeout_s)
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
