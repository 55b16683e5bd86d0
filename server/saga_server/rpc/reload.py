"""How a SIGHUP reaches the process whose hint service holds the keys.

`saga hints` and `saga router` hold their `KeyRing` themselves: `reload_on_sighup`.
`saga serve` does not: the hint service runs in vLLM's EngineCore process, a
grandchild. That process registers its pid in `$SAGA_ENGINE_PID_DIR`
(`register_for_reload`, a directory `saga serve` makes), and `saga serve` passes
its own SIGHUP on to the pids there (`forward_reload`) that are still in vLLM's
process group, so a pid reused by another process is never signalled.
"""

from __future__ import annotations

import logging
import os
import signal

from .keys import KeyRing, KeysFileError

__all__ = ["RELOAD_DIR_ENV", "forward_reload", "register_for_reload", "reload_on_sighup"]

log = logging.getLogger("saga.rpc")

RELOAD_DIR_ENV = "SAGA_ENGINE_PID_DIR"


def reload_on_sighup(ring: KeyRing) -> bool:
    """Reload `ring` whenever this process gets SIGHUP (a bad file is logged and
    the old keys kept). False where no handler can be installed (not the main
    thread, no SIGHUP on this platform)."""

    def reload(signum, frame) -> None:
        try:
            log.info("SAGA API keys reloaded from %s: %d keys", ring.path, ring.reload())
        except KeysFileError as exc:
            log.error("SAGA API keys NOT reloaded, keeping the old ones: %s", exc)

    try:
        signal.signal(signal.SIGHUP, reload)
    except (AttributeError, ValueError):
        return False
    return True


def register_for_reload(pid_dir: str | None = None) -> bool:
    """Leave this process's pid in `pid_dir` (default: $SAGA_ENGINE_PID_DIR), where
    `forward_reload` finds it; best effort."""
    pid_dir = pid_dir or os.environ.get(RELOAD_DIR_ENV)
    if not pid_dir:
        return False
    try:
        with open(os.path.join(pid_dir, str(os.getpid())), "w"):
            return True
    except OSError:
        log.warning("SAGA: cannot register for key reloads in %s", pid_dir)
        return False


def forward_reload(pid_dir: str, group: int) -> list[int]:
    """Send SIGHUP to the processes registered in `pid_dir` that are in process
    group `group`; returns the pids signalled."""
    sent = []
    for name in sorted(os.listdir(pid_dir)):
        try:
            pid = int(name)
            if os.getpgid(pid) == group:
                os.kill(pid, signal.SIGHUP)
                sent.append(pid)
        except (ValueError, ProcessLookupError, PermissionError):
            continue
    return sent
