"""A disk KV tier a test can slow down, for `saga serve`'s engine.

`SlowDiskTier` is SAGA's disk tier (`engines/vllm/disk_tier.py`) whose reads each
take `delay_s` longer while the file named by its `slow_while` option exists. No
disk on this machine is slow on demand, and the tier lives in the engine's own
process: this is the seam a test slows it at. Select it by naming this module and
class in the secondary tier of SAGA's own `--kv-transfer-config` (`host_tier_config`).
"""

from __future__ import annotations

import time
from pathlib import Path

from saga_server.engines.vllm.disk_tier import SagaDiskTier

__all__ = ["SlowDiskTier"]


class SlowDiskTier(SagaDiskTier):
    def __init__(self, *args, slow_while: str, delay_s: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._pool = _SlowReads(self._pool, Path(slow_while), delay_s)


class _SlowReads:
    """The tier's I/O pool, its read tasks delayed while the file exists."""

    def __init__(self, pool, slow_while: Path, delay_s: float) -> None:
        self._pool, self._slow_while, self._delay_s = pool, slow_while, delay_s

    def enqueue_load(self, job_id, n, tasks):
        if self._slow_while.exists():
            tasks = [self._delayed(task) for task in tasks]
        return self._pool.enqueue_load(job_id, n, tasks)

    def _delayed(self, task):
        def run():
            time.sleep(self._delay_s)
            return task()
        return run

    def __getattr__(self, name):
        return getattr(self._pool, name)
