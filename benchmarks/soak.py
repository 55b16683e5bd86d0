"""Soak: days of session churn in minutes, and every process's memory and tables over it.

    python -m benchmarks.soak [--sessions 1000000] [--engine-sessions 20000]
                              [--plot soak.png] [--json soak.json]

Two phases, each against real processes:

1. **Hint service and the proxy's session tracker.** A `SessionTracker` (the proxy's,
   in a child process of its own, on a simulated clock that moves 0.5 s per session:
   a million sessions are about six days) infers sessions from chat requests and
   sends its hints with the SDK's `HintClient` to a `saga hints` process, as `saga
   proxy` does. Beside it an agent key of a capped tenant opens sessions past its
   `max_sessions`, and malformed hints go straight to the service. The sessions mix:
   ones that end by a last-request marker, ones that go quiet after their answer
   (the tracker ends them at their idle timeout), ones whose stream is cut
   mid-answer, ones that ask for a tool and never come back, and unparseable bodies.
2. **One `saga serve`** (`--engine-sessions` sessions of real requests, tiny prompts):
   sessions named by a header that end with a last-request marker, ones that never
   end, streams cut mid-answer, tool calls hinted and never ended, and malformed
   `vllm_xargs` and headers.

Every `--every` sessions it samples each process's RSS (`/proc`) and the size of
every table it keeps (the tracker's own, the hint service's and the engine's from
GetStats: the core's sessions and graphs, the engine's holds, admission, request
maps, prefetcher). It prints one table per process, the slope of RSS and of each
table after warm-up (the first third), the sessions and requests driven, errors (a
request that failed, a hint the client dropped) and lost answers (a request that
was not cut and did not get its whole answer), and plots RSS and tables over time.

The bounds it runs against are the defaults, except those a run of minutes cannot
reach (`--hint-max-sessions`, `--engine-max-sessions`, the engine's idle timeout):
a bound is shown by reaching it. `tests/real/chaos/test_soak_real.py` is a short
version that fails when a table grows past its bound after warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from saga_server.serve_child import free_port

from benchmarks.harness.plots import png
from benchmarks.harness.serve import ROOT, start_server, tree_rss_bytes

MIB = 1 << 20
SYSTEM = "You are a coding agent. Tools: run_tests, read_file."
KINDS = ("marked_final", "quiet", "cut", "tool_forever", "unparsed")
WEIGHTS = (0.3, 0.35, 0.1, 0.2, 0.05)


@dataclass
class Sample:
    """One process at one moment: sessions driven so far, its RSS, its tables."""

    process: str
    driven: int
    rss_mib: float
    tables: dict[str, float]


@dataclass
class Run:
    samples: list[Sample] = field(default_factory=list)
    sessions: dict[str, int] = field(default_factory=dict)  # phase -> sessions driven
    requests: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    lost_answers: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)  # refusals that were the point (capped tenant)


def rss_mib(pid: int) -> float:
    return tree_rss_bytes(pid) / MIB


def hint_tables(endpoint: str, api_key: str | None = None) -> dict[str, float]:
    """The hint service's (or an engine's) tables, from GetStats."""
    from saga_sdk import HintReader

    with HintReader(endpoint, api_key=api_key, timeout=10.0) as reader:
        stats = reader.server_stats()
    out = {k: v for k, v in stats.stats.items() if k in ("aeg_sessions", "aeg_workflows", "sessions_live",
                                                  "open_tool_calls", "afs_tenants_active")}
    if stats.HasField("engine"):
        out.update({f"table_{k}": v for k, v in stats.engine.tables.items()})
        out["held_sessions"] = stats.engine.held_sessions
    return out


# -- phase 1: the proxy's tracker and the hint service --------------------------------------


class SimClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def chat(session: int, turn: int, tools: bool) -> dict:
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Fix issue {session}."}]
    for k in range(turn):
        messages.append({"role": "assistant", "content": None,
                         "tool_calls": [{"id": f"c{session}.{k}", "type": "function",
                                         "function": {"name": "run_tests", "arguments": "{}"}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{session}.{k}", "content": "1 failed"})
    return {"model": "m", "messages": messages, **({"tools": [{"type": "function", "function": {
        "name": "run_tests", "parameters": {"type": "object", "properties": {}}}}]} if tools else {})}


def answer(session: int, turn: int, tool: bool) -> dict:
    if tool:
        return {"role": "assistant", "content": None,
                "tool_calls": [{"id": f"c{session}.{turn}", "type": "function",
                                "function": {"name": "run_tests", "arguments": "{}"}}]}
    return {"role": "assistant", "content": f"Done with {session}."}


def drive_tracker(n: int, endpoint: str, admin_key: str, every: int, seed: int, out) -> None:
    """Child process: `n` sessions through a tracker, its hints to `endpoint`; puts
    ("sample", driven, rss, tables) tuples and a final ("done", counts) on `out`."""
    from saga_sdk import HintClient
    from saga_server.proxy import SessionTracker
    from saga_server.proxy.hints import send_hint

    rng = random.Random(seed)
    clock = SimClock()
    tracker = SessionTracker(clock=clock)
    client = HintClient(endpoint=endpoint, api_key=admin_key, queue_size=200_000)
    counts = {"requests": 0, "lost": 0}

    def send(hints) -> None:
        for h in hints:
            send_hint(client, h.event)

    for i in range(n):
        kind = rng.choices(KINDS, WEIGHTS)[0]
        clock.t += 0.5
        if kind == "unparsed":
            turn, hints = tracker.begin({"model": "m", "messages": "not a list"})
            send(hints)
            send(tracker.finish(turn, [answer(i, 0, False)], {"prompt_tokens": 5, "completion_tokens": 1}))
            counts["requests"] += 1
        else:
            turns = 1 if kind in ("cut", "tool_forever") else 2
            headers = {"x-session-id": f"soak-{seed}-{i}"} if kind == "marked_final" else {}
            for k in range(turns):
                last = k == turns - 1
                if kind == "marked_final" and last:
                    headers = {**headers, "x-dynamo-session-final": "true"}
                turn, hints = tracker.begin(chat(i, k, True), headers)
                send(hints)
                counts["requests"] += 1
                if kind == "cut":
                    send(tracker.fail(turn, abandoned=True))
                else:
                    tool = not last or kind == "tool_forever"
                    send(tracker.finish(turn, [answer(i, k, tool)], {"prompt_tokens": 50 + 20 * k,
                                                                    "completion_tokens": 5}))
        if i % 64 == 0:
            send(tracker.expire())
        if (i + 1) % every == 0:
            if not client.flush(60):
                counts["lost"] += 1
            out.put(("sample", i + 1, rss_mib(os.getpid()), dict(tracker.table_sizes())))
    client.flush(60)
    stats = client.stats()
    counts["dropped"] = dropped(stats)
    counts["sent"], counts["rejected"] = stats.sent, stats.rejected
    client.close()
    out.put(("done", counts))


def capped_tenant(endpoint: str, key: str, n: int) -> tuple[int, int]:
    """Sessions of a tenant capped at its `max_sessions`, never ended: (sent, refused)."""
    from saga_sdk import HintClient, HintReader

    with HintClient(endpoint=endpoint, api_key=key) as client:
        for i in range(n):
            client.session_start(f"capped-{i}")
        client.flush(30)
        sent = client.stats().sent
    with HintReader(endpoint, api_key=key) as reader:
        live = len(reader.sessions(limit=10_000))
    return sent, sent - live


def dropped(stats) -> int:
    """Hints a `HintClient` dropped instead of sending (its `ClientStats`)."""
    return stats.dropped_full + stats.dropped_stale + stats.dropped_failed


def malformed_hints(endpoint: str, key: str, n: int) -> tuple[int, int]:
    """Hints the service must refuse (unknown sessions, ends of tools never started):
    (refused, dropped)."""
    from saga_sdk import HintClient

    with HintClient(endpoint=endpoint, api_key=key) as client:
        for i in range(n):
            client.tool_call_end(f"nobody-{i}", "run_tests", call_id="x")
            client.llm_call_end(f"nobody-{i}", prompt_tokens=-5)
            client.session_end(f"never-started-{i}")
        client.flush(30)
        stats = client.stats()  # a batch the service refuses as malformed is dropped as failed: refused
        return stats.rejected + stats.dropped_failed, stats.dropped_full + stats.dropped_stale


def phase_hints(run: Run, sessions: int, every: int, max_sessions: int, seed: int) -> None:
    from tqdm import tqdm

    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    keys = Path(tempfile.mkdtemp(prefix="saga-soak-")) / "keys"
    admin, capped = "soak-admin-key-0123456789abcdef", "soak-capped-key-0123456789abcdef"
    keys.write_text(f"{admin} ops admin\n{capped} capped agent max_sessions=50\n")
    proc = subprocess.Popen([sys.executable, "-m", "saga_server.cli", "hints", "--listen", endpoint,
                             "--api-keys", str(keys), "--max-sessions", str(max_sessions), "--no-state"],
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": f"{ROOT / 'sdk'}:{ROOT / 'server'}"})
    try:
        assert "listening" in proc.stdout.readline()
        out = multiprocessing.get_context("spawn").Queue()
        child = multiprocessing.get_context("spawn").Process(
            target=drive_tracker, args=(sessions, endpoint, admin, every, seed, out), daemon=True)
        child.start()
        bar = tqdm(total=sessions, desc="tracker -> hint service", unit="session")
        counts = {}
        while True:
            item = out.get(timeout=600)
            if item[0] == "done":
                counts = item[1]
                break
            _, driven, child_rss, tables = item
            bar.update(driven - bar.n)
            run.samples.append(Sample("proxy tracker", driven, child_rss, tables))
            run.samples.append(Sample("hint service", driven, rss_mib(proc.pid), hint_tables(endpoint, admin)))
        bar.close()
        child.join(60)
        sent, refused = capped_tenant(endpoint, capped, 500)
        refused_bad, dropped_bad = malformed_hints(endpoint, admin, 1000)
        run.samples.append(Sample("hint service", sessions, rss_mib(proc.pid), hint_tables(endpoint, admin)))
        run.sessions["tracker -> hint service"] = sessions + sent
        run.requests["tracker -> hint service"] = counts["requests"]
        run.errors["tracker -> hint service"] = counts["dropped"] + counts["lost"] + dropped_bad
        run.lost_answers["tracker -> hint service"] = 0  # the tracker answers every request it is given
        run.refused["capped tenant sessions"] = refused
        run.refused["malformed hints"] = refused_bad
        run.refused["tracker hints the service refused"] = counts["rejected"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


# -- phase 2: one saga serve ---------------------------------------------------------------


async def engine_session(http, base: str, model: str, hints, i: int, rng: random.Random, counts: dict) -> None:
    kind = rng.choices(("marked_final", "never", "cut", "tool_forever", "malformed"),
                       (0.35, 0.25, 0.1, 0.2, 0.1))[0]
    sid = f"soak-e{i}"
    turns = 2 if kind == "marked_final" else 1
    for k in range(turns):
        headers = {"x-session-id": sid}
        body = {"model": model, "messages": [{"role": "user", "content": f"Count to {i % 7 + 2}."}],
                "max_tokens": 2, "temperature": 0.0, "seed": 0}
        if kind == "marked_final" and k == turns - 1:
            headers["x-dynamo-session-final"] = "true"
        if kind == "malformed":
            headers["x-parent-session-id"] = b"\xff" * 300  # not ASCII, and past any id's length
            body["vllm_xargs"] = {"deadline_s": "soon", "cache_ttl_s": "forever", "osl": "many"}
        counts["requests"] += 1
        try:
            if kind == "cut":
                async with http.stream("POST", base + "/v1/chat/completions", headers=headers,
                                       json={**body, "max_tokens": 24, "stream": True}) as resp:
                    async for _ in resp.aiter_bytes():
                        break  # the client goes away mid-answer
                continue
            resp = await http.post(base + "/v1/chat/completions", headers=headers, json=body)
            if resp.status_code != 200:
                counts["errors"] += 1
            elif not resp.json()["choices"][0]["message"].get("content"):
                counts["lost"] += 1
        except Exception:
            counts["errors"] += 1
    if kind == "tool_forever":
        hints.tool_call_start(sid, "run_tests", call_id="forever")


def phase_engine(run: Run, sessions: int, every: int, max_sessions: int, concurrency: int,
                 idle_s: float = 120.0) -> None:
    import httpx
    from tqdm import tqdm

    from saga_sdk import HintClient

    server = start_server(True, ["--no-state", "--num-gpu-blocks-override", "256", "--max-num-seqs", "16"],
                          env={"SAGA_MAX_SESSIONS": str(max_sessions), "SAGA_SESSION_IDLE_S": str(idle_s)})
    try:
        counts = {"requests": 0, "errors": 0, "lost": 0}
        hints = HintClient(endpoint=server.hint_addr)
        rng = random.Random(7)
        bar = tqdm(total=sessions, desc="saga serve", unit="session")

        async def drive() -> None:
            limits = httpx.Limits(max_connections=concurrency)
            async with httpx.AsyncClient(timeout=120.0, limits=limits) as http:
                for start in range(0, sessions, every):
                    batch = range(start, min(start + every, sessions))
                    sem = asyncio.Semaphore(concurrency)

                    async def one(i: int) -> None:
                        async with sem:
                            await engine_session(http, server.base_url, server.model, hints, i, rng, counts)

                    await asyncio.gather(*(one(i) for i in batch))
                    bar.update(len(batch))
                    run.samples.append(Sample("saga serve", batch[-1] + 1, server.rss_bytes() / MIB,
                                              hint_tables(server.hint_addr)))

        asyncio.run(drive())
        bar.close()
        hints.flush(30)
        run.sessions["saga serve"] = sessions
        run.requests["saga serve"] = counts["requests"]
        run.errors["saga serve"] = counts["errors"] + dropped(hints.stats())
        run.lost_answers["saga serve"] = counts["lost"]
        hints.close()
    finally:
        server.stop()


# -- report ---------------------------------------------------------------------------------


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (x, y)."""
    n = len(points)
    if n < 2:
        return 0.0
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else 0.0


