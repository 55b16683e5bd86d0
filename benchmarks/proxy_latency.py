"""What `saga proxy` costs per request: latency added, time to first chunk, throughput.

Three processes on loopback: a fast scripted OpenAI-compatible upstream (the fast
tier's stand-in for `saga serve`, tests/fast/proxy/scripted_upstream.py, answering in
well under a millisecond so the proxy's own cost is what shows) with a real hint
service beside it; `saga proxy` in front of it sending hints there; and this client.
Requests are real agent steps: a tau-sized system prompt (~6 kB), a history that grows
with tool calls and results, the session inferred by the proxy on every call.

  1. sequential, non-streaming: each step is sent directly and through the proxy
     (alternating which goes first); latency median and p99 of each, and the added
     latency (proxy minus direct, paired per step);
  2. sequential, streaming: time to first chunk and to the end of the stream, same way;
  3. N concurrent agents (default 50) for a fixed time, directly and through the proxy,
     JSON and streaming answers: requests/s, errors, and the proxy's CPU per request;
  4. with `--record`: a second proxy, the same but for `--record FILE`, against the
     first, paired per step as in 1 and 2: what recording adds, median and p99.

The machine's load average is printed first: on a shared machine, latencies measure
the neighbours too; the proxy's CPU time per request is the steadier figure.

    .venv/bin/python -m benchmarks.proxy_latency
    .venv/bin/python -m benchmarks.proxy_latency --steps 400 --agents 50 --seconds 10
    .venv/bin/python -m benchmarks.proxy_latency --record
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from saga_server.serve_child import free_port

from benchmarks.harness.serve import ROOT
SYSTEM = {"role": "system", "content": "# Airline agent policy\n" + ("Follow the policy. Use the tools. " * 180)}
PLAN = "tools get_user_details | tools search_direct_flight,search_direct_flight | tools calculate | " \
       "tools book_reservation | answer"


def serve_upstream() -> int:
    """Child mode: the scripted upstream and a hint service; prints their addresses."""
    import importlib.util

    from saga_server.core import SessionTable
    from saga_server.proxy.server import BackgroundServer
    from saga_server.rpc import HintServer

    spec = importlib.util.spec_from_file_location(
        "scripted_upstream", ROOT / "tests" / "fast" / "proxy" / "scripted_upstream.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    hints = HintServer(SessionTable(max_sessions=100_000), "127.0.0.1:0").start()
    server = BackgroundServer(module.build_app(record=False)).start()
    print(f"READY {server.port} {hints.endpoint}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    server.stop()
    hints.close(grace=None)
    return 0


def agent_steps(agent: int, round_: int):
    """Yield request bodies of one agent conversation, advancing with the answers sent back."""
    messages = [SYSTEM, {"role": "user", "content": f"agent {agent} round {round_}: plan: {PLAN}"}]
    while True:
        answer = yield {"model": "m", "messages": messages}
        if answer is None:
            return
        messages = messages + [answer]
        calls = answer.get("tool_calls") or []
        if not calls:
            return
        for call in calls:
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": json.dumps({"result": "ok " * 60, "call": call["id"]})})


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def sequential(direct_url: str, proxy_url: str, steps: int, stream: bool) -> dict:
    direct, proxy = httpx.Client(base_url=direct_url, timeout=30), httpx.Client(base_url=proxy_url, timeout=30)
    d_lat, p_lat, d_first, p_first, added, added_first = [], [], [], [], [], []
    done = conversation = 0
    while done < steps:
        gen = agent_steps(10_000, conversation)
        conversation += 1
        body = next(gen)
        while body is not None and done < steps:
            body = dict(body, stream=True) if stream else body
            order = [("d", direct), ("p", proxy)] if done % 2 == 0 else [("p", proxy), ("d", direct)]
            result = {}
            for tag, client in order:
                t0 = time.perf_counter()
                if stream:
                    with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        chunks = r.iter_raw()
                        next(chunks)
                        first = time.perf_counter() - t0
                        raw = b"".join(chunks)
                    answer = _answer_from_sse(raw)
                else:
                    r = client.post("/v1/chat/completions", json=body)
                    first, answer = None, r.json()["choices"][0]["message"]
                result[tag] = (time.perf_counter() - t0, first, answer)
            d_lat.append(result["d"][0])
            p_lat.append(result["p"][0])
            added.append(result["p"][0] - result["d"][0])
            if stream:
                d_first.append(result["d"][1])
                p_first.append(result["p"][1])
                added_first.append(result["p"][1] - result["d"][1])
            done += 1
            try:
                body = gen.send(result["p"][2])
            except StopIteration:
                body = None
    direct.close()
    proxy.close()
    ms = lambda xs, q: 1000 * percentile(xs, q)  # noqa: E731
    out = {"steps": done, "direct_p50_ms": ms(d_lat, 0.5), "direct_p99_ms": ms(d_lat, 0.99),
           "proxy_p50_ms": ms(p_lat, 0.5), "proxy_p99_ms": ms(p_lat, 0.99),
           "added_p50_ms": 1000 * statistics.median(added), "added_p99_ms": ms(added, 0.99)}
    if stream:
        out.update({"direct_first_p50_ms": ms(d_first, 0.5), "proxy_first_p50_ms": ms(p_first, 0.5),
                    "direct_first_p99_ms": ms(d_first, 0.99), "proxy_first_p99_ms": ms(p_first, 0.99),
                    "added_first_p50_ms": 1000 * statistics.median(added_first),
                    "added_first_p99_ms": ms(added_first, 0.99)})
    return out


def _answer_from_sse(raw: bytes) -> dict:
    content, calls = [], {}
    for line in raw.split(b"\n"):
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        for choice in json.loads(line[6:]).get("choices", []):
            delta = choice["delta"]
            if delta.get("content"):
                content.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                slot["id"] = tc.get("id") or slot["id"]
                slot["function"]["name"] = tc.get("function", {}).get("name") or slot["function"]["name"]
                slot["function"]["arguments"] += tc.get("function", {}).get("arguments") or ""
    message = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


async def load(url: str, agents: int, seconds: float, stream: bool = False) -> dict:
    ok = errors = 0
    kinds: dict[str, int] = {}
    latencies = []
    stop = time.perf_counter() + seconds

    # One small client per agent (sharing one SSL context): httpx's pool does
    # O(connections^2) work per request, which would measure the client, not the proxy.
    ssl_context = httpx.create_ssl_context()
    clients = [httpx.AsyncClient(base_url=url, timeout=30, verify=ssl_context,
                                 limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))
               for _ in range(agents)]
    try:
        async def agent(n: int):
            nonlocal ok, errors
            client = clients[n]
            round_ = 0
            while time.perf_counter() < stop:
                gen = agent_steps(n, round_)
                round_ += 1
                body = next(gen)
                while body is not None and time.perf_counter() < stop:
                    t0 = time.perf_counter()
                    try:
                        if stream:
                            async with client.stream("POST", "/v1/chat/completions",
                                                     json=dict(body, stream=True)) as r:
                                r.raise_for_status()
                                answer = _answer_from_sse(b"".join([c async for c in r.aiter_raw()]))
                        else:
                            r = await client.post("/v1/chat/completions", json=body)
                            r.raise_for_status()
                            answer = r.json()["choices"][0]["message"]
                        ok += 1
                        latencies.append(time.perf_counter() - t0)
                    except Exception as exc:  # counted, reported by kind
                        errors += 1
                        kinds[type(exc).__name__] = kinds.get(type(exc).__name__, 0) + 1
                        break
                    try:
                        body = gen.send(answer)
                    except StopIteration:
                        body = None

        t0 = time.perf_counter()
        await asyncio.gather(*(agent(n) for n in range(agents)))
        elapsed = time.perf_counter() - t0
    finally:
        for client in clients:
            await client.aclose()
    return {"requests": ok, "errors": errors, "error_kinds": kinds, "rps": ok / elapsed,
            "p50_ms": 1000 * percentile(latencies, 0.5) if latencies else None,
            "p99_ms": 1000 * percentile(latencies, 0.99) if latencies else None}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def wait_ready(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready")


def record_phase(args, env: dict, direct_url: str, hint_endpoint: str, proxy_url: str) -> subprocess.Popen:
    """Phase 4: the same proxy with `--record` against `proxy_url`; returns its process."""
    path = Path(tempfile.mkdtemp()) / "recorded.jsonl"
    port = free_port()
    recording = subprocess.Popen([sys.executable, "-m", "saga_server.cli", "proxy", "--upstream", direct_url + "/v1",
                                  "--port", str(port), "--hint-endpoint", hint_endpoint, "--record", str(path)],
                                 env=env, stdout=subprocess.DEVNULL)
    record_url = f"http://127.0.0.1:{port}"
    wait_ready(record_url)
    sequential(proxy_url, record_url, 30, False)  # warm
    for stream in (False, True):
        r = sequential(proxy_url, record_url, args.steps, stream)
        first = (f"   first chunk p50 {r['added_first_p50_ms']:.3f} ms  p99 {r['added_first_p99_ms']:.3f} ms"
                 if stream else "")
        print(f"recording, {'streaming' if stream else 'non-streaming'}, {r['steps']} sequential steps "
              f"(proxy with --record minus without, paired per step):")
        print(f"  without p50 {r['direct_p50_ms']:.2f} ms  p99 {r['direct_p99_ms']:.2f} ms   "
              f"with p50 {r['proxy_p50_ms']:.2f} ms  p99 {r['proxy_p99_ms']:.2f} ms")
        print(f"  added   p50 {r['added_p50_ms']:.3f} ms  p99 {r['added_p99_ms']:.3f} ms{first}")
    recording.terminate()
    recording.wait(10)
    tasks = len(path.read_text().splitlines()) if path.exists() else 0
    print(f"  {tasks} sessions recorded to {path} ({path.stat().st_size if path.exists() else 0} bytes)")
    return recording


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="sequential requests per mode")
    p.add_argument("--agents", type=int, default=50, help="concurrent agents in the load phase")
    p.add_argument("--seconds", type=float, default=8.0, help="length of each load run")
    p.add_argument("--record", action="store_true",
                   help="also measure what saga proxy --record adds (a second proxy, recording, against the first)")
    p.add_argument("--serve-upstream", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_upstream:
        return serve_upstream()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "sdk"), str(ROOT / "server")]))
    upstream = subprocess.Popen([sys.executable, "-m", "benchmarks.proxy_latency", "--serve-upstream"],
                                stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    proxy = recording = None
    try:
        ready = upstream.stdout.readline().split()
        if not ready or ready[0] != "READY":
            raise RuntimeError("upstream did not start")
        direct_url, hint_endpoint = f"http://127.0.0.1:{ready[1]}", ready[2]
        port = free_port()
        proxy = subprocess.Popen([sys.executable, "-m", "saga_server.cli", "proxy", "--upstream", direct_url + "/v1",
                                  "--port", str(port), "--hint-endpoint", hint_endpoint], env=env,
                                 stdout=subprocess.DEVNULL)
        proxy_url = f"http://127.0.0.1:{port}"
        wait_ready(proxy_url)
        sequential(direct_url, proxy_url, 30, False)  # warm both paths
        print(f"saga proxy overhead on loopback ({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} "
              f"at start; the upstream answers in about a millisecond)")
        cpu0 = cpu_seconds(proxy.pid)
        r = sequential(direct_url, proxy_url, args.steps, False)
        r_cpu = 1000 * (cpu_seconds(proxy.pid) - cpu0) / r["steps"]
        print(f"non-streaming, {r['steps']} sequential agent steps:")
        print(f"  direct  p50 {r['direct_p50_ms']:.2f} ms  p99 {r['direct_p99_ms']:.2f} ms")
        print(f"  proxy   p50 {r['proxy_p50_ms']:.2f} ms  p99 {r['proxy_p99_ms']:.2f} ms")
        print(f"  added   p50 {r['added_p50_ms']:.2f} ms  p99 {r['added_p99_ms']:.2f} ms   (target: p50 <= 2 ms)   "
              f"proxy CPU {r_cpu:.2f} ms/request")
        cpu0 = cpu_seconds(proxy.pid)
        s = sequential(direct_url, proxy_url, args.steps, True)
        s_cpu = 1000 * (cpu_seconds(proxy.pid) - cpu0) / s["steps"]
        print(f"streaming, {s['steps']} sequential agent steps (time to first chunk / whole stream):")
        print(f"  direct  first p50 {s['direct_first_p50_ms']:.2f} ms  p99 {s['direct_first_p99_ms']:.2f} ms   "
              f"whole p50 {s['direct_p50_ms']:.2f} ms")
        print(f"  proxy   first p50 {s['proxy_first_p50_ms']:.2f} ms  p99 {s['proxy_first_p99_ms']:.2f} ms   "
              f"whole p50 {s['proxy_p50_ms']:.2f} ms")
        print(f"  added   first p50 {s['added_first_p50_ms']:.2f} ms  p99 {s['added_first_p99_ms']:.2f} ms   "
              f"whole p50 {s['added_p50_ms']:.2f} ms   proxy CPU {s_cpu:.2f} ms/request")
        print(f"{args.agents} concurrent agents, {args.seconds:.0f} s each:")
        for name, url, stream in (("direct", direct_url, False), ("proxy", proxy_url, False),
                                  ("direct", direct_url, True), ("proxy", proxy_url, True)):
            name = f"{name}, {'streaming' if stream else 'JSON'}"
            cpu0 = cpu_seconds(proxy.pid)
            lr = asyncio.run(load(url, args.agents, args.seconds, stream))
            note = f"  proxy CPU {1000 * (cpu_seconds(proxy.pid) - cpu0) / max(1, lr['requests']):.2f} ms/request" \
                if name.startswith("proxy") else ""
            print(f"  {name:<17}  {lr['rps']:.0f} req/s  {lr['requests']} ok  {lr['errors']} errors {lr['error_kinds'] or ''}"
                  f"  latency p50 {lr['p50_ms']:.1f} ms  p99 {lr['p99_ms']:.1f} ms{note}")
        if args.record:
            recording = record_phase(args, env, direct_url, hint_endpoint, proxy_url)
    finally:
        for proc in (recording, proxy, upstream):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
