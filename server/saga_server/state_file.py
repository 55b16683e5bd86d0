"""Learnt state on disk, so that a restart forgets nothing SAGA learnt.

What a process learnt (the engine's and the hint service's workflow graphs, tool
and idle durations, subagent spawns: `WorkflowCore.learnt`; the proxy's idle
times and final-answer outcomes: `SessionTracker.learnt`) is written to one file
per process, periodically and at shutdown, and read back at start. Sessions in
flight are not: their KV does not survive a restart. Nothing of a prompt or an
answer is written: workflow, node and tool names (as agents and frameworks give
them; the proxy names a workflow by its model and a hash of its system prompt),
counts and durations.

The file (`StateFile`) is JSON: ``{"format": "saga-learnt/1", "component": ...,
"written_at": <unix s>, "sha256": <hex>, "state": {...}}``, the checksum over the
canonical JSON of ``state``. It is written to a temporary file in the same
directory, flushed to disk and renamed over the old one, so a crash mid-write
leaves the previous file. At start a missing file is a clean start; a corrupt one,
another format or a state the process cannot take is a one-line warning and a
clean start, never a failure.

`saga serve`, `saga hints` and `saga proxy` keep theirs under `--state-dir`
(default `default_state_dir()`) as ``<component>-<port>.json``; `--no-state`
turns it off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

__all__ = ["FORMAT", "StateFile", "StateKeeper", "default_state_dir", "state_path", "STATE_FILE_ENV",
           "add_state_arguments", "state_path_of"]

FORMAT = "saga-learnt/1"
STATE_FILE_ENV = "SAGA_STATE_FILE"  # how `saga serve` tells the engine process where its file is
STATE_DIR_ENV, NO_STATE_ENV = "SAGA_STATE_DIR", "SAGA_NO_STATE"  # what the options default to
DEFAULT_INTERVAL_S = 60.0

log = logging.getLogger("saga.state")


def default_state_dir() -> Path:
    """`$XDG_CACHE_HOME/saga/state`, else `~/.cache/saga/state`."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "saga" / "state"


def state_path(state_dir: str | os.PathLike | None, component: str, port: int | str) -> Path:
    """Where `component` listening on `port` keeps its learnt state."""
    return Path(state_dir or default_state_dir()) / f"{component}-{port}.json"


def add_state_arguments(parser) -> None:
    """`--state-dir DIR` and `--no-state`, the same for every SAGA process (read with
    `state_path_of`)."""
    parser.add_argument("--state-dir", default=None, metavar="DIR",
                        help="where what SAGA learnt (workflow graphs, tool and idle times) is kept across "
                             f"restarts (default: ${STATE_DIR_ENV}, else $XDG_CACHE_HOME/saga/state, "
                             "else ~/.cache/saga/state)")
    parser.add_argument("--no-state", action="store_true",
                        help=f"keep no learnt state: every start is a clean one (also ${NO_STATE_ENV}=1, "
                             "unless --state-dir is given)")


def state_path_of(opts, component: str, port: int | str, env: dict | None = None) -> Path | None:
    """The file `add_state_arguments` options name (None: none kept). The options win
    over the environment: `--no-state`, else `--state-dir`, else `$SAGA_NO_STATE`
    (a test harness's), else `$SAGA_STATE_DIR` or the default."""
    env = os.environ if env is None else env
    if opts.no_state:
        return None
    if opts.state_dir:
        return state_path(opts.state_dir, component, port)
    if env.get(NO_STATE_ENV, "") not in ("", "0"):
        return None
    return state_path(env.get(STATE_DIR_ENV) or None, component, port)


