"""`saga hints`: run the hint service on its own (no engine).

Useful in front of any OpenAI-compatible server (the proxy and integrations send
it hints), and as the lightest way to see what an agent tells SAGA.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading

from ..core import WorkflowCore
from .service import HintServer

__all__ = ["main"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="saga hints", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:50051", help="host:port (port 0: any free port)")
    parser.add_argument("--api-key", default=os.environ.get("SAGA_API_KEY"),
                        help="shared token clients must send (default: $SAGA_API_KEY; none: no auth)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    sink = WorkflowCore()
    server = HintServer(sink, args.listen, api_key=args.api_key).start()
    print(f"SAGA hint service ({type(sink).__name__}) listening on {server.endpoint}"
          f"{' (API key required)' if args.api_key else ''}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.close(grace=1.0)
    return 0
