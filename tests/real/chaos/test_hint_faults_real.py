"""The hint service dies or is flooded while agents run (chaos table rows 1 and 2).

Agents are `tests.support.loads.tool_agent` loops through `saga proxy` to the shared
real engine: a forced tool per step, temperature 0, so a loop gets the same answers
run after run. Each case runs its agents three times: once to warm the prefix cache
(its answers are the reference), once without the fault (the latency baseline), once
with it; every answer of the faulted run must equal the reference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from saga_sdk import HintReader, SagaConfig
from tests.support.chaos_table import ChaosRow, added_median, percentiles
from tests.support.faults import HintServiceProcess
from tests.support.http import REQUEST_TIMEOUT_S
from tests.support.loads import TOOL_PLAN, HintFlood, Phases, run_agents, tool_agent
from tests.support.proxies import stop_proxy

ROOT = Path(__file__).resolve().parents[3]
CUSTOMERS = [f"Customer {i}: I need a flight for my family." for i in range(4)]
DOWN = slice(1, 3)  # the steps the first case takes with the hint service dead


def lost_answers(reference: list, runs: list) -> int:
    """Steps whose answer is missing or differs from the reference run's."""
    lost = 0
    for ref, run in zip(reference, runs):
        got = run.answers if run is not None else []
        lost += sum(1 for i, answer in enumerate(ref.answers) if i >= len(got) or got[i] != answer)
    return lost


def checked_reference(results: list, errors: list, plan) -> list:
    """The warm-up run: it must have worked, each step calling its forced tool."""
    assert errors == []
    for run in results:
        assert [[name for name, _ in step] for step in run.answers] == [[tool] for tool in plan]
    return results


def latencies(results: list, steps: slice = slice(None)) -> list[float]:
    return [s for run in results if run is not None for s in run.latencies_s[steps]]


def example_under_saga_run(proxy_url: str) -> dict:
    """examples/openai_agent.py, unchanged, under `saga run --proxy`: its summary line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "SAGA_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "sdk"), str(ROOT / "server")])
    done = subprocess.run([sys.executable, "-m", "saga_server.cli", "run", "--proxy", proxy_url + "/v1", "--",
                           sys.executable, str(ROOT / "examples" / "openai_agent.py")],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=REQUEST_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"example exited {done.returncode}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def test_hint_service_killed_and_restarted_under_live_agents(saga_server, make_proxy, agent_client, server_after,
                                                             chaos_row):
    """The proxy's hint endpoint is a standalone `saga hints`. Four agents take one
    step with it up; it is SIGKILLed; they take two steps with it dead; it starts
    again on its port and they take the last. The added latency is that of the steps
    taken with the service dead. Then a real agent program runs across a second kill
    and restart, and a new session's hints reach the restarted service."""
    model = saga_server.model
    proxies = []
    with HintServiceProcess() as service:

        def run(faulted: bool):
            proxy = make_proxy(saga_server.openai_url, service.endpoint)
            proxies.append(proxy)
            phases = Phases(len(CUSTOMERS), at=[1, DOWN.stop], timeout_s=REQUEST_TIMEOUT_S)
            trouble: list[str] = []

            def conduct() -> None:
                try:
                    phases.arrived()  # every agent took step 0, hinted
                    if faulted:
                        service.kill()
                    phases.release()  # steps 1 and 2 with the service dead
                    phases.arrived()
                    if faulted:
                        service.start()  # back on its port (not while steps run: a start takes a core)
                    phases.release()
                except Exception as exc:
                    trouble.append(repr(exc))
                    phases.abort()

            conductor = threading.Thread(target=conduct, name="chaos-conductor")
            conductor.start()
            results, errors = run_agents([partial(tool_agent, agent_client(proxy.url), model, customer,
                                                  before_step=phases.before_step) for customer in CUSTOMERS],
                                         on_error=phases.abort)
            conductor.join(REQUEST_TIMEOUT_S)
            assert trouble == [] and not conductor.is_alive()
            return proxy, results, errors

        _, reference, errors = run(False)
        reference = checked_reference(reference, errors, TOOL_PLAN)
        _, baseline, errors = run(False)
        assert errors == [] and lost_answers(reference, baseline) == 0  # the engine itself is deterministic
        proxy, faulted, errors = run(True)
        lost = lost_answers(reference, faulted)
        assert errors == [] and lost == 0

        # A real agent program across a second kill: its first request goes out with
        # the service dead, and the service comes back while it runs.
        service.kill()
        requests = proxy.app.tracker.stats().requests
        with ThreadPoolExecutor(1) as pool:
            example = pool.submit(example_under_saga_run, proxy.url)
            deadline = time.monotonic() + REQUEST_TIMEOUT_S
            while proxy.app.tracker.stats().requests == requests and not example.done() \
                    and time.monotonic() < deadline:
                time.sleep(0.05)
            service.start()
            assert example.result() == {"llm_calls": 3, "tools": ["get_user_details", "search_flights"]}
        assert service.starts == 3 and service.running

        # After the restarts, a new session's hints reach the new process.
        before = set(proxy.app.tracker.session_ids())
        tool_agent(agent_client(proxy.url), model, "Customer after the restart: a flight to Lima.")
        assert proxy.app.hints.flush(60)
        (sid,) = set(proxy.app.tracker.session_ids()) - before
        with HintReader(service.endpoint, timeout=10) as reader:
            state = reader.session(sid)
            known = len(reader.sessions(1000))
        assert state.steps == len(TOOL_PLAN)
        expected = [(kind, tool) for tool in TOOL_PLAN for kind in ("tool_call_start", "tool_call_end")][:-1]
        assert [(h.kind, h.detail) for h in state.history if h.kind.startswith("tool")] == expected
        hint_stats = proxy.app.hints.stats()
        for server in proxies:  # while their hint service is up: their sessions' ends go out at once
            stop_proxy(server, 5.0)

    p50, p99 = percentiles(latencies(faulted, DOWN))
    chaos_row(ChaosRow(
        "hint service SIGKILLed and restarted on its port (4 agents x 4 tool steps; then examples/openai_agent.py "
        "under saga run across a second kill)",
        len(errors), added_median(latencies(baseline, DOWN), latencies(faulted, DOWN)) + " with it down", lost,
        server_after() + f"; restarted service has the new session ({state.steps} steps) and {known} in all",
        f"steps with the service down: p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms; "
        f"proxy hints {hint_stats.sent} sent, "
        f"{hint_stats.send_errors} send errors, {hint_stats.reconnects} reconnects"))


