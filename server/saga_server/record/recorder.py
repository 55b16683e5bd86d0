"""`Recorder`: a front door's facts in, `saga-trace/1` lines out, off the request path.

The request path calls `submit(item)`: the item and the time now go onto a bounded
queue, and that is all (about a microsecond; never blocks, never raises). A full
queue, or a closed recorder, drops the item and counts it (`RecorderStats.dropped`);
every session that was open then is written `incomplete`. One background thread takes the items, hands each to
the front door's `feed(builder, t, item)` (which turns it into `TraceBuilder`
facts), and writes every finished task as one line (`JsonlSink`: one write per
line, rotation by size). Nothing that goes wrong there reaches the caller: a feed
or write error is logged once and counted, and the thread carries on (a lost write
loses that task's line; the next write reopens the file). `close` ends every open
session (`end_reason` "closed") and writes it.

Tool names may be hashed (`hash_tools`): a keyed BLAKE2b of the name, the key
random per recorder unless `hash_salt` is given, so names are consistent within
a recording (and its rotated parts) and cannot be looked up in a list of common
ones.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from saga_sdk.logs import LogOnce

from .sink import JsonlSink
from .trace import TraceBuilder

__all__ = ["RecordConfig", "Recorder", "RecorderStats", "tool_hasher"]

log = logging.getLogger("saga_server.record")

Feed = Callable[[TraceBuilder, float, Any], None]


@dataclass(frozen=True, slots=True)
class RecordConfig:
    path: str
    hash_tools: bool = False
    max_bytes: int | None = None   # rotate the file before it grows past this
    max_sessions: int = 10_000     # open sessions kept (`TraceBuilder`)
    max_steps: int = 4096          # steps kept per session
    idle_s: float = 3600.0         # a session silent this long is written as "recorder_idle"
    queue_size: int = 10_000       # items waiting for the writer thread
    source: str = "saga"           # the tasks' `source` field
    hash_salt: bytes | None = None  # the tool-name hash key; None: random


@dataclass(frozen=True, slots=True)
class RecorderStats:
    tasks: int          # lines written
    open_sessions: int
    dropped: int        # items refused (queue full, or closed)
    write_errors: int
    feed_errors: int
    rotations: int


class _Flush:
    def __init__(self) -> None:
        self.done = threading.Event()


_STOP = object()


def tool_hasher(salt: bytes | None = None) -> Callable[[str], str]:
    key = salt if salt is not None else os.urandom(16)
    return lambda name: "tool-" + hashlib.blake2b(name.encode("utf-8", "replace"), key=key,
                                                  digest_size=5).hexdigest()


class Recorder:
    """See the module docstring. Opens the file at once (an unwritable path raises
    `OSError` here, not later) and starts its thread."""

    def __init__(self, config: RecordConfig, feed: Feed, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        if config.queue_size < 1:
            raise ValueError("queue_size must be positive")
        self.config = config
        self._feed = feed
        self._clock = clock
        self._builder = TraceBuilder(source=config.source, max_sessions=config.max_sessions,
                                     max_steps=config.max_steps, idle_s=config.idle_s,
                                     tool_name=tool_hasher(config.hash_salt) if config.hash_tools else str,
                                     wall=wall)
        self._sink = JsonlSink(config.path, config.max_bytes)
        self._sink.open()
        self._queue: queue.Queue = queue.Queue(config.queue_size)
        self._log_once = LogOnce(log)
        self._closed = False
        self._tasks = self._dropped = self._write_errors = self._feed_errors = 0
        self._tick_s = max(0.05, min(30.0, config.idle_s / 4))
        self._thread = threading.Thread(target=self._run, name="saga-recorder", daemon=True)
        self._thread.start()

    # -- the request path -------------------------------------------------------------------

    def submit(self, item: Any) -> bool:
        """Queue `item`, stamped now, for the writer thread. Never blocks or raises;
        False if it was dropped."""
        if not self._closed:
            try:
                self._queue.put_nowait((self._clock(), self._dropped, item))
                return True
            except queue.Full:
                pass
        self._dropped += 1
        return False

    # -- control --------------------------------------------------------------------------

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything submitted so far is fed and its finished tasks
        written; False on timeout."""
        marker = _Flush()
        try:
            self._queue.put(marker, timeout=timeout)
        except queue.Full:
            return False
        return marker.done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Write every open session as ended ("closed") and stop the thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            self._log_once("close", "recorder queue still full at close; open sessions are not written")
        self._thread.join(timeout)

    def stats(self) -> RecorderStats:
        return RecorderStats(self._tasks, self._builder.open_sessions, self._dropped, self._write_errors,
                             self._feed_errors, self._sink.rotations)

    # -- the writer thread ----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                entry = self._queue.get(timeout=self._tick_s)
            except queue.Empty:
                entry = None
            if entry is _STOP:
                self._builder.close()
                self._write_finished()
                self._sink.close()
                return
            if isinstance(entry, _Flush):
                self._write_finished()
                entry.done.set()
                continue
            if entry is not None:
                t, self._builder.lost, item = entry  # the drops before this item: its sessions' gaps
                try:
                    self._feed(self._builder, t, item)
                except Exception:
                    self._feed_errors += 1
                    self._log_once("feed", "recorder: cannot read a batch of facts; skipping it", exc_info=True)
            self._builder.expire(self._clock())
            self._write_finished()

    def _write_finished(self) -> None:
        for task in self._builder.take():
            try:
                self._sink.write(json.dumps(task, separators=(",", ":")))
                self._tasks += 1
            except (OSError, TypeError, ValueError) as exc:
                self._write_errors += 1
                self._log_once("write", "recorder: cannot write to %s (%s); tasks are lost until it can",
                               self.config.path, exc)
