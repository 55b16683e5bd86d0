"""The framework-overhead template: what an agent framework's SAGA integration adds per
model call, against the same agent without it (`langchain_overhead`,
`agents_overhead`, `autogen_overhead`).

- The model is a scripted OpenAI-compatible server (`tests/support/chat_server.py`) in a
  child process (`python -m benchmarks.NAME --serve-scripted TURNS`), so that its
  threads do not compete with the measured agent for the GIL, as a real server's
  would not; it answers in about a millisecond: the *worst case* for the ratio.
- Hints go to a real hint service on loopback.
- The arms (`none`: no SAGA, `noop`: the framework's empty hooks, `saga`) run
  interleaved, run by run, after one warm-up run each, so that drift hits all alike.
- `Timer` sums the time spent inside SAGA's own code during the runs: the figure
  without the noise of differencing medians.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager

ARMS = ("none", "noop", "saga")


def add_arguments(p: argparse.ArgumentParser, *, turns_help: str = "tool-calling turns per run") -> None:
    """The options every overhead benchmark takes: runs per arm, turns per run, the
    tight loop's length, and the hidden switch that makes a process the scripted model."""
    p.add_argument("--runs", type=int, default=30, help="agent runs per arm")
    p.add_argument("--turns", type=int, default=4, help=turns_help)
    p.add_argument("--loop", type=int, default=2000, help="iterations of the tight hook loop "
                                                             "(4 hints each: stays under the queue bound)")
    p.add_argument("--serve-scripted", type=int, default=None, help=argparse.SUPPRESS)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def mul(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def tool_turns(turns: int, done_of):
    """The scripted model: a call of the tool `mul`, then `add`, alternating (each framework
    wraps the two functions above as its tools), until `done_of(body)`, the tool results
    the request carries, reaches `turns`; then a final answer."""
    from tests.support import chat_server as chat

    def script(body):
        done = done_of(body)
        if done >= turns:
            return chat.text("done")
        return chat.tool_calls(("add" if done % 2 else "mul", {"a": done, "b": 2}))

    return script


def serve_scripted(script, *, with_hints: bool = False) -> None:
    """Child process: the scripted model server (and, `with_hints`, a hint service);
    prints their addresses on one line and serves until the parent closes stdin."""
    from tests.support import chat_server as chat

    server = chat.ChatServer(script=script).start()
    hints = start_hint_service() if with_hints else None
    print(server.base_url, *([hints[0]] if hints else []), flush=True)
    sys.stdin.read()
    server.stop()
    if hints:
        hints[1]()


@contextmanager
def scripted_model(module: str, turns: int):
    """`python -m module --serve-scripted turns` as a child; yields the addresses it printed."""
    child = subprocess.Popen([sys.executable, "-m", module, "--serve-scripted", str(turns)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        yield child.stdout.readline().split()
    finally:
        child.stdin.close()
        child.wait(timeout=10)


def start_hint_service(max_sessions: int = 100_000):
    """A hint service on a free loopback port in this process: (endpoint, stop)."""
    from saga_server.core import SessionTable
    from saga_server.rpc import HintServer

    server = HintServer(SessionTable(max_sessions=max_sessions), "127.0.0.1:0").start()
    return server.endpoint, lambda: server.close(grace=None)


class Timer:
    """Records the time spent in the callables it wraps (its own ~0.1 us per call is
    counted too: an over- rather than under-estimate)."""

    def __init__(self) -> None:
        self.durations: list[float] = []

    @property
    def total(self) -> float:
        return sum(self.durations)

    def wrap(self, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.durations.append(time.perf_counter() - t0)
        return timed


def interleaved(runs: int, one) -> dict[str, list]:
    """`one(arm)` once per arm to warm up, then `runs` rounds of every arm in turn:
    each arm's results, in order."""
    for arm in ARMS:
        one(arm)  # imports, connections, schemas
    out: dict[str, list] = {arm: [] for arm in ARMS}
    for _ in range(runs):
        for arm in ARMS:
            out[arm].append(one(arm))
    return out


def print_arms(per_call: dict[str, list[float]], width: int, labels: tuple[str, str, str], noop_says: str,
               names: tuple[str, str]) -> tuple[float, float, float]:
    """The arms' median seconds per call (shown in us), the no-op arm's cost over none
    and SAGA's over both, in rows `labels` of `width`; `noop_says`: what the no-op
    difference is; `names`: the none and no-op arms in SAGA's row. Returns the medians in us."""
    plain, noop, hinted = (statistics.median(per_call[arm]) * 1e6 for arm in ARMS)
    print(f"{'':{width}}{'median':>12}")
    print(f"{labels[0]:{width}}{plain:>10.0f} us")
    print(f"{labels[1]:{width}}{noop:>10.0f} us   ({(noop - plain) / plain * 100:+.2f}%: {noop_says})")
    print(f"{labels[2]:{width}}{hinted:>10.0f} us   ({(hinted - plain) / plain * 100:+.2f}% vs {names[0]}, "
          f"{(hinted - noop) / noop * 100:+.2f}% vs {names[1]}; differences of medians: noisy)")
    return plain, noop, hinted


def hint_totals(stats) -> str:
    return f"hints: sent {stats.sent}, dropped {stats.dropped_full + stats.dropped_stale + stats.dropped_failed}"
