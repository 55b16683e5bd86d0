"""Hint path costs: what an agent pays per `emit()`, and what the service ingests.

    python -m benchmarks.hints_bench [--events 200000]

Prints:
  * caller-side cost of one hint (median, p99) with the hint service up, and
    with nothing listening (the agent must not notice SAGA is down);
  * events/s the service ingests, with the service pinned to one core in its own
    process and batches streamed to it from this process over loopback.
Targets (issue 2): emit median <= 5 us, p99 <= 50 us, also with the server down;
service >= 50,000 events/s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from saga_proto import hints_pb2 as pb
from saga_proto import hints_pb2_grpc
from saga_sdk import HintClient
from saga_sdk.channel import hint_channel
from saga_server.serve_child import free_port

from benchmarks.harness.serve import start_hint_service


def emit_costs(client: HintClient, n: int) -> list[float]:
    """Per-call wall time of a realistic mix of hints, in microseconds."""
    costs = []
    clock = time.perf_counter_ns
    for i in range(n):
        sid = f"s{(i // 4) % 64}"  # one call/tool cycle per session in turn
        t0 = clock()
        if i % 4 == 0:
            client.llm_call_start(sid, step=i, node="agent")
        elif i % 4 == 1:
            client.llm_call_end(sid, step=i, prompt_tokens=1000, output_tokens=50)
        elif i % 4 == 2:
            client.tool_call_start(sid, "bash", call_id=str(i))
        else:
            client.tool_call_end(sid, "bash", call_id=str(i - 1))
        costs.append((clock() - t0) / 1000)
        if i % 2000 == 1999:
            time.sleep(0.002)  # agents pause between hints; lets the sender drain
    return costs


def summarize(costs: list[float]) -> tuple[float, float]:
    costs = sorted(costs)
    return statistics.median(costs), costs[int(0.99 * (len(costs) - 1))]


def ingest_rate(endpoint: str, events: int, batch_size: int = 512) -> float:
    batch = pb.HintBatch(client_id="bench")
    for i in range(batch_size):
        sid = f"ingest-{i % 256}"
        if i % 2:
            batch.events.add(session_id=sid, llm_call_start=pb.LlmCallStart(step=i, node="agent"))
        else:
            batch.events.add(session_id=sid, llm_call_end=pb.LlmCallEnd(step=i, prompt_tokens=10))
    batches = events // batch_size

    def stream():
        for seq in range(1, batches + 1):
            batch.sequence = seq
            yield batch

    channel = hint_channel(endpoint)
    stub = hints_pb2_grpc.WorkflowHintsStub(channel)
    t0 = time.perf_counter()
    accepted = sum(ack.accepted for ack in stub.StreamHints(stream()))
    elapsed = time.perf_counter() - t0
    channel.close()
    assert accepted == batches * batch_size, f"service accepted {accepted} of {batches * batch_size}"
    return accepted / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--emits", type=int, default=100_000)
    args = parser.parse_args()

    port = free_port()
    service = start_hint_service(port, core=0)
    try:
        up = HintClient(endpoint=f"127.0.0.1:{port}", queue_size=1_000_000)
        up_costs = emit_costs(up, args.emits)
        up.flush(30)
        print(f"sender: {up.stats()}")
        up.close()
        rate = ingest_rate(f"127.0.0.1:{port}", args.events)
    finally:
        service.terminate()
        service.wait(10)

    down = HintClient(endpoint=f"127.0.0.1:{free_port()}", rpc_timeout_s=0.2)
    down_costs = emit_costs(down, args.emits)
    down_stats = down.stats()
    down.close(timeout=0.1)

    print(f"{'case':<28} {'median us':>10} {'p99 us':>10}   target: median <= 5, p99 <= 50")
    for name, costs in (("emit, service up", up_costs), ("emit, service down", down_costs)):
        med, p99 = summarize(costs)
        print(f"{name:<28} {med:>10.2f} {p99:>10.2f}")
    print(f"(service down: {down_stats.dropped_full} dropped and counted, caller never blocked)")
    print(f"service ingest, one core: {rate:,.0f} events/s   target >= 50,000")
    return 0


if __name__ == "__main__":
    sys.exit(main())
