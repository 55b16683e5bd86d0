"""A block pool for the core's KV tests: blocks as (session, index), counted, no engine."""

from __future__ import annotations

__all__ = ["Pool", "blocks"]


class Pool:
    """Blocks as (session, index); a block is free when nobody references it."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.refs: dict = {}

    def touch(self, session_id, blocks) -> None:
        for b in blocks:
            self.refs[b] = self.refs.get(b, 0) + 1

    def free(self, session_id, blocks) -> int:
        freed = 0
        for b in blocks:
            self.refs[b] -= 1
            if not self.refs[b]:
                del self.refs[b]
                freed += 1
        return freed

    def num_free(self) -> int:
        return self.capacity - len(self.refs)


def blocks(sid: str, n: int) -> list:
    return [(sid, i) for i in range(n)]
