"""`saga proxy`: put SAGA in front of any OpenAI-compatible server, no agent change.

    saga proxy --upstream http://127.0.0.1:8000/v1 --port 8100 --hint-endpoint 127.0.0.1:50051
    export OPENAI_BASE_URL=http://127.0.0.1:8100/v1   # the agent, unchanged, now talks to the proxy
    export ANTHROPIC_BASE_URL=http://127.0.0.1:8100   # a Messages-API agent, likewise

The upstream and the hint endpoint may also come from `SAGA_UPSTREAM` and
`SAGA_ENDPOINT`. See `saga_server.proxy.app` for what is forwarded and how, and
`saga_server.proxy.recording` for `--record`.
With `--api-keys FILE` (or `$SAGA_API_KEYS`; the hint service's keys file) every
caller needs a key of the file and acts as its tenant (`saga_server.proxy.tenants`);
SIGHUP reloads the file (a bad one is logged and the old keys kept). The proxy's
hints then go with `SAGA_API_KEY` if set, else the file's first admin key; an agent
key there stops the proxy at start (exit 2). A `SAGA_API_KEY` the file lacks is the
shared key: one more admin key, of tenant "", here as at the hint service.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys

from ..record import options as record_options
from ..rpc.keys import KeyRing
from ..rpc.reload import reload_on_sighup
from ..state_file import StateKeeper, add_state_arguments, state_path_of
from ..core.identity import problem_with
from ..settings import ProxySettings
from . import recording
from .actions import TextActions
from .tenants import Tenants

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="saga proxy", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    env = ProxySettings.from_env()
    p.add_argument("--upstream", default=env.upstream,
                   help="OpenAI base URL of the upstream, e.g. http://127.0.0.1:8000/v1 (env SAGA_UPSTREAM)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--hint-endpoint", default=None,
                   help="host:port of the hint service (default: SAGA_ENDPOINT or 127.0.0.1:50051)")
    p.add_argument("--no-hints", action="store_true", help="infer and tag sessions but send no hints")
    p.add_argument("--api-keys", default=env.api_keys, metavar="FILE",
                   help="keys file: one `key tenant role [limits]` per line; callers must present a key "
                        "and act as its tenant (default: $SAGA_API_KEYS)")
    p.add_argument("--no-body-session-id", action="store_true",
                   help="only add the X-Session-ID header, not the body field session_id "
                        "(for upstreams that reject unknown fields)")
    p.add_argument("--max-sessions", type=int, default=10_000)
    p.add_argument("--idle-ttl-s", type=float, default=600.0,
                   help="the longest a quiet session lasts: the bound of the idle timeout learnt per workflow")
    p.add_argument("--idle-min-s", type=float, default=30.0, help="the shortest learnt idle timeout")
    p.add_argument("--no-text-actions", action="store_true",
                   help="do not read tool calls from fenced shell blocks in answers")
    p.add_argument("--action-fence", action="append", metavar="LANG",
                   help="a fenced block in this language is a text action (repeatable; default: "
                        + ", ".join(TextActions().fences) + ")")
    p.add_argument("--submit-marker", action="append", metavar="REGEX",
                   help="a text action matching this ends its session (repeatable; default: "
                        "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT and kin)")
    record_options.add_arguments(p)
    add_state_arguments(p)
    p.add_argument("--read-timeout-s", type=float, default=600.0)
    p.add_argument("--log-level", default="warning")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.upstream:
        print("saga proxy: --upstream (or SAGA_UPSTREAM) is required", file=sys.stderr)
        return 2
    settings = ProxySettings.from_env()
    problem = problem_with(settings.session_headers)
    if problem:
        print(f"saga proxy: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import uvicorn

    from saga_sdk import HintClient

    from .app import ProxyConfig, SagaProxy, tracker_for

    try:
        actions = None if args.no_text_actions else TextActions(
            **({"fences": tuple(args.action_fence)} if args.action_fence else {}),
            **({"submit": tuple(args.submit_marker)} if args.submit_marker else {}))
        config = ProxyConfig(upstream=args.upstream, inject_body_session_id=not args.no_body_session_id,
                             max_sessions=args.max_sessions, idle_ttl_s=args.idle_ttl_s, idle_min_s=args.idle_min_s,
                             text_actions=actions, read_timeout_s=args.read_timeout_s)
        # $SAGA_API_KEY beside the file is one more admin key (tenant ""), as at the hint service
        keys = KeyRing(args.api_keys, shared_key=settings.api_key) if args.api_keys else None
        recorder = recording.from_args(args)
    except (OSError, ValueError, re.error) as exc:  # KeysFileError is a ValueError
        print(f"saga proxy: {exc}", file=sys.stderr)
        return 2
    overrides = {"enabled": False} if args.no_hints else {}
    if args.hint_endpoint:
        overrides["endpoint"] = args.hint_endpoint
    if keys is not None and not settings.api_key and keys.admin_key():
        overrides["api_key"] = keys.admin_key()
    try:
        hints = HintClient(**overrides)
    except (TypeError, ValueError) as exc:
        print(f"saga proxy: bad hint settings: {exc}", file=sys.stderr)
        return 2
    tenants = None
    if keys is not None:
        refused = hint_key_refusal(keys, hints)
        if refused:
            print(f"saga proxy: {refused}", file=sys.stderr)
            hints.close(0)
            return 2
        tenants = Tenants(keys, salt_secret=settings.cache_salt_secret.encode())
        reload_on_sighup(keys)
    tracker = tracker_for(config)
    state = StateKeeper.started(state_path_of(args, "proxy", args.port), "proxy", tracker.learnt,
                                tracker.restore_learnt)
    closing = [part.close for part in (state, recorder) if part is not None]
    app = SagaProxy(config, hints=hints, recorder=recorder, tenants=tenants, tracker=tracker, on_close=closing)
    hint_note = "off" if args.no_hints else hints.config.endpoint
    key_note = f", {len(keys)} API keys required" if keys is not None else ""
    print(f"saga proxy: OpenAI base URL http://{args.host}:{args.port}/v1 -> {app._origin} "
          f"(hints: {hint_note}{key_note})", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False,
                lifespan="on", http="auto")
    hints.close()
    return 0


def hint_key_refusal(keys: KeyRing, hints) -> str | None:
    """Why the proxy must not start with these keys, or None. A multi-tenant proxy
    sends every tenant's hints with its one key, so that key must be an admin key of
    the file: an agent key would make every session its own tenant's (and hide them
    from their tenants), and no key or an unknown one is refused by the service."""
    if not hints.config.enabled:
        return None
    key = hints.config.api_key
    fix = (f"the proxy sends every tenant's hints with one key, which must be an admin key of {keys.path} "
           "(set SAGA_API_KEY to one, or add an admin line to the file; --no-hints sends none)")
    if not key:
        return f"{keys.path} has no admin key and SAGA_API_KEY is unset: {fix}"
    entry = keys.lookup(key)
    if entry is None:
        return f"SAGA_API_KEY is not a key of {keys.path}: {fix}"
    if not entry.caller.is_admin:
        return f"SAGA_API_KEY is an agent key of tenant {entry.tenant!r}: {fix}"
    return None


if __name__ == "__main__":
    sys.exit(main())