FLOOD_STREAMS, STREAM_RATE = 3, 30_000  # paced streams of pre-serialised batches, events/s each
FLOOD_CLIENTS, CLIENT_RATE = 1, 10_000  # HintClients (the SDK's path), events/s each
FLOOD_MIN_S = 10.0    # the flood lasts at least this long, and as long as the agents run


def test_hint_flood_while_agents_run(saga_server, make_proxy, agent_client, server_after, chaos_row):
    """Several clients, each in its own process, offer the engine's own hint service
    100,000 events/s while three agents run through the proxy (which hints the same
    service): the agents see no error and the same answers, every event the service
    took is accepted (what it could not take the clients shed, never waiting), and
    the engine stays bounded."""
    model, plan, customers = saga_server.model, TOOL_PLAN[:3], CUSTOMERS[:3]

    def run():
        proxy = make_proxy(saga_server.openai_url, saga_server.hint_addr)
        return run_agents([partial(tool_agent, agent_client(proxy.url), model, c, plan=plan) for c in customers])

    reference = checked_reference(*run(), plan)
    baseline, errors = run()
    assert errors == []

    tag = uuid.uuid4().hex[:8]
    with HintReader(saga_server.hint_addr, timeout=30) as reader:
        before_reply = reader.server_stats()
    before = before_reply.stats
    rss_before = saga_server.rss_bytes()
    flood = HintFlood(saga_server.hint_addr, name=f"chaos-flood-{tag}", streams=FLOOD_STREAMS,
                      stream_rate=STREAM_RATE, clients=FLOOD_CLIENTS, client_rate=CLIENT_RATE,
                      api_key=SagaConfig.from_env().api_key, max_s=REQUEST_TIMEOUT_S)
    with flood:
        started = time.monotonic()
        time.sleep(1.0)  # the flood is on before the agents' first step
        flooded, errors = run()
        time.sleep(max(0.0, FLOOD_MIN_S - (time.monotonic() - started)))
    rss_after = saga_server.rss_bytes()

    lost = lost_answers(reference, flooded)
    assert errors == [] and lost == 0
    assert all(r.rejected == 0 for r in flood.results)  # every hint the service took is accepted
    offered = sum(r.offered for r in flood.results) / max(r.offer_s for r in flood.results)
    accepted = sum(r.accepted for r in flood.results) / max(r.seconds for r in flood.results)
    with HintReader(saga_server.hint_addr, timeout=30) as reader:
        after_reply = reader.server_stats()
        assert reader.session(f"chaos-flood-{tag}-0-0").state == "ended"  # the flood's own sessions closed
    after = after_reply.stats
    streamed = sum(r.accepted for r in flood.streams)
    assert after["hints_events_accepted"] - before["hints_events_accepted"] >= streamed
    # the flood's own sessions do not stay: only the agents' (and a client flood's end dropped on the way)
    assert after["sessions_live"] - before["sessions_live"] <= len(customers) + 64 * FLOOD_CLIENTS
    drops = after_reply.engine.hints_dropped - before_reply.engine.hints_dropped
    memory = "n/a (no server process found on this host)"
    if rss_before is not None and rss_after is not None:
        grown = (rss_after - rss_before) / 2**20
        assert grown < 512, f"server tree grew {grown:.0f} MiB under the flood"
        memory = f"{grown:+.0f} MiB"

    seconds = max(r.offer_s for r in flood.results)
    chaos_row(ChaosRow(
        f"hint flood: {FLOOD_STREAMS} paced streams + {FLOOD_CLIENTS} HintClient, each in its own process, "
        f"for {seconds:.0f} s, 3 agents x 3 tool steps",
        len(errors), added_median(latencies(baseline), latencies(flooded)), lost, server_after(),
        f"offered {offered:,.0f} events/s (target 100,000), accepted {accepted:,.0f} events/s, 0 refused; "
        f"shed at the clients (the service pushed back; none waited): streams "
        f"{sum(r.shed for r in flood.streams):,} of {sum(r.offered for r in flood.streams):,}, HintClient "
        f"{sum(r.shed for r in flood.clients):,} of {sum(r.offered for r in flood.clients):,}; "
        f"engine hint queue dropped {drops:.0f}; server RSS {memory}"))
