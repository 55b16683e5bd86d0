"""`saga`: one command, a subcommand per front door.

Each subcommand lives in its own module with `main(argv) -> int` and is imported
only when used, so `saga status` never pays for importing vLLM. A subcommand whose
module is not part of this build says so and exits 2.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("saga_server.serve.cli", "real vLLM with the SAGA scheduler and the hint service"),
    "hints": ("saga_server.rpc.cli", "the hint service alone, backed by the workflow core"),
    "status": ("saga_server.status", "what a running SAGA server knows (sessions, pins, stats)"),
    "bench": ("saga_server.bench.cli", "trace-driven cluster simulator: policies side by side"),
    "calibrate": ("saga_server.bench.calibrate", "fit the simulator's costs to the real engine on this host"),
    "proxy": ("saga_server.proxy.cli", "zero-code OpenAI-compatible proxy that infers sessions"),
    "run": ("saga_sdk.launcher", "run an unchanged agent command with SAGA switched on"),
    "router": ("saga_server.router.cli", "many hosts: session-affinity routing on Ray Serve"),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = ["usage: saga <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "saga <command> --help shows a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name in ("-V", "--version"):
        from . import __version__

        print(f"saga {__version__}")
        return 0
    if name not in SUBCOMMANDS:
        print(f"saga: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module_name = SUBCOMMANDS[name][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            print(f"saga {name}: not built yet in this version of SAGA", file=sys.stderr)
            return 2
        print(f"saga {name}: missing dependency {exc.name!r}; install the extra that provides it "
              f"(see README, e.g. pip install 'saga-agents[server]')", file=sys.stderr)
        return 2
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
