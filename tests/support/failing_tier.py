"""A host KV tier whose memory a test can take away, for `saga serve`'s engine.

`FailingTierSpec` is SAGA's host tier (`engines/vllm/host_kv.py`) whose loads fail
while the file named by the connector's extra config `fail_loads_while` exists. The
tier lives in the engine's own process, so nothing real can kill it while the engine
lives: this is the seam a test kills it at. Select it with `--kv-transfer-config`,
SAGA's own (`host_tier_config`) with `spec_name` and `spec_module_path` naming this
module.
"""

from __future__ import annotations

from pathlib import Path

from saga_server.engines.vllm.host_kv import HostCopyWorker, HostOffloadingSpec

__all__ = ["FailingTierSpec", "FailingCopyWorker"]


class FailingTierSpec(HostOffloadingSpec):
    def get_worker(self, kv_caches):
        if self._worker is None:
            self._worker = FailingCopyWorker(kv_caches, self.blocks_per_chunk, self.num_chunks,
                                             Path(self.extra_config["fail_loads_while"]))
        return self._worker


class FailingCopyWorker(HostCopyWorker):
    def __init__(self, kv_caches, blocks_per_chunk: int, num_chunks: int, kill_file: Path) -> None:
        super().__init__(kv_caches, blocks_per_chunk, num_chunks)
        self._kill_file = kill_file

    def _copy(self, job) -> int:
        if not job.store and self._kill_file.exists():
            raise OSError(f"the tier's memory is gone ({self._kill_file} exists)")
        return super()._copy(job)
