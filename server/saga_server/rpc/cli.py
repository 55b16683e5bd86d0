"""`saga hints`: run the hint service on its own (no engine).

Useful in front of any OpenAI-compatible server (the proxy and integrations send
it hints), and as the lightest way to see what an agent tells SAGA. With
`--api-keys FILE` (format: `saga_server.rpc.keys`) each key acts as its tenant;
SIGHUP reloads the file (a bad one is logged and the old keys kept).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from ..core import CoreConfig, WorkflowCore
from ..settings import HintServiceSettings
from .keys import KeyRing, KeysFileError
from .reload import reload_on_sighup
from ..state_file import StateKeeper, add_state_arguments, state_path_of
from .service import HintServer

__all__ = ["main"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="saga hints", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:50051", help="host:port (port 0: any free port)")
    env = HintServiceSettings.from_env()
    parser.add_argument("--api-key", default=env.api_key,
                        help="shared token clients must send, one tenant, admin (default: $SAGA_API_KEY)")
    parser.add_argument("--api-keys", default=env.api_keys, metavar="FILE",
                        help="keys file: one `key tenant role [limits]` per line (default: $SAGA_API_KEYS)")
    parser.add_argument("--max-sessions", type=int, default=CoreConfig().max_sessions,
                        help="sessions the core keeps at most (least recently active go first)")
    parser.add_argument("--session-idle-s", type=float, default=CoreConfig().session_idle_s,
                        help="a session silent this long is forgotten")
    add_state_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        keys = KeyRing(args.api_keys, shared_key=args.api_key) if args.api_keys or args.api_key else None
    except KeysFileError as exc:
        print(f"saga hints: {exc}", file=sys.stderr)
        return 2
    try:
        config = CoreConfig(max_sessions=args.max_sessions, session_idle_s=args.session_idle_s)
    except ValueError as exc:
        print(f"saga hints: {exc}", file=sys.stderr)
        return 2
    sink = WorkflowCore(config)
    server = HintServer(sink, args.listen, keys=keys).start()
    # named by the port as configured (not the one port 0 got): the same file next time
    state = StateKeeper.started(state_path_of(args, "hints", args.listen.rsplit(":", 1)[-1]), "hints",
                                sink.learnt, sink.restore_learnt)
    if keys is not None and keys.path is not None:
        reload_on_sighup(keys)
    print(f"SAGA hint service ({type(sink).__name__}) listening on {server.endpoint}"
          f"{f' ({len(keys)} API keys required)' if keys is not None else ''}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.close(grace=1.0)
    if state is not None:
        state.close()
    return 0
