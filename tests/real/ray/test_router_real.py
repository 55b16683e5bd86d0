"""Two real vLLM replicas behind Ray Serve with the SAGA router (see conftest)."""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path


from saga_sdk import HintClient
from saga_server.core.routing import home_replica
from tests.support.chaos_table import ChaosRow
from tests.support.processes import listening_pid

LONG = " ".join(f"Rule {i}: keep answers short and precise." for i in range(60))  # ~600 tokens


def _cached(resp: dict) -> int:
    details = (resp.get("usage") or {}).get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def _turns(cluster, sid: str, turns: int, *, tool_s: float = 0.2, hints: HintClient | None = None,
           retries: int = 0, errors: list | None = None) -> list[dict]:
    """A small agent loop: LLM call, tool result appended, next call on the grown prompt."""
    messages = [{"role": "system", "content": f"Session {sid}. {LONG}"},
                {"role": "user", "content": "List three prime numbers."}]
    out = []
    for turn in range(turns):
        for attempt in range(retries + 1):
            try:
                resp = cluster.chat(messages, session_id=sid, max_tokens=16, temperature=0)
                break
            except (urllib.error.URLError, OSError) as exc:
                if errors is not None:
                    errors.append(repr(exc))
                if attempt == retries:
                    raise
                time.sleep(3)
        out.append(resp)
        messages.append({"role": "assistant", "content": resp["choices"][0]["message"]["content"] or "ok"})
        if hints:
            hints.tool_call_start(sid, "lookup", call_id=f"c{turn}")
        time.sleep(tool_s)
        if hints:
            hints.tool_call_end(sid, "lookup", call_id=f"c{turn}")
        messages.append({"role": "user", "content": f"Tool result {turn}: 2, 3, 5. Continue."})
    return out


def _peer_tokens(cluster) -> dict[str, float]:
    from saga_sdk import HintReader

    out = {}
    for rid, addr in cluster.replica_hints().items():
        with HintReader(addr, timeout=5) as reader:
            out[rid] = reader.stats().get("afs_peer_tokens", 0.0)
    return out


def _holders(resident: dict[str, set[str]], sid: str) -> set[str]:
    """Replicas holding the session's KV (served under its id or re-prefilled for a move)."""
    return {rid for rid, ss in resident.items() if sid in ss or any(s.endswith(f":{sid}") for s in ss)}


def _expected_holder(sid: str, replicas: list[str], steals: list) -> set[str]:
    moves = [(src, dst) for s, src, dst, *_ in steals if s == sid]
    return {moves[-1][1]} if moves else {home_replica(sid, replicas)}


def _first_call_then_a_tool(cluster, hints: HintClient, sid: str, home: str) -> tuple[list[dict], dict]:
    """The session's first call (on its home replica), then a tool call it stays inside,
    long enough for the replicas' reports (every 0.5 s) to show it there."""
    messages = [{"role": "system", "content": f"Session {sid}. {LONG}"},
                {"role": "user", "content": "List three prime numbers."}]
    first = cluster.chat(messages, session_id=sid, max_tokens=16, temperature=0)
    deadline = time.monotonic() + 30  # a replica busy starting may miss one read's 2 s timeout
    while sid not in cluster.resident().get(home, ()) and time.monotonic() < deadline:
        time.sleep(1)
    assert sid in cluster.resident()[home]
    hints.tool_call_start(sid, "run_tests", call_id="t1")
    hints.flush(5)
    time.sleep(2.0)
    return messages, first


