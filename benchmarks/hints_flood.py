"""The chaos suite's hint flood against a standalone hint service: offered and accepted events/s.

    .venv/bin/python -m benchmarks.hints_flood [--seconds 15] [--streams 3]
        [--stream-rate 40000] [--clients 1] [--client-rate 10000]

(the service runs the `saga_server` on PYTHONPATH: another checkout's for a before/after)

`saga hints` runs pinned to core 0; the flood (`tests.support.loads.HintFlood`: paced
streams of pre-serialised batches, each LLM call and tool call of 128 sessions, and
HintClients, every one in its own process) runs on the other cores. Prints what the
clients offered, what the service accepted (by the clients' acks and by its own
counter), what the clients shed while it pushed back, and the service's CPU.
`tests/real/chaos/test_hint_faults_real.py` offers the same flood to the engine's own
hint service while agents run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from saga_sdk import HintReader
from saga_server.serve_child import free_port

from benchmarks.harness.serve import start_hint_service
from tests.support.loads import HintFlood


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--stream-rate", type=float, default=40_000.0, help="events/s per stream")
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--client-rate", type=float, default=10_000.0, help="events/s per HintClient")
    args = parser.parse_args()

    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    service = start_hint_service(port, core=0)
    others = os.sched_getaffinity(0) - {0}
    if others:
        os.sched_setaffinity(0, others)  # the flood's processes inherit it
    try:
        with HintReader(endpoint, timeout=10) as reader:
            before = reader.stats()
        cpu = cpu_seconds(service.pid)
        flood = HintFlood(endpoint, name="bench-flood", streams=args.streams, stream_rate=args.stream_rate,
                          clients=args.clients, client_rate=args.client_rate, max_s=args.seconds + 60)
        with flood:
            started = time.monotonic()
            time.sleep(args.seconds)
        cpu = (cpu_seconds(service.pid) - cpu) / (time.monotonic() - started)
        with HintReader(endpoint, timeout=10) as reader:
            after = reader.stats()
    finally:
        service.terminate()
        service.wait(10)

    results = flood.results
    offered = sum(r.offered for r in results) / max(r.offer_s for r in results)
    accepted = sum(r.accepted for r in results) / max(r.seconds for r in results)
    counted = after["hints_events_accepted"] - before["hints_events_accepted"]
    print(f"flood: {args.streams} streams x {args.stream_rate:,.0f} + {args.clients} HintClients x "
          f"{args.client_rate:,.0f} events/s, each in its own process, for {args.seconds:.0f} s")
    print(f"offered  {offered:>10,.0f} events/s")
    print(f"accepted {accepted:>10,.0f} events/s   (the service counted {counted:,.0f} accepted; "
          f"{sum(r.rejected for r in results)} refused)")
    print(f"shed at the clients: streams {sum(r.shed for r in flood.streams):,} of "
          f"{sum(r.offered for r in flood.streams):,}, HintClients {sum(r.shed for r in flood.clients):,} of "
          f"{sum(r.offered for r in flood.clients):,}")
    print(f"service CPU: {cpu:.2f} cores")
    for r in results:
        print(f"  {r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
