"""SAGA on real vLLM: the v1 scheduler plugin and its hint intake.

`SagaScheduler` (sync) / `SagaAsyncScheduler` (GPU async scheduling) are loaded by
vLLM with `--scheduler-cls`; `scheduler` says how they plug in, `plugin` what SAGA
changes, `holds` how the core's `HoldLedger` runs on vLLM's block pool, `prefetch`
the re-prefill of paused sessions, `intake` how hints reach the scheduler inside
vLLM's EngineCore process, `metrics` for `/metrics`, `nixl` the KV connector of
`saga serve --kv-transfer nixl` (moves: `saga_server.router.kv_move`).
Importing this package imports vLLM.
"""

from .plugin import SagaPlugin
from .prefetch import PREFETCH_PREFIX
from .scheduler import SagaAsyncScheduler, SagaScheduler

__all__ = ["SagaScheduler", "SagaAsyncScheduler", "SagaPlugin", "PREFETCH_PREFIX"]
