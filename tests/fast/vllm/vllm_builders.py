"""Small builders for real vLLM scheduler objects on CPU (no model runs).

Pattern from vLLM's own CPU tests: a `VllmConfig` from a local model directory
that holds only `config.json` (so nothing touches the network), a one-group
`KVCacheConfig` with a few blocks, and synthetic `ModelRunnerOutput`s.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import torch
from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

EOS = 2
# A llama-shaped config small enough to mean nothing; only shapes are read.
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
    "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": EOS,
}


def model_dir(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(TINY_CONFIG))
    return root


def make_scheduler(cls, model_path: Path, *, num_blocks: int = 24, block_size: int = 16,
                   max_num_seqs: int = 8, max_batched: int = 2048, prefix_caching: bool = True,
                   kv_offloading_size: float | None = None, kv_transfer_extra: dict | None = None,
                   kv_transfer: KVTransferConfig | None = None, **kwargs):
    """`kv_offloading_size` (GiB) is `--kv-offloading-size`: VllmConfig turns it
    into vLLM's native CPU offload tier (`OffloadingConnector`); `kv_transfer_extra`
    is the connector's extra config (`--kv-transfer-config`); `kv_transfer` a whole
    connector configuration instead."""
    model_config = ModelConfig(model=str(model_path), tokenizer=None, skip_tokenizer_init=True,
                               max_model_len=2048, dtype="float32", seed=0)
    scheduler_config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_batched,
                                       max_model_len=2048, is_encoder_decoder=False,
                                       enable_chunked_prefill=True, async_scheduling=False)
    cache_config = CacheConfig(block_size=block_size, cache_dtype="auto",
                               enable_prefix_caching=prefix_caching, kv_offloading_size=kv_offloading_size)
    cache_config.num_gpu_blocks = num_blocks
    transfer = kv_transfer
    if kv_transfer_extra:
        transfer = KVTransferConfig(kv_connector_extra_config=dict(kv_transfer_extra))
    vllm_config = VllmConfig(model_config=model_config, scheduler_config=scheduler_config,
                             cache_config=cache_config, kv_transfer_config=transfer)
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(
            block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32))])
    return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
               structured_output_manager=StructuredOutputManager(vllm_config),
               block_size=block_size, log_stats=False, **kwargs)


_ids = itertools.count()


class Requests:
    """Makes `Request`s whose block hashes are computed like the engine does."""

    def __init__(self, block_size: int) -> None:
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(block_size, sha256)

    def make(self, tokens: list[int], *, session_id: str | None = None, max_tokens: int = 1,
             extra_args: dict | None = None, rid: str | None = None) -> Request:
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=extra_args)
        return Request(rid or f"r{next(_ids)}", list(tokens), params, None, block_hasher=self.hasher,
                       session_id=session_id)


def model_output(scheduler, out, token: int = 7, kv_connector_output=None) -> ModelRunnerOutput:
    """A synthetic model output for the SchedulerOutput `out`: every scheduled
    request samples `token` when its prefill is done."""
    req_ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in req_ids:
        req = scheduler.requests[rid]
        done = req.num_computed_tokens + out.num_scheduled_tokens[rid] >= req.num_tokens
        sampled.append([token] if done else [])
    return runner_output(req_ids, sampled, kv_connector_output)


def runner_output(req_ids: list[str], sampled: list[list[int]], kv_connector_output=None) -> ModelRunnerOutput:
    """A `ModelRunnerOutput` in which request `req_ids[i]` sampled `sampled[i]`."""
    # vLLM 0.34 reads a request's row from `req_ids` alone (no `req_id_to_index`)
    index = {"req_id_to_index": {r: i for i, r in enumerate(req_ids)}} if _HAS_REQ_INDEX else {}
    return ModelRunnerOutput(req_ids=req_ids, **index, sampled_token_ids=sampled, logprobs=None,
                             prompt_logprobs_dict={}, pooler_output=[], kv_connector_output=kv_connector_output)


_HAS_REQ_INDEX = "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}


def step(scheduler, token: int = 7):
    """One engine step with a synthetic model output. Returns the SchedulerOutput."""
    out = scheduler.schedule()
    scheduler.update_from_output(out, model_output(scheduler, out, token))
    return out


def run_until_idle(scheduler, max_steps: int = 500) -> list:
    outs = []
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            return outs
        outs.append(step(scheduler))
    raise AssertionError("scheduler did not drain")


def hit_tokens(outputs, request_id: str) -> int | None:
    for out in outputs:
        for new in out.scheduled_new_reqs:
            if new.req_id == request_id:
                return new.num_computed_tokens
    return None


class OffloadWorker:
    """The synthetic worker: transfers as OffloadingConnectorWorker reports them.

    Loads start at the beginning of the step that carries them (start_load_kv) and,
    copies being instant, finish within it, unless `loads_done=False` makes them
    slow: then they finish in the next step that allows it. A step's stores are
    only queued (wait_for_save) and run at the next step's start, unless the
    scheduler asks for them to be flushed at once. With `fail_loads` every load
    fails as SAGA's host worker reports it: done, its blocks as load errors.
    """

    def __init__(self, fail_loads: bool = False) -> None:
        self._stores_queued: set[int] = set()
        self._loads: dict[int, tuple[str, list[int]]] = {}  # job id -> (request id, its blocks), in flight
        self.fail_loads = fail_loads
        self.load_jobs: list[str] = []  # the request of every load job seen, in order

    def step(self, s, token: int = 7, loads_done: bool = True):
        out = s.schedule()
        meta = out.kv_connector_metadata
        kv_out = None
        if meta is not None:  # connector on
            flush = meta.jobs_to_flush or set()
            done = self._stores_queued | (set(meta.store_jobs) & flush)
            self._stores_queued = set(meta.store_jobs) - flush
            self._loads.update((jid, (job.req_id, job.dst_spec.block_ids.tolist()))
                               for jid, job in meta.load_jobs.items())
            self.load_jobs += [job.req_id for job in meta.load_jobs.values()]
            recving, invalid = set(), set()
            if loads_done:
                done |= set(self._loads)
                recving = {req for req, _ in self._loads.values()}
                if self.fail_loads:
                    invalid = {b for _, blocks in self._loads.values() for b in blocks}
                self._loads.clear()
            kv_out = KVConnectorOutput(
                finished_recving=recving or None, invalid_block_ids=invalid,
                kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs=dict.fromkeys(done, 1))
                if done else None)
        s.update_from_output(out, model_output(s, out, token, kv_connector_output=kv_out))
        return out

    def drain(self, s, max_steps: int = 200) -> list:
        # has_requests(), not has_unfinished_requests(): the engine keeps stepping
        # while the connector has transfers in flight, and so does this loop.
        outs = []
        for _ in range(max_steps):
            if not s.has_requests():
                return outs
            outs.append(self.step(s))
        raise AssertionError("scheduler did not drain")
