"""`HoldingKVCacheManager`: vLLM's `KVCacheManager` with SAGA's two hooks, by composition.

The scheduler allocates and frees through its `kv_cache_manager`; SAGA's scheduler
gives it this wrapper around vLLM's own manager (everything else is delegated):

- `allocate_slots`: when vLLM's allocation fails, the plugin releases held KV in the
  ledger's order and retries (`SagaPlugin.allocate`), so SAGA never refuses what
  stock vLLM would have allowed;
- `free` / `pop_blocks_for_free`: a finished request's cached prefix is taken into
  a hold (`SagaPlugin.on_freed`) before its own references go.
"""

from __future__ import annotations

__all__ = ["HoldingKVCacheManager"]


class HoldingKVCacheManager:
    def __init__(self, inner, plugin) -> None:
        self._inner = inner
        self._plugin = plugin

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def allocate_slots(self, request, num_new_tokens: int, *args, **kwargs):
        return self._plugin.allocate(self._inner.allocate_slots, request, num_new_tokens, *args, **kwargs)

    def free(self, request) -> None:
        self._plugin.on_freed(request)
        self._inner.free(request)

    def pop_blocks_for_free(self, request):
        self._plugin.on_freed(request)
        return self._inner.pop_blocks_for_free(request)
