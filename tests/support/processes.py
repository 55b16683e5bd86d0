"""`listening_pid`: which local process listens on a TCP port, read from /proc.

The real tier measures the server's memory (`tree_rss_bytes` of its process tree)
also when the server is not its child (CI points it at an external `saga serve`):
the process that owns the LISTEN socket of the server's HTTP port is the server.
Linux only, standard library only; a socket owned by another user's process (its
fds unreadable) or in another network namespace is not found.
"""

from __future__ import annotations

import os

__all__ = ["listening_pid"]

_LISTEN = "0A"  # the TCP state in /proc/net/tcp{,6}


def listening_pid(port: int) -> int | None:
    """The pid of the process listening on TCP `port` (any local address, IPv4 or
    IPv6); None when none is found. Processes that inherited the socket (children
    forked after it was opened) are passed over for the one above them."""
    inodes = _listening_inodes(port)
    holders = {pid for pid, inode in _socket_fds() if inode in inodes} if inodes else set()
    for pid in sorted(holders):
        if not any(parent in holders for parent in _ancestors(pid)):
            return pid
    return None


def _listening_inodes(port: int) -> set[int]:
    inodes: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
            fields = row.split()
            if len(fields) > 9 and fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(int(fields[9]))
    return inodes


def _socket_fds():
    """(pid, socket inode) of every socket fd this user may read."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:  # gone, or not ours
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                yield int(entry), int(target[8:-1])


def _ancestors(pid: int):
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])  # after the name: state, ppid
        except (OSError, IndexError, ValueError):
            return
        yield pid