def _checksum(state: dict) -> str:
    return hashlib.sha256(json.dumps(state, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class StateFile:
    """One learnt-state file (module docstring)."""

    def __init__(self, path: str | os.PathLike, component: str, logger: logging.Logger | None = None) -> None:
        """`logger`: where its warnings go (inside vLLM: under "vllm.", whose handler shows them)."""
        self.path = Path(path)
        self.component = component
        self.log = logger or log

    def load(self) -> dict | None:
        """The state in the file; None (with a one-line warning unless the file is
        simply missing) when there is none to take."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            self.log.info("SAGA: no learnt state at %s: a clean start", self.path)
            return None
        except OSError as exc:
            self.log.warning("SAGA: cannot read the learnt state %s (%s): a clean start", self.path, exc)
            return None
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            self.log.warning("SAGA: the learnt state %s is corrupt (%s): a clean start", self.path, str(exc)[:120])
            return None
        if doc.get("format") != FORMAT or doc.get("component") != self.component:
            self.log.warning("SAGA: the learnt state %s is %r of %r, not %r of %r: a clean start", self.path,
                        doc.get("format"), doc.get("component"), FORMAT, self.component)
            return None
        state = doc.get("state")
        if not isinstance(state, dict) or doc.get("sha256") != _checksum(state):
            self.log.warning("SAGA: the learnt state %s fails its checksum: a clean start", self.path)
            return None
        return state

    def save(self, state: dict) -> None:
        """Write `state` atomically (module docstring); OSError/TypeError/ValueError on failure."""
        doc = {"format": FORMAT, "component": self.component, "written_at": time.time(),
               "sha256": _checksum(state), "state": state}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(doc, out, separators=(",", ":"))
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


class StateKeeper:
    """Loads a process's learnt state at `start`, writes it every `interval_s` and at
    `close`. `export()` returns the state (thread-safe: it is called from the
    keeper's thread); `restore(state)` takes it back, raising ValueError for a
    state it cannot take. Never raises on a bad file or a failed write: it logs."""

    def __init__(self, file: StateFile, export: Callable[[], dict], restore: Callable[[dict], None],
                 interval_s: float = DEFAULT_INTERVAL_S) -> None:
        if not interval_s > 0:
            raise ValueError("interval_s must be > 0")
        self.file = file
        self.export = export
        self.restore = restore
        self.interval_s = interval_s
        self.restored = False  # whether `start` took a state back
        self.saves = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._save_lock = threading.Lock()
        self._last_error = ""

    def start(self) -> "StateKeeper":
        state = self.file.load()
        if state is not None:
            try:
                self.restore(state)
                self.restored = True
                self.file.log.info("SAGA: learnt state restored from %s", self.file.path)
            except ValueError as exc:
                self.file.log.warning("SAGA: the learnt state %s cannot be taken (%s): a clean start",
                            self.file.path, str(exc)[:120])
        self._thread = threading.Thread(target=self._run, name="saga-state", daemon=True)
        self._thread.start()
        return self

    def save(self) -> bool:
        """Write the state now; False (logged once per distinct error) if it failed."""
        with self._save_lock:
            try:
                self.file.save(self.export())
            except Exception as exc:  # a full disk or a bad directory must not stop serving
                if str(exc) != self._last_error:
                    self.file.log.warning("SAGA: writing the learnt state %s failed: %s", self.file.path, exc)
                    self._last_error = str(exc)
                return False
            self.saves += 1
            self._last_error = ""
            return True

    def close(self) -> None:
        """Stop the periodic writes and write once more."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self.save()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.save()

    @classmethod
    def started(cls, path: str | os.PathLike | None, component: str, export: Callable[[], dict],
                restore: Callable[[dict], None], env: dict | None = None,
                logger: logging.Logger | None = None) -> "StateKeeper | None":
        """The started keeper of the file at `path` (None: no state kept);
        `$SAGA_STATE_INTERVAL_S` sets the interval."""
        if not path:
            return None
        env = os.environ if env is None else env
        try:
            interval = float(env.get("SAGA_STATE_INTERVAL_S", DEFAULT_INTERVAL_S))
        except ValueError:
            interval = DEFAULT_INTERVAL_S
        return cls(StateFile(path, component, logger), export, restore,
                   interval if interval > 0 else DEFAULT_INTERVAL_S).start()

    @classmethod
    def from_env(cls, component: str, export: Callable[[], dict], restore: Callable[[dict], None],
                 env: dict | None = None, logger: logging.Logger | None = None) -> "StateKeeper | None":
        """`started` on the file `$SAGA_STATE_FILE` names (how `saga serve` tells the engine)."""
        env = os.environ if env is None else env
        return cls.started(env.get(STATE_FILE_ENV), component, export, restore, env, logger)
