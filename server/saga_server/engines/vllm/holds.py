"""vLLM's `BlockPool` as the core's `BlockPool`, so the `HoldLedger` (the one rule of
which KV SAGA keeps, `saga_server.core.holds`) runs on the engine's real blocks.

A hold is one extra reference on a session's cached (hashed) blocks
(`BlockPool.touch`), taken while its request still references them, so they never
pass through vLLM's free queue; releasing gives the reference back
(`BlockPool.free_blocks`), tail first, so the blocks that become evictable first are
the ones whose loss costs the prefix least.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["VllmBlockPool", "cached_prefix_blocks"]


class VllmBlockPool:
    __slots__ = ("pool",)

    def __init__(self, pool) -> None:
        self.pool = pool

    def touch(self, session_id: str, blocks: Sequence) -> None:
        self.pool.touch(blocks)

    def free(self, session_id: str, blocks: Sequence) -> int:
        before = self.pool.get_num_free_blocks()
        self.pool.free_blocks(reversed(blocks))  # vLLM evicts what it frees first, first
        return self.pool.get_num_free_blocks() - before

    def num_free(self) -> int:
        return self.pool.get_num_free_blocks()


def cached_prefix_blocks(kv_cache_manager, request_id: str) -> list:
    """The request's leading blocks that carry a hash (prefix-cache entries)."""
    out = []
    for group in kv_cache_manager.get_blocks(request_id).blocks:
        for block in group:
            if block.block_hash is None or block.is_null:
                break
            out.append(block)
    return out