def _restart_ingress(cluster, timeout_s: float = 300) -> None:
    """Kill the ingress replica (its SAGA router with it) and wait until Serve's new
    one routes and its router has learned homes from the replicas' reports."""
    import ray
    from ray.util import list_named_actors

    ingress = [a for a in list_named_actors(all_namespaces=True) if "#SagaIngress#" in a["name"]]
    assert len(ingress) == 1, ingress
    killed_at = time.time()
    ray.kill(ray.get_actor(ingress[0]["name"], namespace=ingress[0]["namespace"]), no_restart=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            cluster.chat([{"role": "user", "content": "ping"}], max_tokens=1, timeout=30)
        except Exception:
            pass
        stats = cluster.router_stats()
        if stats.get("at", 0) > killed_at and stats.get("routing", {}).get("learned", 0) >= 1:
            return
        time.sleep(1)
    raise TimeoutError("the restarted router never learned homes from the replicas' reports")


def test_sessions_stick_to_one_replica_and_follow_ups_hit_the_cache(ray_cluster):
    hints = HintClient(endpoint=ray_cluster.hint_addr)
    replicas = sorted(ray_cluster.replica_hints())
    assert len(replicas) == 2
    # Three sessions homed on each replica: random ids alone put all six on one
    # replica once in 32 runs, and then the test would prove nothing about the other.
    tag = uuid.uuid4().hex[:8]
    candidates = [f"stick-{tag}-{i}" for i in range(200)]
    sids = [s for r in replicas for s in [c for c in candidates if home_replica(c, replicas) == r][:3]]
    assert len(sids) == 6
    results: dict[str, list[dict]] = {}

    def run(sid):
        hints.session_start(sid, tenant=f"tenant-{sid[-1]}")
        results[sid] = _turns(ray_cluster, sid, 3, hints=hints)

    threads = [threading.Thread(target=run, args=(s,)) for s in sids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    hints.flush(5)
    try:
        assert set(results) == set(sids)
        cold = [(sid, i) for sid, rs in results.items() for i, r in enumerate(rs) if i > 0 and _cached(r) == 0]
        assert cold == [], f"cold follow-ups: {cold}"
        # Each session's KV sits on its deterministic home, or, if the router moved it
        # (the loaded replica may shed a session in a tool call), on the move's target
        # and no longer on the source (re-prefill and release finish behind the move).
        deadline = time.monotonic() + 20
        while True:
            time.sleep(1.0)
            steals = ray_cluster.router_stats().get("steals", [])
            resident = ray_cluster.resident()
            wrong = {sid: where for sid in sids
                     if (where := _holders(resident, sid)) != _expected_holder(sid, list(resident), steals)}
            if not wrong or time.monotonic() > deadline:
                break
        assert wrong == {}, f"sessions not where their home or last move put them: {wrong}; steals {steals}"
        assert set(resident) == set(replicas), resident
        assert all(any(_holders(resident, sid) == {rid} for sid in sids) for rid in replicas), \
            f"one replica holds none of the sessions: {resident}; steals {steals}"
        # cluster-wide fair share: each engine hears what the other served these tenants
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not all(v > 0 for v in _peer_tokens(ray_cluster).values()):
            time.sleep(0.5)
        assert all(v > 0 for v in _peer_tokens(ray_cluster).values()), _peer_tokens(ray_cluster)
    finally:
        for sid in sids:
            hints.session_end(sid)
        hints.flush(5)
        hints.close()


def test_overloaded_replica_sheds_a_session_in_a_tool_call_it_resumes_warm_and_a_restarted_router_keeps_it(
        ray_cluster):
    replicas = sorted(ray_cluster.replica_hints())
    assert len(replicas) == 2
    hints = HintClient(endpoint=ray_cluster.hint_addr)
    tag = uuid.uuid4().hex[:6]
    victim = next(f"victim-{tag}-{i}" for i in range(100) if home_replica(f"victim-{tag}-{i}", replicas) == replicas[0])
    busy = [s for s in (f"busy-{tag}-{i}" for i in range(200)) if home_replica(s, replicas) == replicas[0]][:8]
    try:
        for s in [victim, *busy]:
            hints.session_start(s)
        messages, first = _first_call_then_a_tool(ray_cluster, hints, victim, replicas[0])
        # overload its home: long generations from sessions homed on the same replica
        threads = [threading.Thread(target=ray_cluster.chat,
                                    args=([{"role": "user", "content": f"Write a long story {s}."}],),
                                    kwargs={"session_id": s, "max_tokens": 120, "temperature": 0})
                   for s in busy]
        for t in threads:
            t.start()
            time.sleep(0.3)
        for t in threads:
            t.join()
        time.sleep(3.0)  # the speculative re-prefill on the target runs behind the tool
        hints.tool_call_end(victim, "run_tests", call_id="t1")
        hints.flush(5)
        messages += [{"role": "assistant", "content": first["choices"][0]["message"]["content"] or "ok"},
                     {"role": "user", "content": "Tool result: all tests pass. Continue."}]
        resumed = ray_cluster.chat(messages, session_id=victim, max_tokens=16, temperature=0)
        time.sleep(1.0)
        resident = ray_cluster.resident()
        assert victim in resident[replicas[1]], "the victim did not move to the idle replica"
        # its whole previous prompt (unique to it) was in the target's cache: moved there
        assert _cached(resumed) >= first["usage"]["prompt_tokens"] // 32 * 32 - 32
        moves = ray_cluster.router_stats()["moves"]
        if ray_cluster.kv_transfer == "nixl":  # pulled from the source, not recomputed
            assert moves.get("pulls_ok", 0) >= 1 and moves.get("pull_fallbacks", 0) == 0, moves
            assert moves["pulled_tokens"] >= first["usage"]["prompt_tokens"], moves
        # the old copy was released on the source (its holds dropped)
        from saga_sdk import HintReader

        with HintReader(ray_cluster.replica_hints()[replicas[0]], timeout=5) as reader:
            released = reader.server_stats().engine.counts["released"].by_label
            assert released.get("moved", 0) > 0
        if ray_cluster.metrics_url:  # operators see the move and both replicas on /metrics
            with urllib.request.urlopen(ray_cluster.metrics_url, timeout=30) as resp:
                text = resp.read().decode()
            assert f'saga_replica_up{{replica="{replicas[0]}"}} 1.0' in text
            assert f'saga_replica_up{{replica="{replicas[1]}"}} 1.0' in text
            steals = [ln for ln in text.splitlines() if ln.startswith('saga_router_steals_total{in_tool="true"}')]
            assert steals and float(steals[0].split()[-1]) >= 1, steals
            if ray_cluster.kv_transfer == "nixl":
                pulls = [ln for ln in text.splitlines() if ln.startswith('saga_router_kv_pulls_total{result="ok"}')]
                assert pulls and float(pulls[0].split()[-1]) >= 1, pulls
        # A restarted router rebuilds its homes from the replicas' reports: the moved
        # session (hash home: replicas[0]) still goes where its KV is, replicas[1].
        _restart_ingress(ray_cluster)
        messages += [{"role": "assistant", "content": resumed["choices"][0]["message"]["content"] or "ok"},
                     {"role": "user", "content": "Tool result: done. Continue."}]
        again = ray_cluster.chat(messages, session_id=victim, max_tokens=16, temperature=0)
        time.sleep(1.0)
        resident = ray_cluster.resident()
        assert victim in resident[replicas[1]] and victim not in resident[replicas[0]], resident
        assert _cached(again) >= resumed["usage"]["prompt_tokens"] // 32 * 32 - 32
    finally:
        for s in [victim, *busy]:
            hints.session_end(s)
        hints.flush(5)
        hints.close()


def test_killing_a_replica_loses_no_completed_work_and_agent_runs_finish(ray_cluster, chaos_row):
    import ray

    hints = HintClient(endpoint=ray_cluster.hint_addr)
    sids = [f"fail-{uuid.uuid4().hex[:8]}-{i}" for i in range(4)]
    results: dict[str, list[dict]] = {}
    errors: list[str] = []

    def run(sid):
        results[sid] = _turns(ray_cluster, sid, 5, tool_s=1.0, retries=5, errors=errors)

    threads = [threading.Thread(target=run, args=(s,)) for s in sids]
    for t in threads:
        t.start()
    time.sleep(4.0)  # every session has completed work by now
    replicas = sorted(ray_cluster.replica_hints())
    assert len(replicas) == 2
    name = f"SERVE_REPLICA::saga#SagaLLMServer:{ray_cluster.model}#{replicas[0]}"
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)  # a crash: Serve replaces it
    for t in threads:
        t.join(600)
    hints.close()
    assert set(results) == set(sids), f"unfinished: {set(sids) - set(results)}; errors {errors}"
    assert all(len(rs) == 5 and all(r["choices"][0]["message"] is not None for r in rs) for rs in results.values())
    # requests in flight on the dead replica were retried by the ingress: no agent saw an error
    assert errors == []
    chaos_row(ChaosRow("Ray replica killed under load (4 agents x 5 turns, 2 replicas)", len(errors), "n/a", 0,
                       "Serve replaced the replica; every run finished", "tests/real/ray/test_router_real.py"))


def _engine_core_pid(cluster, replica: str) -> int:
    """The pid of the replica's vLLM EngineCore: the process whose hint service
    listens at the address the replica registered."""
    pid = listening_pid(int(cluster.replica_hints()[replica].rsplit(":", 1)[1]))
    assert pid is not None and b"EngineCore" in Path(f"/proc/{pid}/cmdline").read_bytes(), pid
    return pid


def test_a_move_whose_source_engine_dies_falls_back_and_the_agent_sees_no_error(ray_cluster, chaos_row):
    """The source's engine freezes with requests in flight (so the router sees it loaded
    and steals the session in its tool call), then dies while the move waits on it."""
    ray_cluster.wait_for_replicas(2, timeout_s=600)  # the one the last test killed may still be starting
    replicas = ray_cluster.live_replicas()
    assert len(replicas) == 2, replicas
    hints = HintClient(endpoint=ray_cluster.hint_addr)
    tag = uuid.uuid4().hex[:6]
    victim = next(f"orphan-{tag}-{i}" for i in range(100) if home_replica(f"orphan-{tag}-{i}", replicas) == replicas[0])
    busy = [s for s in (f"stuck-{tag}-{i}" for i in range(200)) if home_replica(s, replicas) == replicas[0]][:6]
    moves_before = dict(ray_cluster.router_stats().get("moves", {}))
    engine = None
    try:
        hints.session_start(victim)
        messages, first = _first_call_then_a_tool(ray_cluster, hints, victim, replicas[0])
        engine = _engine_core_pid(ray_cluster, replicas[0])
        os.kill(engine, signal.SIGSTOP)  # frozen: its requests stay in flight
        stuck = []

        def send(sid):
            try:
                stuck.append(ray_cluster.chat([{"role": "user", "content": f"Write a story {sid}."}],
                                              session_id=sid, max_tokens=8, temperature=0, timeout=300))
            except Exception as exc:  # requests of the dead engine: not the agent under test
                stuck.append(repr(exc))

        threads = [threading.Thread(target=send, args=(s,), daemon=True) for s in busy]
        for t in threads:
            t.start()
        until = time.monotonic() + 60
        while not any(s[0] == victim for s in ray_cluster.router_stats().get("steals", [])):
            assert time.monotonic() < until, "the router never stole the session from the frozen replica"
            time.sleep(0.5)
        os.kill(engine, signal.SIGKILL)  # the move's source dies under it
        engine = None
        time.sleep(3.0)
        hints.tool_call_end(victim, "run_tests", call_id="t1")
        hints.flush(5)
        messages += [{"role": "assistant", "content": first["choices"][0]["message"]["content"] or "ok"},
                     {"role": "user", "content": "Tool result: all tests pass. Continue."}]
        started = time.monotonic()
        resumed = ray_cluster.chat(messages, session_id=victim, max_tokens=16, temperature=0)
        took = time.monotonic() - started
        assert resumed["choices"][0]["message"] is not None  # the agent saw no error
        moves = ray_cluster.router_stats()["moves"]
        delta = {k: moves.get(k, 0) - moves_before.get(k, 0) for k in moves}
        print(f"move with its source killed: {delta}; resumed in {took:.1f} s, "
              f"cached {_cached(resumed)} of {resumed['usage']['prompt_tokens']}")
        assert delta.get("pulls_ok", 0) == 0, delta  # nothing was read from the dead engine
        assert delta.get("pull_fallbacks", 0) >= 1 and delta.get("reprefills_ok", 0) >= 1, delta
        assert victim in ray_cluster.resident()[replicas[1]]
        assert _cached(resumed) >= first["usage"]["prompt_tokens"] // 32 * 32 - 32  # re-prefilled there
        chaos_row(ChaosRow("source engine killed during a KV move (session stolen in its tool call)", 0, "n/a", 0,
                           "the move re-prefilled on the target; the session resumed warm there",
                           f"resumed in {took:.1f} s, {_cached(resumed)} tokens cached"))
    finally:
        if engine is not None:
            os.kill(engine, signal.SIGKILL)
        hints.session_end(victim)
        hints.flush(5)
        hints.close()
