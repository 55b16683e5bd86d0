"""`saga run`: run an unchanged agent command with SAGA switched on.

    saga run --proxy http://127.0.0.1:8100/v1 -- python my_agent.py
    saga run --server http://127.0.0.1:8000/v1 --endpoint 127.0.0.1:50051 -- python my_agent.py

In the style of `opentelemetry-instrument`: it puts the `saga_sdk/_bootstrap`
directory (holding a `sitecustomize`) first on `PYTHONPATH`, sets a few
environment variables and `exec`s the command, which keeps its pid, stdin/stdout
and exit status. Every Python process the command starts then, at start-up:
chains to any `sitecustomize` that was already on its path, and activates each
SAGA integration whose framework it imports (the OpenAI SDK patch, LangChain's
`SAGA_LANGCHAIN=1` hook, AutoGen's tool hints), each guarded, none ever raising.

Where the agent's requests go:
  * `--proxy URL`: a running `saga proxy`. `OPENAI_BASE_URL` and `OPENAI_API_BASE`
    (LangChain reads the latter first) point at it. The proxy infers sessions and
    sends the hints, so the agent's own hint client is switched off
    (`SAGA_ENABLED=0`; `--agent-hints` keeps it on); a framework integration still
    makes its sessions current, and the OpenAI SDK patch sends their ids as
    `X-Session-ID`, which the proxy honours.
  * `--server URL`: `saga serve` directly. The same two variables point at it and
    the integrations send hints themselves to `--endpoint` (or `SAGA_ENDPOINT`).
    A plain OpenAI SDK agent gets no sessions this way: use the proxy for those.
  * neither: the agent's own OpenAI settings are left alone; only integrations.
`OPENAI_API_KEY` is set to a placeholder when a URL is given and no key is set
(local servers ignore it; the OpenAI SDK refuses to start without one).

The same without the launcher, by environment alone:
    saga proxy --upstream http://127.0.0.1:8000/v1 --port 8100 &
    export OPENAI_BASE_URL=http://127.0.0.1:8100/v1 OPENAI_API_BASE=http://127.0.0.1:8100/v1
    python my_agent.py
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Mapping

__all__ = ["main", "child_environment", "BOOTSTRAP_DIR"]

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "_bootstrap"
PLACEHOLDER_KEY = "saga-no-key"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="saga run", usage="saga run [options] -- command [args...]",
                                description="Run an unchanged agent command with SAGA switched on.")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--proxy", metavar="URL", help="OpenAI base URL of a running `saga proxy`")
    where.add_argument("--server", metavar="URL", help="OpenAI base URL of `saga serve` (no proxy)")
    p.add_argument("--endpoint", metavar="HOST:PORT", help="hint service for in-process hints (SAGA_ENDPOINT)")
    p.add_argument("--agent-hints", action="store_true",
                   help="with --proxy, let the agent's integrations send hints too")
    p.add_argument("--no-integrations", action="store_true",
                   help="only point the agent at the URL; activate no framework integration")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    return p


def child_environment(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    """The command's environment: `environ` plus what `args` ask for (pure, testable)."""
    env = dict(environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p) != BOOTSTRAP_DIR]
    env["PYTHONPATH"] = os.pathsep.join([str(BOOTSTRAP_DIR), *paths])
    # Where saga_sdk lives, for a child interpreter that cannot import it by itself.
    env["SAGA_SDK_PATH"] = str(Path(__file__).resolve().parent.parent)
    url = args.proxy or args.server
    if url:
        env["OPENAI_BASE_URL"] = env["OPENAI_API_BASE"] = url
        env.setdefault("OPENAI_API_KEY", PLACEHOLDER_KEY)
    if args.endpoint:
        env["SAGA_ENDPOINT"] = args.endpoint
    if args.proxy and not args.agent_hints:
        env["SAGA_ENABLED"] = "0"
    env["SAGA_INTEGRATIONS"] = "0" if args.no_integrations else env.get("SAGA_INTEGRATIONS", "1")
    if not args.no_integrations:
        env.setdefault("SAGA_LANGCHAIN", "1")
    return env


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.print_usage(sys.stderr)
        print("saga run: no command given (put it after --)", file=sys.stderr)
        return 2
    env = child_environment(args, os.environ)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except FileNotFoundError:
        print(f"saga run: command not found: {command[0]}", file=sys.stderr)
        return 127
    except PermissionError:
        print(f"saga run: permission denied: {command[0]}", file=sys.stderr)
        return 126
    except OSError as exc:
        print(f"saga run: cannot run {command[0]}: {exc}", file=sys.stderr)
        return 126
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main())
