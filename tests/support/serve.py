"""`launch_saga_serve`: a `saga serve` subprocess from this checkout, for the real tier.

    proc = launch_saga_serve(["--fast-start", "--port", "8123", ...], log_path)
    stop_saga_serve(proc)

Its output goes to `log_path` (`[saga] ready in` appears there once it serves); it runs
from the repository root with this checkout's `sdk` and `server` first on `PYTHONPATH`.
SIGTERM stops it and vLLM's whole process group (`stop_saga_serve`: SIGTERM, then
SIGKILL after `grace_s`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["ROOT", "launch_saga_serve", "stop_saga_serve"]

ROOT = Path(__file__).resolve().parents[2]


def launch_saga_serve(args: list[str], log_path: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "saga_server.cli", "serve", *args]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "sdk"), str(ROOT / "server"), env.get("PYTHONPATH", "")])
    with open(log_path, "wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def stop_saga_serve(proc: subprocess.Popen, grace_s: float = 60.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
