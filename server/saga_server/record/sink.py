"""`JsonlSink`: append lines to a file so that a crash loses at most the line in flight.

Each line goes to the operating system in one unbuffered write, so a process that
dies keeps every line written before. A line cut short (a crash mid-write, a full
disk) is cut off when the file is next opened, so lines never run together; until
then it is the file's last line, without its newline, and
`saga_server.bench.workload.load_trace` skips it. With `max_bytes`, a line that would take the file
past it first moves the file aside, to the first free `NAME.1.EXT`, `NAME.2.EXT`,
..., and a new file starts: nothing is ever deleted. A failed write raises
`OSError`; the next write reopens the file.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["JsonlSink"]


class JsonlSink:
    def __init__(self, path: str | os.PathLike, max_bytes: int | None = None) -> None:
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.rotations = 0
        self._fd: int | None = None
        self._size = 0

    def open(self) -> None:
        """Open (or create) the file now: a path that cannot be written fails here."""
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            whole = _whole_lines(self.path, size)
            if whole < size:  # a line left unfinished: drop it
                os.ftruncate(fd, whole)
                size = whole
        except OSError:
            os.close(fd)
            raise
        self._fd, self._size = fd, size

    def write(self, line: str) -> None:
        """Append `line` (a newline is added) in one write."""
        data = line.encode("utf-8") + b"\n"
        try:
            self.open()
            if self.max_bytes is not None and self._size and self._size + len(data) > self.max_bytes:
                self._rotate()
            written = os.write(self._fd, data)
            self._size += written
            if written < len(data):
                raise OSError(f"short write to {self.path} (disk full?)")
        except OSError:
            self.close()
            raise

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def _rotate(self) -> None:
        self.close()
        n = 1
        while (aside := self.path.with_name(f"{self.path.stem}.{n}{self.path.suffix}")).exists():
            n += 1
        os.replace(self.path, aside)
        self.rotations += 1
        self.open()


def _whole_lines(path: Path, size: int, chunk: int = 1 << 16) -> int:
    """The length of the file's leading whole lines (up to its last newline)."""
    with open(path, "rb") as f:
        end = size
        while end > 0:
            start = max(0, end - chunk)
            f.seek(start)
            block = f.read(end - start)
            cut = block.rfind(b"\n")
            if cut >= 0:
                return start + cut + 1
            end = start
    return 0