def after_warmup(samples: list[Sample]) -> list[Sample]:
    return samples[len(samples) // 3:]


def growth(run: Run) -> dict[str, dict[str, float]]:
    """Per process: the slope after warm-up of RSS (MiB per 100k sessions) and of each
    table (entries per 100k sessions), and the peak of each table."""
    out: dict[str, dict[str, float]] = {}
    for process in dict.fromkeys(s.process for s in run.samples):
        ss = after_warmup([s for s in run.samples if s.process == process])
        row = {"rss_mib_per_100k": 1e5 * slope([(s.driven, s.rss_mib) for s in ss])}
        for name in ss[-1].tables if ss else ():
            row[f"{name}_per_100k"] = 1e5 * slope([(s.driven, s.tables.get(name, 0.0)) for s in ss])
        out[process] = row
    return out


def past_warmup(run: Run, slack: float = 1.2, floor: float = 64.0, rss_slack_mib: float = 32.0) -> list[str]:
    """What grew past its warm-up: a table whose largest size after warm-up exceeds
    `slack` x its size at the end of warm-up (+ `floor` entries), or a process whose
    RSS rose more than `rss_slack_mib` after it. A bounded table reaches its bound
    and stays; an unbounded one keeps growing with the sessions driven."""
    out = []
    for process in dict.fromkeys(s.process for s in run.samples):
        ss = [s for s in run.samples if s.process == process]
        if len(ss) < 3:
            continue
        at, rest = ss[len(ss) // 3], after_warmup(ss)
        for name in at.tables:
            peak = max(s.tables.get(name, 0.0) for s in rest)
            if peak > slack * at.tables[name] + floor:
                out.append(f"{process}: table {name} grew from {at.tables[name]:.0f} to {peak:.0f} after warm-up")
        rss_peak = max(s.rss_mib for s in rest)
        if rss_peak > at.rss_mib + rss_slack_mib:
            out.append(f"{process}: RSS grew from {at.rss_mib:.0f} to {rss_peak:.0f} MiB after warm-up")
    return out


def report(run: Run) -> str:
    lines = []
    for process in dict.fromkeys(s.process for s in run.samples):
        ss = [s for s in run.samples if s.process == process]
        names = sorted({k for s in ss for k in s.tables})
        lines.append(f"\n{process}")
        lines.append(f"{'sessions':>10} {'RSS MiB':>8} " + " ".join(f"{n[:18]:>18}" for n in names))
        step = max(1, len(ss) // 12)
        for s in ss[::step] + ([ss[-1]] if (len(ss) - 1) % step else []):
            lines.append(f"{s.driven:>10} {s.rss_mib:>8.1f} " +
                         " ".join(f"{s.tables.get(n, 0):>18.0f}" for n in names))
    lines.append("\nslopes after warm-up (per 100,000 sessions):")
    for process, row in growth(run).items():
        lines.append(f"  {process}: " + ", ".join(f"{k} {v:+.1f}" for k, v in row.items()))
    grew = past_warmup(run)
    lines.append("flat after warm-up: " + ("yes, every table and RSS" if not grew else "NO: " + "; ".join(grew)))
    lines.append("")
    for phase in run.sessions:
        lines.append(f"{phase}: {run.sessions[phase]} sessions, {run.requests.get(phase, 0)} requests, "
                     f"errors {run.errors.get(phase, 0)}, lost answers {run.lost_answers.get(phase, 0)}")
    for what, n in run.refused.items():
        lines.append(f"refused as they should be: {what} {n}")
    return "\n".join(lines)


def plot(run: Run, path: str) -> None:
    processes = list(dict.fromkeys(s.process for s in run.samples))
    with png(path, 2, len(processes), figsize=(5 * len(processes), 7), squeeze=False) as (_, axes):
        for col, process in enumerate(processes):
            ss = [s for s in run.samples if s.process == process]
            x = [s.driven for s in ss]
            axes[0][col].plot(x, [s.rss_mib for s in ss])
            axes[0][col].set_title(f"{process}: RSS (MiB)")
            for name in sorted({k for s in ss for k in s.tables}):
                axes[1][col].plot(x, [s.tables.get(name, 0) for s in ss], label=name)
            axes[1][col].set_title(f"{process}: table entries")
            axes[1][col].set_xlabel("sessions driven")
            axes[1][col].legend(fontsize=6)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=1_000_000, help="sessions through the tracker and hint service")
    p.add_argument("--engine-sessions", type=int, default=20_000, help="sessions of real requests (0: skip)")
    p.add_argument("--every", type=int, default=0, help="sample every this many sessions (default: 1/40 of a phase)")
    p.add_argument("--hint-max-sessions", type=int, default=50_000)
    p.add_argument("--engine-max-sessions", type=int, default=2_000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--plot", default="soak.png")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    run = Run()
    started = time.monotonic()
    if args.sessions:
        phase_hints(run, args.sessions, args.every or max(100, args.sessions // 40), args.hint_max_sessions,
                    args.seed)
    if args.engine_sessions:
        phase_engine(run, args.engine_sessions, args.every or max(50, args.engine_sessions // 40),
                     args.engine_max_sessions, args.concurrency)
    print(report(run))
    print(f"\nwall time {time.monotonic() - started:.0f} s; command: python -m benchmarks.soak "
          f"{' '.join(argv if argv is not None else sys.argv[1:])}")
    if args.plot:
        plot(run, args.plot)
        print(f"plot: {args.plot}")
    if args.json:
        Path(args.json).write_text(json.dumps({"samples": [s.__dict__ for s in run.samples],
                                               "growth": growth(run), "sessions": run.sessions,
                                               "requests": run.requests, "errors": run.errors,
                                               "lost_answers": run.lost_answers, "refused": run.refused}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
